"""`isolation = "worktree"`: each story in its own git worktree, on its own branch.

With `branch_per = "run"` the stories share one run branch and worktree, taken up to the
target after each integration. With `branch_per = "story"` in local mode, a ready story's
worktree (its work is all on its branch) is parked and the next new story takes it instead of a
fresh checkout (pool.py); should its integration escalate, it is made again.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import cast

from ...db.models import Story
from ..runrows import StoryRow
from ...git.trees.compose import commit_worktree
from ...errors import GitError
from ...git.worktrees import ensure_worktree, remove_worktree
from .base import Prepared, Workspace
from .pool import clear_interrupted_take, park, pool_size, take

__all__ = ["WorktreeWorkspace"]

log = logging.getLogger(__name__)


class WorktreeWorkspace(Workspace):
    story_worktrees = True

    @property
    def shared_branch(self) -> bool:
        return self.scm.branch_per == "run"

    def usable(self, worktree: str | None) -> bool:
        """A worktree of this repository (clone), still on disk."""
        if not worktree or not Path(worktree).is_dir():
            return False
        return Path(worktree).resolve().is_relative_to(self.layout.state_dir.resolve())

    def prepare(self, story: Story, branch: str, base_sha: str) -> Prepared:
        worktree = self.layout.story_worktree(story.key, self.scm.branch_per)
        start = base_sha
        existing = self.git.rev(f"refs/heads/{branch}")
        head = existing  # what the branch holds once this is done: handed on, not re-read
        if self.shared_branch and existing and self.git.is_ancestor(existing, base_sha):
            # The shared run branch was integrated: move it up to the target before reuse.
            self.git.run("update-ref", f"refs/heads/{branch}", base_sha, existing)
            head = base_sha
            if worktree.exists():
                self.git.run("reset", "-q", "--hard", base_sha, cwd=worktree)
        elif existing:
            start = existing
            # Resumed on its own branch: the story's changes are measured from the fork point.
            base_sha = self.git.out("merge-base", existing, base_sha)
        elif self._pooled and pool_size(self.scm):
            # A new story: a parked worktree of an integrated one, if the pool has any.
            clear_interrupted_take(self.git, worktree)
            if not os.path.lexists(worktree) and take(self.git, self.layout, worktree, branch, start,
                                                           self.scm.reuse_keep):
                self._seed(worktree)
                return Prepared(worktree, base_sha)
        ensure_worktree(self.git, worktree, branch, start, branch_head=head)
        self._seed(worktree)
        return Prepared(worktree, base_sha)

    def commit(self, story: Story, message: str, revert: list[str],
               merge: list[str] | None = None) -> tuple[str, list[str]]:
        # A prepared story's row names its worktree and base.
        worktree, base_sha = cast(str, story.worktree), cast(str, story.base_sha)
        return commit_worktree(self.git, Path(worktree), message, base_sha, revert,
                               exclude=self.seeds, parents=merge)

    def leave(self, story: Story, *, rollback: bool, pause_on_escalation: bool) -> str | None:
        if story.worktree and Path(story.worktree).exists():
            return self.git.rev("HEAD", cwd=Path(story.worktree))
        return None

    def release_worktree(self, story: StoryRow) -> None:
        # (The shared run branch's worktree serves the next story; a story host removes its own.)
        if self._pooled and story.worktree and Path(story.worktree).exists():
            if not (story.branch and park(self.git, Path(story.worktree), story.branch, self.layout,
                                          size=pool_size(self.scm),
                                          seeds=lambda: self.seeds)):
                remove_worktree(self.git, Path(story.worktree))

    def restore_worktree(self, story: StoryRow) -> None:
        if self._pooled and story.worktree and story.branch and story.head_sha \
                and not Path(story.worktree).exists():
            try:
                ensure_worktree(self.git, Path(story.worktree), story.branch, story.head_sha,
                                branch_head=story.head_sha)
            except (GitError, OSError) as exc:  # e.g. someone has the branch checked out
                log.warning("could not give %s its worktree back (%s); its branch %s has its "
                            "work", story.key, exc, story.branch)

    def discard_landed(self, story: StoryRow, *, delete_branch: bool) -> None:
        if self.shared_branch:
            return
        self.release_worktree(story)  # nothing to do when the lane released it already
        if delete_branch and story.branch:
            self.target.delete_story_branch(story.branch)

    @property
    def _pooled(self) -> bool:
        """Worktrees are parked and taken: one branch per story, removed by this host's lane."""
        return not self.shared_branch and self.target.lane_removes_story_worktrees

    def reseed(self, worktree: Path) -> None:
        self._seed(worktree)

    def _seed(self, worktree: Path) -> None:
        """Copy untracked seed files (policy list + the agent profile's config) into a worktree."""
        for name in self.seeds:
            source = self.root / name
            if not source.exists() or (worktree / name).exists():
                continue
            (worktree / name).parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, worktree / name)
            else:
                shutil.copy2(source, worktree / name)
