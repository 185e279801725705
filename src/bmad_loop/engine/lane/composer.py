"""A story's candidate, composed: git's merge, the merge rules, the lane's write-back, and the
`regenerate` rules' commands run in the candidate (boxed as the lane's verify commands are).

The lane's integration (integrate.py) asks `Composer.compose` for the candidate of each
attempt; what happens to the candidate next (its verification, the CAS) is the integration's.
"""

from __future__ import annotations

from dataclasses import replace

from ...git.trees.compose import (Composition, LaneEdit, Settling, commit_message, compose,
                                  integration_message)
from ...git.trees.settle import Generators
from ...db.models import Story
from ...git.worktrees import ensure_detached_worktree
from ..worker.boxing import BoxSite, settle_after_box, verify_box
from ..mergerules import run_merge_rules
from .regenerate import Candidate as Regenerating
from .regenerate import regenerate
from .stacking import replay
from .writeback import lane_tree_edit

__all__ = ["Composer"]


class Composer:
    """Needs from the lane's integration (`lane`): git, policy, layout, run_id, board_rel, db,
    and `verify_env()` (what a command run for the lane gets)."""

    def __init__(self, lane, root):
        self.lane = lane
        self.rules = run_merge_rules(lane.policy, root, lane.board_rel)

    def compose(self, story: Story, strategy: str, target_sha: str, branch_sha: str,
                attempt: int) -> Composition:
        """The candidate. A story that started on a stacked base brings only its own commits
        (`base_sha..head`): they are replayed onto the target first, then composed as usual.
        Merge rules settle what they cover (mergesettle.py); generators run last."""
        git, rules, settled = self.lane.git, self.rules, None
        if story.stacked_on:
            replayed = replay(git, target_sha, story.base_sha, branch_sha, rules)
            if replayed.tip is None:
                return Composition(None, replayed.tree, replayed.conflicts, strategy, True,
                                   replayed.settled, replayed.regenerate)
            branch_sha, settled = replayed.tip, replayed
            rules = type(rules)()  # the replay settled the story's own change
        comp = compose(git, strategy, target_sha, branch_sha, self._message(story, strategy),
                       edit=LaneEdit(self._board_edit(story), f"bmad-loop: mark {story.key} done"),
                       # A repaired story's branch holds its own version of a generator's
                       # paths (the repair merge kept it): regenerate them whatever conflicts.
                       settling=Settling(rules, None if story.stacked_on else story.base_sha,
                                         Generators.EVERY if story.repairs
                                         else Generators.AS_RULED))
        if settled is not None:
            comp = replace(comp, settled=settled.settled, regenerate=settled.regenerate)
        if comp.ok and comp.regenerate:
            comp = self._regenerate(story, attempt, comp, target_sha, branch_sha)
        return comp

    def _regenerate(self, story: Story, attempt: int, comp: Composition, target_sha: str,
                    branch_sha: str) -> Composition:
        lane = self.lane
        base = story.base_sha or lane.git.out("merge-base", target_sha, branch_sha)
        worktree = lane.layout.candidate_worktree(story.key, attempt)
        log_path = lane.layout.verify_log(story.key, f"regenerate-{attempt}")
        scratch = lane.layout.scratch(story.key) / f"regenerate-{attempt}"
        ensure_detached_worktree(lane.git, worktree, comp.sha)
        env = lane.verify_env()
        box = verify_box(lane.policy, lane.git, lane.layout.state_dir,
                         BoxSite(worktree, scratch, log_path), env, lane.db.lock_dir)
        try:
            return regenerate(lane.git, Regenerating(comp, base, target_sha, branch_sha, story.key),
                              worktree=worktree, log_path=log_path, env=env, run_id=lane.run_id,
                              box=box)
        finally:
            if box is not None:
                settle_after_box(lane.git, worktree, None, scratch)

    def _message(self, story: Story, strategy: str) -> str:
        title = commit_message(self.lane.policy.scm.commit_message_template, story_key=story.key,
                               story_title=story.title, run_id=self.lane.run_id, epic=story.epic)
        return integration_message(title, strategy, story.branch)

    def _board_edit(self, story: Story):
        """The lane's BMAD write-back inside the candidate: board line, epic line, story file."""
        return lane_tree_edit(self.lane.git, key=story.key, epic=story.epic,
                              board_rel=self.lane.board_rel, story_path=story.story_path)
