"""What a story worker does after its story's last transaction: park its worktree, sweep.

These steps only tidy up. The story's outcome is written before them, and recovery or
`cleanup` covers any of them that fails.
"""

from __future__ import annotations

import logging

from ..states import StoryState
from .worktree_pool import expect_park

__all__ = ["announce_park", "release_if_ready", "quietly", "sweep"]

log = logging.getLogger(__name__)


def announce_park(ctx):
    """Say, before the lane is woken, that this worker will park its worktree: a story the lane
    queues meanwhile (lookahead.py) waits for that worktree instead of checking out anew."""
    return expect_park(ctx.layout) if ctx.workspace.prepares_ahead else None


def release_if_ready(ctx, claim, announced=None) -> None:
    """A ready story's work is all on its branch: its worktree goes to the pool, so a story
    dispatched into the freed slot takes it instead of checking out a new one. (Should its
    integration escalate, the lane gives it one back; should the lane get there first, it
    parks it and this park finds nothing to do.)"""
    try:
        story = claim.load()
        if story.state == StoryState.READY:
            quietly(ctx.workspace.release_worktree, story)
    finally:
        if announced is not None:
            announced.done()


def quietly(step, *args) -> None:
    """A closing step whose failure (a full disk under the queue) must not hide the outcome."""
    try:
        step(*args)
    except Exception:
        log.warning("%s failed; recovery covers it", getattr(step, "__name__", step), exc_info=True)


def sweep(project, run_id: str) -> None:
    """A story host removes its own landed worktrees (the lane, in another clone, cannot)."""
    from .cleanup import sweep_landed  # cleanup imports the worker's neighbours; keep it lazy
    try:
        sweep_landed(project, run_id)
    except Exception:  # debris only: `cleanup` on this host removes what is left
        log.warning("could not remove landed worktrees of run %s", run_id, exc_info=True)
