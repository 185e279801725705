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

Who a state database is: its random id (made at its first migration, 0011, `database_id`) and a
label a person can read (its URL without the password, `database_label`). The repository's run
records carry both, so a checkout driven from two databases can tell its own runs' refs from
another database's.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import Insert, Table, event, insert, select
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.orm import UOWTransaction
from sqlalchemy.exc import ArgumentError, DatabaseError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import ConfigError
from ..fileio import shown
from . import migrate
from .models import DatabaseIdentity
from .dialects import READ_ONLY, SQLITE_BUSY_TIMEOUT_MS, dialect_for, shown_url
from ..caches import CACHES

__all__ = ["Database", "check_driver", "check_reachable", "database_id", "database_label",
           "default_database_url"]


def default_database_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'state.db'}"


def check_driver(url: str, source: str = "[database] url") -> None:
    """Refuse a database URL whose driver is not installed, naming the extra that installs it."""
    dialect_for(url).check_driver(source)


def check_reachable(url: str, source: str = "[database] url", timeout_s: int = 5) -> None:
    """Refuse a database server that does not answer (down, wrong host or port, no such
    database, refused login): one connection and `SELECT 1`, which creates nothing. SQLite
    files are checked by `sqlitefile` instead."""
    dialect_for(url).check_reachable(source, timeout_s)


_READ_WRITE_REFUSED = "a write in a read-only transaction (Database.read): use transaction()"


def _refuse_writes(session: Session, _flush_context: UOWTransaction, _instances: object) -> None:
    if session.new or session.dirty or session.deleted:
        raise RuntimeError(_READ_WRITE_REFUSED)


_PENDING_ROWS = "bmad_loop.rows_at_commit"
_READ_ONLY_SESSION = "bmad_loop.read_only"  # in the `info` of `Database.read` sessions


def insert_now(session: Session, row: Any) -> int:
    """INSERT a new ORM object's assigned columns as one Core statement; its id. The object is
    not added to the session: no unit of work and no identity map, half the CPU of `add` +
    `flush` for a row the writer does not read back. Its validators ran as its attributes
    were set; the columns left unassigned take their defaults. Pending changes of the
    session are flushed first, as `flush` would have."""
    session.flush()
    table = type(row).__table__
    values = {key: value for key, value in vars(row).items() if key in table.c}
    return session.connection().execute(_insert_of(table, returning_key=True), values).scalar_one()


_INSERTS: dict[tuple[str, bool], Insert] = {}  # (table name, returns its key) -> the INSERT
CACHES.register("db.inserts", _INSERTS.clear, bound="two per table",
               holds="(table, returns its key) -> its INSERT statement")


def _insert_of(table: Table, *, returning_key: bool = False) -> Insert:
    """`INSERT INTO table …` (`RETURNING <key>`), built once per table: its columns are those
    of the values it runs with (SQLAlchemy compiles each set of columns once)."""
    statement = _INSERTS.get((table.name, returning_key))
    if statement is None:
        statement = insert(table)
        if returning_key:
            statement = statement.returning(next(iter(table.primary_key.columns)))
        _INSERTS[table.name, returning_key] = statement
    return statement


def insert_at_commit(session: Session, table: Table, row: dict[str, Any]) -> None:
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
    by_table: dict[Table, list[dict[str, Any]]] = {}
    for table, row in queued:
        by_table.setdefault(table, []).append(row)
    for table, rows in by_table.items():
        session.connection().execute(_insert_of(table), rows)


def _text_param(value: object) -> object:
    return shown(value) if isinstance(value, str) else value


def _fit_params(params: Any) -> Any:
    if isinstance(params, dict):
        return {k: _text_param(v) for k, v in params.items()}
    if isinstance(params, (list, tuple)):
        return type(params)(_fit_params(p) if isinstance(p, (dict, list, tuple)) else _text_param(p)
                            for p in params)
    return params


def _storable_text(_conn: Connection, _cursor: object, statement: str, parameters: Any,
                   _context: object, _executemany: bool) -> tuple[str, Any]:
    """A text value holding a byte of a file name that is not UTF-8 (a surrogate, how Python
    holds it) is stored escaped, `\\xff`: no driver encodes a surrogate. JSON columns arrive
    here already serialised with `\\udcff` escapes, so their paths round-trip exactly."""
    return statement, _fit_params(parameters)


class Database:
    """One engine and its session factory. Create after a fork, never before."""

    def __init__(self, url: str, *, lock_dir: Path | None = None,
                 lock_wait_s: float = SQLITE_BUSY_TIMEOUT_MS / 1000):
        self.url = url
        self.dialect = dialect_for(url)
        self.is_sqlite = self.dialect.kind == "sqlite"
        self._lock_dir = lock_dir
        self.lock_dir = lock_dir  # the project's own state folder (remote mode: not the clone's)
        self.lock_wait_s = lock_wait_s
        self.path = self.dialect.path
        self.engine = self.dialect.open_engine(lock_wait_s)
        event.listen(self.engine, "before_cursor_execute", _storable_text, retval=True)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._reads = sessionmaker(self.engine.execution_options(**{READ_ONLY: True}),
                                   expire_on_commit=False, info={_READ_ONLY_SESSION: True})
        event.listen(self._reads, "before_flush", _refuse_writes)
        self._writer = self.dialect.writer_lock()
        self.identity: str | None = None  # its database_identity id, once read (database_id)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """A short write transaction: commit on success, roll back on error. Keep slow work out."""
        lock = self._writer
        if lock is None:
            with self._sessions.begin() as session:
                yield session
            return
        # Threads of this process take turns here (see `SqliteDialect.writer_lock`); other
        # processes still meet SQLite's busy timeout. Re-entrant: a nested transaction
        # behaves as it did before.
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
        if self._writer is None:  # a server, or an in-memory SQLite: as a transaction
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
        with self._migration_lock(), self.dialect.schema_lock(self.engine), self.one_line_errors():
            migrate.upgrade(self.engine, f"the state database {self.path or shown_url(self.url)}")

    @contextlib.contextmanager
    def one_line_errors(self) -> Iterator[None]:
        """SQLite's errors on this file (a lock held past `lock_wait_s`, a read-only folder, a
        damaged page) as one `ConfigError` line naming the file; anything else as it is."""
        try:
            yield
        except (DatabaseError, OSError) as exc:
            message = self.dialect.error_message(exc, self.lock_wait_s)
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
            url = shown_url(self.url)
            reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
            raise ConfigError(f"cannot reach the state database {url}: {reason}") from exc

    @contextlib.contextmanager
    def _migration_lock(self) -> Iterator[None]:
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


# --- who the database is ---


def database_id(db: Database) -> str:
    """The id of the database `db` opens (read once per `Database` object)."""
    known = db.identity
    if known is None:
        with db.read() as s:
            known = s.scalars(select(DatabaseIdentity.id).order_by(DatabaseIdentity.created_at)).first()
        if known is None:  # only a hand-emptied table: the id is not ours to invent
            raise RuntimeError("the state database has no row in database_identity")
        db.identity = known
    return known


def database_label(url: str) -> str:
    """The URL without its password: no user secret ever reaches a file in the repository.
    The query string goes too (a driver may take `?password=…` there)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url.split("://", 1)[0] + "://…"
    bare = URL.create(parsed.drivername, username=parsed.username, host=parsed.host,
                      port=parsed.port, database=parsed.database)
    return bare.render_as_string(hide_password=False)
