"""Where a story's work happens: one seam, two implementations.

`WorktreeWorkspace` (`isolation = "worktree"`): each story in its own git worktree on its own
branch (or, with `branch_per = "run"`, one shared run branch and worktree). `InPlaceWorkspace`
(`isolation = "none"`, in inplace.py): the project's own checkout, one story at a time. The
worker prepares, commits and leaves a story through a `Workspace` only; the lane asks it to
discard a landed story's worktree and branch. `context.make_workspace` chooses once, from the
policy. (`WorktreeWorkspace` lives in worktree.py.)
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable
from typing import Any

from ...git.trees.compose import path_matches
from .guard import guard_env
from ...git.runner import Git
from ..runpaths import Layout
from ...git.targets import Target
from ...db.models import Story
from ..runrows import StoryRow
from ...policy import ScmPolicy
from .pool import Seeds

__all__ = ["Workspace", "Prepared", "matches_any"]


@dataclass
class Prepared:
    worktree: Path
    base_sha: str           # what the story's changes are measured from
    feedback: dict[str, Any] = field(default_factory=dict)  # merged into the story row


class Workspace(ABC):
    # The agent works in a worktree of the story's own, never in a person's checkout: bmad-loop
    # may take index flags off there and record and restore it (engine/verification/record.py).
    story_worktrees = False

    def __init__(self, git: Git, layout: Layout, target: Target, scm: ScmPolicy, *, root: Path,
                 seeds: Seeds = ()) -> None:
        self.git = git
        self.layout = layout
        self.target = target  # targets.Target
        self.scm = scm        # the policy's [scm] section
        self.root = Path(root)
        self._seeds = seeds

    @functools.cached_property
    def seeds(self) -> list[str]:
        """Untracked files copied into each worktree and never committed. `seeds` may be a
        callable: then they are listed on first use, so a workspace that never prepares or
        commits a story (the lane's) never pays for the listing."""
        source = self._seeds
        return list(source() if callable(source) else source)

    @abstractmethod
    def usable(self, worktree: str | None) -> bool:
        """Can a resumed story go on in `worktree`, or must it be prepared again?"""

    @abstractmethod
    def prepare(self, story: Story, branch: str, base_sha: str) -> Prepared:
        """Put the story's branch where the agent will work; `base_sha` is the target now."""

    @abstractmethod
    def commit(self, story: Story, message: str, revert: list[str],
               merge: list[str] | None = None) -> tuple[str, list[str]]:
        """Commit what the agent left (files matching `revert` restored first): (head, reverted).
        `merge`: a repair's merge commit, with exactly these parents (its head, the target)."""

    @abstractmethod
    def leave(self, story: Story, *, rollback: bool, pause_on_escalation: bool) -> str | None:
        """The story escalates: keep its work, return its head."""

    def guard_env(self, worktree: Path, hooks_dir: Path, guard_log: Path) -> dict[str, str]:
        """Environment that arms the target guard for processes run in `worktree`."""
        return guard_env(self.git, worktree, self.target.branch, hooks_dir, guard_log)

    def release_worktree(self, story: StoryRow) -> None:
        """The worker once the story is ready (its work is all on its branch), else the lane
        right after it landed: its worktree goes (or waits, parked, for the next story). In
        place: nothing to release."""

    def reseed(self, worktree: Path) -> None:
        """Copy the seed files into `worktree` again where they are missing (a restored
        worktree, engine/verification/record.py). In place: nothing is seeded."""

    def restore_worktree(self, story: StoryRow) -> None:
        """The lane, when the story's integration escalated: a worktree released at ready is
        made again on its branch, for the human who will look at it. In place: nothing."""

    @abstractmethod
    def discard_landed(self, story: StoryRow, *, delete_branch: bool) -> None:
        """The lane, after the story landed and the next one is on its way: remove what the
        story no longer needs (its worktree too, if `release_worktree` did not)."""


def matches_any(path: str, patterns: Iterable[str], directories: frozenset[str] | None = None) -> bool:
    """Does any pattern cover `path`? With `directories` (a tree's), a literal pattern covers
    what is under it only where it names one of them, as admission reads footprints."""
    return path_matches(list(patterns), path, directories)
