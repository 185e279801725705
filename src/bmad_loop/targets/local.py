"""The target in the project's own repository: `update-ref` CAS, the checkout kept in step."""

from __future__ import annotations

from pathlib import Path

from ..compose import cas_advance, sync_checkout
from ..worktrees import checkout_of, delete_branch
from .base import Target

__all__ = ["LocalTarget"]


class LocalTarget(Target):
    def __init__(self, git, branch: str, *, checkout: Path | None = None):
        super().__init__(git, branch)
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

    def sync_checkout(self, checkout: Path, old: str, new: str) -> None:
        sync_checkout(self.git, checkout, old, new)

    def story_source(self, worktree: Path) -> Path:
        # The run was planned from this checkout's story files.
        return self._planning_checkout

    def story_head(self, branch: str) -> str | None:
        return self.git.rev(f"refs/heads/{branch}")

    def delete_story_branch(self, branch: str) -> None:
        delete_branch(self.git, branch)
