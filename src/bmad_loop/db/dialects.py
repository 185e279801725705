"""What differs between the databases bmad-loop keeps its rows in, behind one class per kind.

`dialect_for(url)` chooses once: `SqliteDialect` (the embedded default, a file under
`.bmad-loop/`) or `ServerDialect` (PostgreSQL for scale-out; any other SQLAlchemy URL is used
as given). The rest of the package asks the dialect — how to check and open the database,
whether writers of this process take turns on a file lock, how to read without the write lock,
how to serialise migrations, how to upsert, how to word an error — instead of testing URLs.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

from sqlalchemy import create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect as SqlDialect, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from ..errors import ConfigError
from .sqlitefile import check_folder_writable, check_sqlite_file, sqlite_error_message

__all__ = ["Dialect", "SqliteDialect", "ServerDialect", "dialect_for", "upsert_for",
           "READ_ONLY", "shown_url"]

SQLITE_BUSY_TIMEOUT_MS = 30_000
READ_ONLY = "bmad_loop_read_only"  # execution option of `Database.read`'s connections
# pg_advisory_lock key serialising migrations of one PostgreSQL database across hosts.
PG_MIGRATION_LOCK_KEY = 0x626D_6164  # "bmad"

# INSERT … ON CONFLICT DO UPDATE, by SQLAlchemy dialect name, where the database has it.
_UPSERTS: dict[str, Callable[..., Any]] = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def upsert_for(dialect: SqlDialect) -> Callable[..., Any] | None:
    """The `insert` construct with `on_conflict_do_update` for a connection's SQLAlchemy
    dialect, or None where the database lacks an atomic upsert with RETURNING."""
    return _UPSERTS.get(dialect.name) if dialect.insert_returning else None


def shown_url(url: str) -> str:
    """The URL for a message, password hidden (a URL SQLAlchemy cannot parse: its scheme only)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url.split("://", 1)[0] + "://…"


class Dialect:
    """One kind of database. The defaults are the answers of a database that needs nothing
    special there; each kind overrides what it does differently."""

    kind = "server"

    def __init__(self, url: str):
        self.url = url
        self.path = ""  # the database file, for a dialect that has one

    def check_driver(self, source: str) -> None:
        """Refuse a URL whose driver is not installed, naming the extra that installs it."""

    def check_reachable(self, source: str, timeout_s: int) -> None:
        """Refuse a database that does not answer; create nothing."""

    def open_engine(self, lock_wait_s: float) -> Engine:
        raise NotImplementedError

    def writer_lock(self) -> threading.RLock | None:
        """A lock the writers of this process take turns on, or None."""
        return None

    def read_only_engine(self) -> Engine | None:
        """An engine that can only read (the operator's polls), or None to use the main one."""
        return None

    def schema_lock(self, engine: Engine) -> AbstractContextManager[None]:
        """Held while migrating: serialises hosts that share the database."""
        return contextlib.nullcontext()

    def error_message(self, exc: BaseException, lock_wait_s: float) -> str | None:
        """A one-line message for a database error, or None to let it stand."""
        return None


class ServerDialect(Dialect):
    """A database server (PostgreSQL): reached over the network, locked in the database."""

    def check_driver(self, source: str) -> None:
        try:
            parsed = make_url(self.url)
            dialect = parsed.get_dialect()
        except ArgumentError:
            raise ConfigError(f"{source}: not a database URL: {shown_url(self.url)}") from None
        except NoSuchModuleError:
            raise ConfigError(f"{source}: unknown kind of database in {shown_url(self.url)}") from None
        try:
            dialect.import_dbapi()
        except ImportError as exc:
            if parsed.get_backend_name() == "postgresql":
                hint = "install bmad-loop[postgres]" + (
                    "" if dialect.driver == "psycopg" else " and write the url as postgresql+psycopg://…")
            else:
                hint = f"install the Python driver {dialect.driver!r}"
            raise ConfigError(f"{source}: the driver for {shown_url(self.url)} is not installed "
                              f"({exc}): {hint}") from None

    def check_reachable(self, source: str, timeout_s: int) -> None:
        """One connection and `SELECT 1`."""
        from sqlalchemy.pool import NullPool

        args = {"connect_timeout": timeout_s} if self._is_postgresql() else {}
        engine = create_engine(self.url, poolclass=NullPool, connect_args=args)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except DBAPIError as exc:
            reason = (str(exc.orig or exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"{source}: cannot reach the database {shown_url(self.url)}: {reason}") from None
        finally:
            engine.dispose()

    def open_engine(self, lock_wait_s: float) -> Engine:
        self.check_driver("[database] url")
        try:
            return create_engine(self.url, pool_pre_ping=True)
        except (ImportError, ArgumentError, NoSuchModuleError) as exc:
            raise ConfigError(f"[database] url {shown_url(self.url)}: {exc}") from None

    @contextlib.contextmanager
    def schema_lock(self, engine: Engine) -> Iterator[None]:
        """A session-level advisory lock: the consumers may sit on different hosts, where a
        file lock means nothing."""
        if not self._is_postgresql():
            yield
            return
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": PG_MIGRATION_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": PG_MIGRATION_LOCK_KEY})
                conn.commit()

    def _is_postgresql(self) -> bool:
        return make_url(self.url).get_backend_name() == "postgresql"


