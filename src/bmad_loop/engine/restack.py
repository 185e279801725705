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

A story still `queued` just goes back to `pending` (nothing started); a `working` one is left to
finish its story and is restacked once it is `ready` (or escalated).
"""

from __future__ import annotations

from pathlib import Path

from ..db.models import Story
from ..states import StoryState
from ..worktrees import delete_branch, remove_worktree
from .journal import record
from .stacking import stale_layer
from .transitions import transition_story

__all__ = ["restack_stale", "restacked_ref_prefix"]

# The states a stale stacked story is restacked from (a working one finishes first).
_RESTACKABLE = (StoryState.PENDING, StoryState.QUEUED, StoryState.READY, StoryState.ESCALATED)


def restacked_ref_prefix(run_id: str, key: str) -> str:
    return f"refs/bmad-loop/{run_id}/restacked/{key}/"


def restack_stale(db, git, run_id: str, stories: list[Story]) -> bool:
    """Restack every stacked story whose base no longer stands; True when one was."""
    rows = {s.key: s for s in stories}
    changed = False
    for story in stories:
        if not story.stacked_on or story.state not in _RESTACKABLE:
            continue
        why = stale_layer(story, rows)
        if why is not None:
            changed |= _restack(db, git, run_id, story, why)
    return changed


def _restack(db, git, run_id: str, story: Story, why: str) -> bool:
    kept = None
    if story.state != StoryState.QUEUED:
        head = story.head_sha or (git.rev(f"refs/heads/{story.branch}") if story.branch else None)
        if head and head != story.base_sha:
            kept = _keep(git, run_id, story.key, head)
        if story.worktree:
            remove_worktree(git, Path(story.worktree))
        if story.branch:
            delete_branch(git, story.branch)
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
