"""Restacking: a stacked story whose base no longer stands is redone on the real target.

A story that started on a stacked base (stacking.py) built on work that had not integrated yet.
When a story under it fails to integrate (escalates, is blocked or sent back) or is redone with
another head, that base is not what the target will be. The lane then:

1. keeps the stacked story's work under `refs/bmad-loop/<run>/restacked/<key>/<n>` (nothing is
   dropped; an existing ref at the same head is reused, so a crash here repeats nothing);
2. removes its worktree and branch;
3. sends it back to `pending` with a fresh start (fresh attempt budget, no stacked base),
   journaled `story.restacked`.

A fresh start rather than a replay of its commits: they were written against work that did not
land, so only an agent can tell what they should become. The kept ref is named in the story's
feedback, so the next prompt can point at it.

A story still `queued` just goes back to `pending` (nothing started; a worktree and branch a
worker made before it died are removed too); a `working` one is left to finish its story and is
restacked once it is `ready` (or escalated).
"""

from __future__ import annotations

from pathlib import Path

from ...db.models import Story
from ...states import StoryState
from ...git.worktrees import delete_branch, remove_worktree
from ..journal import record
from .stacking import stale_layer
from ..transitions import transition_story

__all__ = ["restack_stale", "restacked_ref_prefix", "own_paths"]

# The states a stale stacked story is restacked from (a working one finishes first).
_RESTACKABLE = (StoryState.PENDING, StoryState.QUEUED, StoryState.READY, StoryState.ESCALATED)


def restacked_ref_prefix(run_id: str, key: str) -> str:
    return f"refs/bmad-loop/{run_id}/restacked/{key}/"


def own_paths(layout, scm):
    """`made_at` for `restack_stale`: a story's own worktree and branch, by its key (None when
    the run shares one branch, which is never a story's to remove)."""
    if scm.branch_per != "story":
        return None
    return lambda key: (layout.story_worktree(key, "story"), layout.story_branch(key, "story"))


def restack_stale(db, git, run_id: str, stories: list[Story], made_at=None) -> bool:
    """Restack every stacked story whose base no longer stands; True when one was.
    `made_at(key)`: (worktree, branch) a story's prepare makes, for one the row does not name
    yet (a worker died between making them and writing the row)."""
    rows = {s.key: s for s in stories}
    changed = False
    for story in stories:
        if not story.stacked_on or story.state not in _RESTACKABLE:
            continue
        why = stale_layer(story, rows)
        if why is not None:
            changed |= _restack(db, git, run_id, story, why, made_at)
    return changed


def _restack(db, git, run_id: str, story: Story, why: str, made_at=None) -> bool:
    kept = None
    worktree, branch = story.worktree, story.branch
    made = made_at(story.key) if not branch and made_at is not None else None
    if made is not None and git.rev(f"refs/heads/{made[1]}"):
        worktree, branch = str(made[0]), made[1]  # else never prepared: nothing to remove
    if branch or worktree:
        head = story.head_sha or (git.rev(f"refs/heads/{branch}") if branch else None)
        if head and head != story.base_sha:
            kept = _keep(git, run_id, story.key, head)
        if worktree:
            remove_worktree(git, Path(worktree))
        if branch:
            delete_branch(git, branch)
    under = [layer["key"] for layer in story.stacked_on]
    feedback = {}
    if kept:
        feedback["verify_output"] = (f"An earlier try of this story was built on {', '.join(under)}, "
                                     f"which did not integrate ({why}); it is kept at {kept}. "
                                     "This try starts from the target as it is now.")
    with db.transaction() as s:
        if not transition_story(s, story.id, story.state, state=StoryState.PENDING, phase=None,
                                worktree=None, branch=None, base_sha=None, head_sha=None,
                                stacked_on=None, dev_attempts=0, review_cycles=0,
                                feedback=feedback, after_phase=None, human_fix=False,
                                port_block=None, wait_reason=None, reason=None, ended_at=None,
                                ready_at=None):
            return False  # it moved on meanwhile (a worker claimed it): next pass
        record(s, run_id, "story.restacked", story.key, was=story.state, stacked_on=under,
               reason=why, kept=kept)
    return True


def _keep(git, run_id: str, key: str, head: str) -> str:
    prefix = restacked_ref_prefix(run_id, key)
    listed = git.out("for-each-ref", "--format=%(objectname) %(refname)", prefix).splitlines()
    for line in listed:
        sha, _, ref = line.partition(" ")
        if sha == head:
            return ref
    ref = f"{prefix}{len(listed) + 1}"
    git.run("update-ref", ref, head, "0" * 40)
    return ref
