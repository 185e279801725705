"""The target in the project's own repository: `update-ref` CAS, the checkout kept in step."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from .checkout_sync import index_path, sync_held_checkout
from ..trees.compose import cas_advance
from ..indexlock import IndexLock
from ..worktrees import checkout_of, delete_branch
from .base import Target

__all__ = ["LocalTarget"]


class LocalTarget(Target):
    def __init__(self, git, branch: str, *, checkout: Path | None = None):
        super().__init__(git, branch)
        self._held = None  # (checkout, IndexLock) inside checkout_held()
        self._planning_checkout = Path(checkout) if checkout is not None else git.repo_dir

    @property
    def ref(self) -> str:
        return f"refs/heads/{self.branch}"

    def sha(self, *, fetch: bool = True) -> str | None:
        return self.git.rev(self.ref)

    def advance(self, new: str, old: str) -> bool:
        return cas_advance(self.git, self.branch, new, old)

    def checkout(self) -> Path | None:
        return checkout_of(self.git, self.branch)

    @contextmanager
    def checkout_held(self, *, wait_s: float = 30, on_wait=None, on_stale=None):
        checkout = self.checkout()
        if checkout is None:
            yield None
            return
        lock = IndexLock(index_path(self.git, checkout), wait_s=wait_s, on_wait=on_wait,
                         on_stale=on_stale)
        with lock:
            self._held = (checkout, lock)
            try:
                yield checkout
            finally:
                self._held = None

    def sync_checkout(self, checkout: Path, old: str, new: str) -> None:
        held = getattr(self, "_held", None)
        if held is None or held[0] != checkout:
            raise RuntimeError(f"sync_checkout({checkout}) outside checkout_held()")
        sync_held_checkout(self.git, checkout, held[1], old, new)

    def story_source(self, worktree: Path) -> Path:
        # The run was planned from this checkout's story files.
        return self._planning_checkout

    def story_head(self, branch: str) -> str | None:
        return self.git.rev(f"refs/heads/{branch}")

    def delete_story_branch(self, branch: str) -> None:
        delete_branch(self.git, branch)
