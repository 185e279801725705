"""The `Target` base class: everything the engine may ask of the target branch and its story branches."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..runner import Git

__all__ = ["Target"]


class Target(ABC):
    """The target branch `branch`, seen through `git` (this process's repository or clone)."""

    #: The lane removes a landed story's worktree itself (False: it lives on a story host).
    lane_removes_story_worktrees = True
    #: Story branches travel through a shared remote: pushed when ready, fetched to integrate.
    publishes_stories = False

    def __init__(self, git: Git, branch: str) -> None:
        self.git = git
        self.branch = branch

    # ------------------------------------------------------------------ the target
    @property
    @abstractmethod
    def ref(self) -> str:
        """The ref this process reads the target from."""

    @abstractmethod
    def sha(self, *, fetch: bool = True) -> str | None:
        """Where the target is now (`fetch` False: as last seen, without asking a remote)."""

    @abstractmethod
    def advance(self, new: str, old: str) -> bool:
        """Compare-and-swap the target from `old` to `new`. False: it was no longer at `old`."""

    def checkout(self) -> Path | None:
        """The checkout that has the target checked out and must follow it, if any."""
        return None

    @contextmanager
    def checkout_held(self, *, wait_s: float = 30, on_wait: Callable[[str], None] | None = None,
                      on_stale: Callable[[str], None] | None = None) -> Iterator[Path | None]:
        """Hold the target checkout (its index lock) across an advance; yields its path, or None
        when no checkout follows the target. Inside, `sync_checkout` brings it along."""
        yield None

    def sync_checkout(self, checkout: Path, old: str, new: str) -> None:
        """Bring the held `checkout` from `old` to `new` after an advance (unrelated changes kept)."""

    def story_source(self, worktree: Path) -> Path:
        """The folder a session reads the story file from."""
        return worktree

    # ------------------------------------------------------------------ story branches
    @abstractmethod
    def story_head(self, branch: str) -> str | None:
        """Where a story branch is now, its commits available here; None when it is absent."""

    def publish_story(self, branch: str, sha: str) -> bool:
        """Make a finished story's branch visible to the lane. True when something was sent."""
        return False

    @abstractmethod
    def delete_story_branch(self, branch: str) -> None:
        """Delete a landed story's branch where the lane keeps it (gone already is fine)."""

    def foreign_story_branches(self, namespace: str) -> dict[str, str]:
        """Story branches kept outside this repository (remote mode): name -> sha."""
        return {}

    @property
    def location(self) -> str:
        """Where the target lives, for messages: a repository path or a remote URL."""
        return str(self.git.repo_dir)
