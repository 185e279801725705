"""`isolation = "none"`: the agent works in the project's own checkout, sequentially.

The checkout moves onto the story branch for the story's work and back to the target when
the story is committed, so composition and advance are exactly those of worktree mode. Local
changes that were there before the story started are left alone: never committed, and an agent
that edits one of them escalates the story instead of mixing its work with a human's.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from ...db.models import Story
from ..runrows import StoryRow
from ...git.trees.compose import clear_operation_state, dirty_paths
from ...git.runner import NO_AUTO_MAINTENANCE
from ..escalation import Escalate
from .base import Prepared, Workspace, matches_any

__all__ = ["InPlaceWorkspace"]

STATE_PREFIX = ".bmad-loop/"


class InPlaceWorkspace(Workspace):
    def usable(self, worktree: str | None) -> bool:
        return True  # the checkout is always here

    def guard_env(self, worktree: Path, hooks_dir: Path, guard_log: Path) -> dict[str, str]:
        return {}  # in place, the agent works on the target checkout by definition

    def prepare(self, story: Story, branch: str, base_sha: str) -> Prepared:
        current = self.git.current_branch()
        if current == branch:
            return Prepared(self.root, base_sha)  # resumed: already on the story branch
        if current != self.target.branch:
            raise Escalate(f"in-place isolation needs the checkout on {self.target.branch}, "
                           f"it is on {current or 'a detached HEAD'}")
        snapshot = {p: self._hash(p) for p in self._dirty()}
        self.git.run("checkout", "-q", "-B", branch, base_sha)
        return Prepared(self.root, base_sha, feedback={"pre_dirty": snapshot})

    def agent_paths(self, story: Story) -> list[str]:
        snapshot = story.feedback.get("pre_dirty", {})
        touched = []
        for rel in self._dirty():
            if rel in snapshot:
                if self._hash(rel) != snapshot[rel]:
                    raise Escalate(f"the agent changed {rel}, which had local changes before the "
                                   "story started", paths=[rel])
                continue
            touched.append(rel)
        return touched

    def commit(self, story: Story, message: str, revert: list[str],
               merge: list[str] | None = None) -> tuple[str, list[str]]:
        if merge:  # the lane repairs only stories of their own worktree (lane/aftermath.py)
            raise ValueError("a repair merge is made only in a story's own worktree")
        paths = self.agent_paths(story)
        reverted = [p for p in paths if matches_any(p, revert)]
        for rel in reverted:
            if self.git.run("cat-file", "-e", f"{story.base_sha}:{rel}", check=False).returncode == 0:
                self.git.run("checkout", story.base_sha, "--", rel)
            else:
                (self.root / rel).unlink(missing_ok=True)
        paths = [p for p in paths if p not in reverted]
        if paths:
            self._commit(paths, message)
        head = cast(str, self.git.rev("HEAD"))  # on the story branch: HEAD resolves
        # Back to the target: the lane composes and advances it like any other story.
        self.git.run("checkout", "-q", self.target.branch)
        return head, reverted

    def leave(self, story: Story, *, rollback: bool, pause_on_escalation: bool) -> str | None:
        """Keep the agent's work on the story branch; roll the checkout back or not.

        `rollback_on_failure = false` under `on_escalation = "pause"` leaves the checkout on the
        story branch exactly as the agent left it; otherwise the work is committed to the story
        branch and the checkout goes back to the target."""
        if self.git.current_branch() != story.branch:
            return self.git.rev(f"refs/heads/{story.branch}") if story.branch else None
        if not rollback and pause_on_escalation:
            return self.git.rev("HEAD")  # left as the agent left it, for a human to look at
        # Rolling back, or the run goes on with other stories: the work is committed to the
        # story branch (nothing is lost) and the checkout returns to the target.
        try:
            paths = self.agent_paths(story)
        except Escalate:
            paths = []
        if paths:
            self._commit(paths, f"{story.key}: work in progress (escalated)")
        head = self.git.rev("HEAD")
        self.git.run("checkout", "-q", self.target.branch)
        return head

    def discard_landed(self, story: StoryRow, *, delete_branch: bool) -> None:
        if delete_branch and story.branch:
            self.target.delete_story_branch(story.branch)

    def _commit(self, paths: list[str], message: str) -> None:
        # A MERGE_HEAD (or CHERRY_PICK_HEAD...) the agent left would make this a merge of
        # whatever it names: removed first, as the worktree commit does.
        clear_operation_state(self.git, self.root)
        self.git.run("add", "-A", "--", *paths)
        self.git.run("-c", "commit.gpgsign=false", *NO_AUTO_MAINTENANCE, "commit", "-q",
                     "--no-verify", "-m", message, env=self.git.identity_env())

    def _dirty(self) -> list[str]:
        return sorted(p for p in dirty_paths(self.git, self.root) if not p.startswith(STATE_PREFIX))

    def _hash(self, rel: str) -> str | None:
        path = self.root / rel
        if not path.is_file():
            return None
        return self.git.out("hash-object", "--", rel)
