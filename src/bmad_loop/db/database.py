"""Engine, sessions and migrations for the state database.

Embedded default: SQLite in WAL mode under `.bmad-loop/state.db`. Every write transaction on
SQLite starts with BEGIN IMMEDIATE, so several consumer processes never hit the deferred
read-then-write "database is locked" failure and never lose an update (see docs/architecture.md);
a read-only one (`Database.read`) takes no write lock at all.
Any other SQLAlchemy URL (PostgreSQL for scale-out) is used as given.

Opening refuses, in one line naming the file and before any connection is made, a SQLite file
that is not a whole database (`sqlitefile.check_sqlite_file`), a state folder that cannot be
written, and a database driver that is not installed (`check_driver`, with the extra to
install). A lock another process holds is waited for `lock_wait_s` ([database] lock_wait_s),
then refused the same way.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import fcntl
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, event, insert, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import (ArgumentError, DatabaseError, DBAPIError, InterfaceError,
                            NoSuchModuleError, OperationalError)
from sqlalchemy.orm import Session, sessionmaker

from ..errors import ConfigError
from . import migrate
from .sqlitefile import check_folder_writable, check_sqlite_file, sqlite_error_message

__all__ = ["Database", "check_driver", "check_reachable", "default_database_url"]

SQLITE_BUSY_TIMEOUT_MS = 30_000
_READ_ONLY = "bmad_loop_read_only"  # execution option of `Database.read`'s connections
# pg_advisory_lock key serialising migrations of one PostgreSQL database across hosts.
PG_MIGRATION_LOCK_KEY = 0x626D_6164  # "bmad"


def default_database_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'state.db'}"


def check_driver(url: str, source: str = "[database] url") -> None:
    """Refuse a database URL whose driver is not installed, naming the extra that installs it."""
    if not url or url.startswith("sqlite"):
        return
    try:
        parsed = make_url(url)
        dialect = parsed.get_dialect()
    except ArgumentError:
        raise ConfigError(f"{source}: not a database URL: {_shown(url)}") from None
    except NoSuchModuleError:
        raise ConfigError(f"{source}: unknown kind of database in {_shown(url)}") from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        if parsed.get_backend_name() == "postgresql":
            hint = "install bmad-loop[postgres]" + (
                "" if dialect.driver == "psycopg" else " and write the url as postgresql+psycopg://…")
        else:
            hint = f"install the Python driver {dialect.driver!r}"
        raise ConfigError(f"{source}: the driver for {_shown(url)} is not installed "
                          f"({exc}): {hint}") from None


def check_reachable(url: str, source: str = "[database] url", timeout_s: int = 5) -> None:
    """Refuse a database server that does not answer (down, wrong host or port, no such
    database, refused login): one connection and `SELECT 1`, which creates nothing. SQLite
    files are checked by `sqlitefile` instead."""
    if not url or url.startswith("sqlite"):
        return
    from sqlalchemy.pool import NullPool

    args = {"connect_timeout": timeout_s} if make_url(url).get_backend_name() == "postgresql" else {}
    engine = create_engine(url, poolclass=NullPool, connect_args=args)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except DBAPIError as exc:
        reason = (str(exc.orig or exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{source}: cannot reach the database {_shown(url)}: {reason}") from None
    finally:
        engine.dispose()


def _install_sqlite_hooks(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy's `begin` event emit the BEGIN itself (pysqlite's own is deferred).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        _enter_wal(cur, busy_timeout_ms / 1000)
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        # A read (`Database.read`) takes no write lock: in WAL mode it neither waits for a
        # writer nor makes one wait.
        # Straight to the driver: through SQLAlchemy's statement machinery this one line
        # cost more than the statements it opens (SQLAlchemy still sees the transaction: it
        # is the one calling here). Its failure (the write lock not free within the busy
        # timeout) is raised as SQLAlchemy's own, as any statement's would be.
        statement = "BEGIN" if conn.get_execution_options().get(_READ_ONLY) else "BEGIN IMMEDIATE"
        try:
            conn.connection.driver_connection.execute(statement)
        except sqlite3.Error as exc:
            raise DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc


def _enter_wal(cursor, wait_s: float) -> None:
    """Switch the file to WAL, waiting up to `wait_s` for other connections.

    A brand-new file is still in rollback mode, and switching it needs an exclusive lock that
    SQLite takes without calling the busy handler: two processes opening a new database at once
    (two `worker` consumers, a `worker` and an `enqueue`) got "database is locked" at once,
    whatever busy_timeout said. Once the file is WAL (a setting stored in the file) this returns
    at the first try."""
    deadline = time.monotonic() + wait_s
    pause = 0.001
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


_READ_WRITE_REFUSED = "a write in a read-only transaction (Database.read): use transaction()"


def _refuse_writes(session, _flush_context, _instances) -> None:
    if session.new or session.dirty or session.deleted:
        raise RuntimeError(_READ_WRITE_REFUSED)


_PENDING_ROWS = "bmad_loop.rows_at_commit"
_READ_ONLY_SESSION = "bmad_loop.read_only"  # in the `info` of `Database.read` sessions


def insert_now(session: Session, row) -> int:
    """INSERT a new ORM object's assigned columns as one Core statement; its id. The object is
    not added to the session: no unit of work and no identity map, half the CPU of `add` +
    `flush` for a row the writer does not read back. Its validators ran as its attributes
    were set; the columns left unassigned take their defaults. Pending changes of the
    session are flushed first, as `flush` would have."""
    session.flush()
    table = type(row).__table__
    values = {key: value for key, value in vars(row).items() if key in table.c}
    return session.connection().execute(_insert_of(table, returning_key=True), values).scalar_one()


_INSERTS: dict[tuple[str, bool], object] = {}  # (table name, returns its key) -> the INSERT


def _insert_of(table, *, returning_key: bool = False):
    """`INSERT INTO table …` (`RETURNING <key>`), built once per table: its columns are those
    of the values it runs with (SQLAlchemy compiles each set of columns once)."""
    statement = _INSERTS.get((table.name, returning_key))
    if statement is None:
        statement = insert(table)
        if returning_key:
            statement = statement.returning(next(iter(table.primary_key.columns)))
        _INSERTS[table.name, returning_key] = statement
    return statement


def insert_at_commit(session: Session, table, row: dict) -> None:
    """Queue `row` for `table`: inserted when `session`'s outermost transaction commits, with
    the other rows queued for the same table in one statement (a savepoint's release does not
    write them, so one that rolls back afterwards cannot take them along). For append-only rows
    nobody reads back in the same transaction (the journal): as ORM objects each cost a flush
    and a RETURNING of its key."""
    session.info.setdefault(_PENDING_ROWS, []).append((table, row))


@event.listens_for(Session, "before_commit")
def _insert_queued_rows(session: Session) -> None:
    if session.in_nested_transaction():
        return  # a savepoint's release: the rows wait for the transaction's own commit
    queued = session.info.pop(_PENDING_ROWS, None)
    if not queued:
        return
    if session.info.get(_READ_ONLY_SESSION):
        raise RuntimeError(_READ_WRITE_REFUSED)
    by_table: dict = {}
    for table, row in queued:
        by_table.setdefault(table, []).append(row)
    for table, rows in by_table.items():
        session.connection().execute(_insert_of(table), rows)


_writers: dict[str, threading.RLock] = {}
_writers_guard = threading.Lock()


def _writer_lock(path: str) -> threading.RLock:
    """One lock per SQLite file in this process, shared by every `Database` opened on it."""
    with _writers_guard:
        return _writers.setdefault(path, threading.RLock())


class Database:
    """One engine and its session factory. Create after a fork, never before."""

    def __init__(self, url: str, *, lock_dir: Path | None = None,
                 lock_wait_s: float = SQLITE_BUSY_TIMEOUT_MS / 1000):
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self._lock_dir = lock_dir
        self.lock_dir = lock_dir  # the project's own state folder (remote mode: not the clone's)
        self.lock_wait_s = lock_wait_s
        self.path = url.split("///", 1)[-1] if self.is_sqlite else ""
        if self.is_sqlite:
            if self.path and self.path != ":memory:":
                # Refused before anything is made or opened: a folder we cannot write, a file
                # that is not a whole database.
                folder = Path(self.path).parent
                check_folder_writable(folder, "state folder")
                folder.mkdir(parents=True, exist_ok=True)
                check_sqlite_file(Path(self.path), "state database")
            self.engine = create_engine(url, connect_args={"timeout": lock_wait_s})
            _install_sqlite_hooks(self.engine, int(lock_wait_s * 1000))
        else:
            check_driver(url)
            try:
                self.engine = create_engine(url, pool_pre_ping=True)
            except (ImportError, ArgumentError, NoSuchModuleError) as exc:
                # A URL SQLAlchemy cannot read: one line.
                raise ConfigError(f"[database] url {_shown(url)}: {exc}") from None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._reads = sessionmaker(self.engine.execution_options(**{_READ_ONLY: True}),
                                   expire_on_commit=False, info={_READ_ONLY_SESSION: True})
        event.listen(self._reads, "before_flush", _refuse_writes)
        self._writer = (_writer_lock(os.path.abspath(self.path))
                        if self.is_sqlite and self.path and self.path != ":memory:" else None)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """A short write transaction: commit on success, roll back on error. Keep slow work out."""
        lock = self._writer
        if lock is None:
            with self._sessions.begin() as session:
                yield session
            return
        # Threads of this process take turns here, handing the file's write lock over at once;
        # left to SQLite, a waiting `BEGIN IMMEDIATE` sleeps in growing steps (up to 100 ms)
        # even when the holder is done a millisecond later. Other processes still meet
        # SQLite's busy timeout. Re-entrant: a nested transaction behaves as it did before.
        acquired = lock.acquire(timeout=self.lock_wait_s)
        try:
            with self._sessions.begin() as session:
                yield session
        finally:
            if acquired:
                lock.release()

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        """A short read-only transaction: one consistent snapshot, and no write lock on SQLite,
        so a poll or a check neither waits for the writers nor holds them up. A flush that would
        write raises; a bulk UPDATE or DELETE must not be issued in it (use `transaction`)."""
        if self._writer is None:  # PostgreSQL, or an in-memory SQLite: as a transaction
            with self.transaction() as session:
                yield session
            return
        with self._reads.begin() as session:
            yield session

    def session(self) -> Session:
        return self._sessions()

    def migrate(self) -> None:
        """Bring the schema to head, once, under a file lock (concurrent upgrades race).

        On PostgreSQL the consumers may sit on different hosts, where a file lock means
        nothing: a session-level advisory lock in the database serialises them instead.
        """
        self._check_reachable()
        if migrate.at_head(self.engine):
            return  # the common case: no lock, no alembic
        with self._migration_lock(), self._database_lock(), self.one_line_errors():
            migrate.upgrade(self.engine, f"the state database {self.path or _shown(self.url)}")

    @contextlib.contextmanager
    def one_line_errors(self):
        """SQLite's errors on this file (a lock held past `lock_wait_s`, a read-only folder, a
        damaged page) as one `ConfigError` line naming the file; anything else as it is."""
        try:
            yield
        except (DatabaseError, OSError) as exc:
            message = sqlite_error_message(self.path, exc, self.lock_wait_s) if self.is_sqlite else None
            if message is None:
                raise
            raise ConfigError(message) from exc

    def _check_reachable(self) -> None:
        """Connect once: every process does this first, so a database that is down or misnamed
        is one line (exit 2, nothing ran) instead of a driver traceback. Later errors stay as they are."""
        try:
            with self.one_line_errors(), self.engine.connect():
                pass
        except (OperationalError, InterfaceError) as exc:
            url = _shown(self.url)
            reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
            raise ConfigError(f"cannot reach the state database {url}: {reason}") from exc

    @contextlib.contextmanager
    def _database_lock(self):
        if self.engine.dialect.name != "postgresql":
            yield
            return
        with self.engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": PG_MIGRATION_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": PG_MIGRATION_LOCK_KEY})
                conn.commit()

    @contextlib.contextmanager
    def _migration_lock(self):
        if self._lock_dir is None:
            yield
            return
        with self.one_line_errors():
            self._lock_dir.mkdir(parents=True, exist_ok=True)
            handle = open(self._lock_dir / "migrate.lock", "a+")
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def dispose(self) -> None:
        self.engine.dispose()


def _shown(url: str) -> str:
    """The URL for a message, password hidden (a URL SQLAlchemy cannot parse: its scheme only)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url.split("://", 1)[0] + "://…"
