"""Engine, sessions and migrations for the state database.

Embedded default: SQLite in WAL mode under `.bmad-loop/state.db`. Every write transaction on
SQLite starts with BEGIN IMMEDIATE, so several consumer processes never hit the deferred
read-then-write "database is locked" failure and never lose an update (see docs/architecture.md).
Any other SQLAlchemy URL (PostgreSQL for scale-out) is used as given.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, InterfaceError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import ConfigError
from . import migrate

__all__ = ["Database", "default_database_url"]

SQLITE_BUSY_TIMEOUT_MS = 30_000
# pg_advisory_lock key serialising migrations of one PostgreSQL database across hosts.
PG_MIGRATION_LOCK_KEY = 0x626D_6164  # "bmad"


def default_database_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'state.db'}"


def _install_sqlite_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy's `begin` event emit the BEGIN itself (pysqlite's own is deferred).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")


class Database:
    """One engine and its session factory. Create after a fork, never before."""

    def __init__(self, url: str, *, lock_dir: Path | None = None):
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self._lock_dir = lock_dir
        if self.is_sqlite:
            path = url.split("///", 1)[-1]
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
            _install_sqlite_hooks(self.engine)
        else:
            try:
                self.engine = create_engine(url, pool_pre_ping=True)
            except (ImportError, ArgumentError, NoSuchModuleError) as exc:
                # A driver that is not installed, or a URL SQLAlchemy cannot read: one line.
                raise ConfigError(f"[database] url {_shown(url)}: {exc}") from None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """A short write transaction: commit on success, roll back on error. Keep slow work out."""
        with self._sessions.begin() as session:
            yield session

    def session(self) -> Session:
        return self._sessions()

    def migrate(self) -> None:
        """Bring the schema to head, once, under a file lock (concurrent upgrades race).

        On PostgreSQL the consumers may sit on different hosts, where a file lock means
        nothing: a session-level advisory lock in the database serialises them instead.
        """
        self._check_reachable()
        with self._migration_lock(), self._database_lock():
            migrate.upgrade(self.engine)

    def _check_reachable(self) -> None:
        """Connect once: every process does this first, so a database that is down or misnamed
        is one line (exit 2, nothing ran) instead of a driver traceback. Later errors stay as they are."""
        try:
            with self.engine.connect():
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
        from sqlalchemy import text

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
        self._lock_dir.mkdir(parents=True, exist_ok=True)
        with open(self._lock_dir / "migrate.lock", "a+") as handle:
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