_writers: dict[str, threading.RLock] = {}  # one per SQLite file, for the life of the process
_writers_guard = threading.Lock()


class SqliteDialect(Dialect):
    """A SQLite file in WAL mode. Every write transaction starts with BEGIN IMMEDIATE, so
    several consumer processes never hit the deferred read-then-write "database is locked"
    failure; a read-only one takes no write lock at all."""

    kind = "sqlite"

    def __init__(self, url: str):
        super().__init__(url)
        self.path = url.split("///", 1)[-1]

    @property
    def _is_file(self) -> bool:
        return bool(self.path) and self.path != ":memory:"

    def open_engine(self, lock_wait_s: float) -> Engine:
        if self._is_file:
            # Refused before anything is made or opened: a folder we cannot write, a file that
            # is not a whole database.
            folder = Path(self.path).parent
            check_folder_writable(folder, "state folder")
            folder.mkdir(parents=True, exist_ok=True)
            check_sqlite_file(Path(self.path), "state database")
        engine = create_engine(self.url, connect_args={"timeout": lock_wait_s})
        _install_sqlite_hooks(engine, int(lock_wait_s * 1000))
        return engine

    def writer_lock(self) -> threading.RLock | None:
        """Threads of this process take turns on the file's write lock, shared by every
        `Database` opened on it: left to SQLite, a waiting `BEGIN IMMEDIATE` sleeps in growing
        steps (up to 100 ms) even when the holder is done a millisecond later."""
        if not self._is_file:
            return None
        with _writers_guard:
            return _writers.setdefault(os.path.abspath(self.path), threading.RLock())

    def read_only_engine(self) -> Engine | None:
        """The file opened with `mode=ro`: a poll never takes the write lock."""
        path = self.path

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=30,
                                   check_same_thread=False)
            conn.execute("PRAGMA query_only = ON")
            return conn

        return create_engine(f"sqlite:///{path}", creator=connect)

    def error_message(self, exc: BaseException, lock_wait_s: float) -> str | None:
        return sqlite_error_message(self.path, exc, lock_wait_s)


def dialect_for(url: str) -> Dialect:
    """The dialect of a `[database] url`; empty means the embedded SQLite default."""
    return SqliteDialect(url) if not url or url.startswith("sqlite") else ServerDialect(url)


def _install_sqlite_hooks(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        # Let SQLAlchemy's `begin` event emit the BEGIN itself (pysqlite's own is deferred).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        _enter_wal(cur, busy_timeout_ms / 1000)
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A read (`Database.read`) takes no write lock: in WAL mode it neither waits for a
        # writer nor makes one wait.
        # Straight to the driver: through SQLAlchemy's statement machinery this one line
        # cost more than the statements it opens (SQLAlchemy still sees the transaction: it
        # is the one calling here). Its failure (the write lock not free within the busy
        # timeout) is raised as SQLAlchemy's own, as any statement's would be.
        statement = "BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE"
        try:
            driver = conn.connection.driver_connection
            assert driver is not None  # a connection just checked out of the pool
            driver.execute(statement)
        except sqlite3.Error as exc:
            raise DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc


def _enter_wal(cursor: sqlite3.Cursor, wait_s: float) -> None:
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
