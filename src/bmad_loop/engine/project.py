"""A project: a repository root, its `.bmad-loop/` state folder, its policy and connections.

`root` is the repository this process works in; `home` is the folder its policy came from
(the same folder, unless a consumer works in its own clone: `worker --clone DIR`). Shared state
(the default SQLite database and queue) lives under `home`; per-host debris (worktrees, logs,
candidates) under `root`. In remote mode (`[scm] remote`) the project's identity (`key`) is the
remote's URL, so every clone of it is the same project; in local mode it is the root's path.

Connections (database engine, huey storage) are made lazily and per process, so a forked
consumer never shares its parent's sockets or SQLite handles.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..db.database import Database, check_driver, default_database_url
from ..db.sqlitefile import check_folder_writable
from ..git.runner import Git, Identity
from ..hostid import host_name
from ..policy import Policy, load_policy
from ..git.clone import resolve_remote_url
from ..git.targets import Target, make_target

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


class Project:
    """`home`: where the policy came from (default: `root`), always resolved once made."""

    def __init__(self, root: Path | str, policy: Policy, home: Path | str | None = None) -> None:
        self.root = Path(root).resolve()
        self.policy = policy
        self.home: Path = Path(home).resolve() if home is not None else self.root
        self._db: Database | None = None
        self._db_pid: int | None = None
        self._remote_url: str | None = None

    @classmethod
    def open(cls, root: Path | str, policy: Policy | None = None, home: Path | str | None = None) -> "Project":
        root = Path(root).resolve()
        return cls(root=root, policy=policy or load_policy(home or root),
                   home=Path(home) if home is not None else None)

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIRNAME

    @property
    def home_state_dir(self) -> Path:
        return self.home / STATE_DIRNAME

    # ------------------------------------------------------------------ the target
    @property
    def remote_url(self) -> str | None:
        """The shared remote's URL in remote mode, None in local mode."""
        if not self.policy.scm.remote:
            return None
        if self._remote_url is None:
            checkout = self.home if (self.home / ".git").exists() else self.root
            self._remote_url = resolve_remote_url(self.policy.scm.remote, checkout)
        return self._remote_url

    @property
    def key(self) -> str:
        """The project's identity in the rows (`runs.project`), the lane lease and queue names."""
        return self.remote_url or str(self.root)

    def target(self, git: Git, branch: str) -> Target:
        """The target branch as this process reaches it (see `bmad_loop.git.targets`)."""
        return make_target(git, branch, self.remote_url, checkout=self.root)

    def path(self, *parts: str) -> Path:
        return self.state_dir.joinpath(*parts)

    @property
    def database_url(self) -> str:
        return self.policy.database.url or default_database_url(self.home_state_dir)

    @property
    def db(self) -> Database:
        """The state database, created and migrated on first use in this process."""
        if self._db is None or self._db_pid != os.getpid():
            # Refused in one line before anything is written: a folder that cannot be
            # written, a damaged database file, a driver that is not installed.
            check_folder_writable(self.state_dir, "state folder")
            check_driver(self.policy.database.url, f"{self.policy.source}: [database] url")
            db = Database(self.database_url, lock_dir=self.home_state_dir,
                          lock_wait_s=self.policy.database.lock_wait_s)
            ensure_state_dir(self.root)
            if not self.policy.database.url:
                ensure_state_dir(self.home)
            db.migrate()
            self._db, self._db_pid = db, os.getpid()
        return self._db

    def git(self, policy: Policy | None = None) -> Git:
        scm = (policy or self.policy).scm
        return Git(self.root, Identity(scm.author_name, scm.author_email), lock_wait_s=scm.lock_wait_s, run_hooks=scm.run_hooks)

    @property
    def lane_lease_name(self) -> str:
        """One integration lane per project (and per state database)."""
        from .leases import lane_lease_name

        return lane_lease_name(self.key)

    @property
    def host(self) -> str:
        return host_name()

    def close(self) -> None:
        if self._db is not None:
            self._db.dispose()
            self._db = None
