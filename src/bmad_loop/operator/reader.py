"""Read-only sessions for the operator surfaces that poll (watch, follow, attach, TUI).

The engine's own sessions start every SQLite transaction with BEGIN IMMEDIATE (a write lock),
which is right for the engine and wrong for a board that re-reads every second: a reader here
opens the database file with `mode=ro` and never takes the write lock, so watching a run
never slows it down. Other databases (PostgreSQL) use the project's engine as it is.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from sqlalchemy.orm import Session, sessionmaker

__all__ = ["Reader"]


class Reader:
    def __init__(self, project):
        db = project.db  # created and migrated on first use, like every command
        self._engine = db.dialect.read_only_engine()
        self._sessions = sessionmaker(self._engine or db.engine, expire_on_commit=False)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        session = self._sessions()
        try:
            yield session
        finally:
            session.rollback()
            session.close()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
