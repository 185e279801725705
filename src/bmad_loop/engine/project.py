"""A project: a repository root, its `.bmad-loop/` state folder, its policy and connections.

Connections (database engine, huey storage) are made lazily and per process, so a forked
consumer never shares its parent's sockets or SQLite handles.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from ..db.database import Database, default_database_url
from ..gitcmd import Git, Identity
from ..policy import Policy, load_policy

__all__ = ["Project", "STATE_DIRNAME", "ensure_state_dir"]

STATE_DIRNAME = ".bmad-loop"

# Everything under .bmad-loop/ is runtime state except the policy, which teams commit.
STATE_GITIGNORE = "# bmad-loop runtime files (database, queue, worktrees, logs)\n*\n!.gitignore\n!policy.toml\n"


def ensure_state_dir(root: Path) -> Path:
    state = root / STATE_DIRNAME
    state.mkdir(parents=True, exist_ok=True)
    ignore = state / ".gitignore"
    if not ignore.exists():
        ignore.write_text(STATE_GITIGNORE)
    return state


@dataclass
class Project:
    root: Path
    policy: Policy

    def __post_init__(self):
        self.root = Path(self.root).resolve()
        self._db: Database | None = None
        self._db_pid: int | None = None

    @classmethod
    def open(cls, root: Path | str, policy: Policy | None = None) -> "Project":
        root = Path(root).resolve()
        return cls(root=root, policy=policy or load_policy(root))

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIRNAME

    def path(self, *parts: str) -> Path:
        return self.state_dir.joinpath(*parts)

    @property
    def database_url(self) -> str:
        return self.policy.database.url or default_database_url(self.state_dir)

    @property
    def db(self) -> Database:
        """The state database, created and migrated on first use in this process."""
        if self._db is None or self._db_pid != os.getpid():
            ensure_state_dir(self.root)
            db = Database(self.database_url, lock_dir=self.state_dir)
            db.migrate()
            self._db, self._db_pid = db, os.getpid()
        return self._db

    def git(self, policy: Policy | None = None) -> Git:
        scm = (policy or self.policy).scm
        return Git(self.root, Identity(scm.author_name, scm.author_email))

    @property
    def lane_lease_name(self) -> str:
        """One integration lane per project (and per state database)."""
        return f"lane:{self.root}"

    @property
    def host(self) -> str:
        return socket.gethostname()

    def close(self) -> None:
        if self._db is not None:
            self._db.dispose()
            self._db = None
