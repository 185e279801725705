"""Lookahead at `max_parallel = 1`: the next story gets ready to start while the last one lands.

The sequential loop starts a story only once the one before it is integrated, on the target
that integration made. Its agent must still start there, but the steps before the agent need
not wait: the commit the target is about to take is known once the lane has composed (and
verified) the candidate. So, between the candidate's verdict and the advance (`Integrator.
between`), the lane admits the next story as it would right after the landing, and queues it
with that candidate as its base: `base_sha` is the candidate, `stacked_on` names the story
being landed. The worker claims it, makes its worktree and branch on the candidate (a parked worktree
taken, as for any new story), and then *waits* (`prepare_when_landed`) until the story under
it is integrated, before `story.prepared` is written:

- integrated with the head it was stacked on, and the run still running: `story.prepared` is
  written with the candidate, now the target, as its base, and `stacked_on` is cleared. From
  here on the rows are what the sequential loop writes, and the agent starts on the same tree.
- anything else (the landing failed or escalated, the target was moved by someone else, the
  run is pausing or stopping, `stop --now`): no agent has started, so the worktree and branch
  are removed and the story goes back to `pending` with a fresh start (`story.restacked` when
  the story under it did not land, `story.unqueued` otherwise). The lane dispatches it again
  as usual.

A crash while waiting leaves a worktree and a branch the row does not name yet, and a
`stacked_on` row: recovery queues the story again; its next claim goes on from that branch
(made on the candidate) and waits again, or the lane restacks it if the story under it did not
land, removing the leftovers by their names (restack.py).

Only a fresh story (no phase, no branch, nothing to carry forward) is started ahead, in local
worktree isolation with one branch per story, and not after a story with a `done_checkpoint`
or an operator sign-off, which must pause or wait before anything else starts.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from sqlalchemy import select

from ..db.models import Run, Story
from ..states import RunState, StoryState
from ..worktrees import delete_branch, remove_worktree
from .faults import crash_point
from .interruptions import close_running_attempts
from .journal import record
from .sessions import Heartbeat
from .stacking import stale_layer
from .transitions import transition_story
from .workspace import Prepared

__all__ = ["GaveBack", "waits_for_landing", "startable_ahead", "ahead_fields", "ring",
           "dispatch_ahead", "join_ahead", "prepare_when_landed"]

log = logging.getLogger(__name__)

# The longest wait between two looks at the rows when no ring comes (a lane in another process).
_MAX_POLL_S = 0.5
_FIRST_POLL_S = 0.02

# Rung by the lane after each integration step and each pause it asks for (in this process).
_rings = threading.Condition()
_rung = 0


class GaveBack(Exception):
    """The story went back to `pending` before its agent started (the rows say why)."""


def ring() -> None:
    """Wake the workers of this process that wait for a landing: look at the rows again."""
    global _rung
    with _rings:
        _rung += 1
        _rings.notify_all()


def _wait_for_ring(seen: int, timeout: float) -> int:
    with _rings:
        if _rung == seen:
            _rings.wait(timeout)
        return _rung


def waits_for_landing(story, policy) -> bool:
    """Was this story queued ahead of a landing (the only stacked base at max_parallel 1)?"""
    return bool(story.stacked_on) and policy.scm.max_parallel <= 1


def startable_ahead(row) -> bool:
    """A fresh story: nothing of it exists yet that its agent could find on another base."""
    return (row.phase is None and not row.branch and not row.worktree and not row.to_create
            and not row.human_fix)


def ahead_fields(landing, candidate_sha: str) -> dict:
    """The row fields of a story queued ahead of `landing`'s advance to `candidate_sha`."""
    return {"base_sha": candidate_sha,
            "stacked_on": [{"key": landing.key, "head": landing.head_sha}]}


def dispatch_ahead(lane, story, sha: str) -> None:
    """The lane at `max_parallel = 1`, `story`'s candidate `sha` verified and about to land:
    queue what admission would start right after the landing, to wait for it. Not after a
    checkpoint or a sign-off, which must pause or wait first. It runs in a thread of its own
    beside the advance (mostly git processes), which it must not delay; `join_ahead` waits
    for it. A failure here changes nothing the landing needs: the story is dispatched after
    it, as without lookahead."""
    if story.done_checkpoint or story.merge_class == "operator":
        return

    def queue_ahead():
        try:
            run, stories = lane._load()
            if run.state == RunState.RUNNING:
                landed = [row._replace(state=StoryState.INTEGRATED, port_block=None)
                          if row.id == story.id else row for row in stories]
                lane._dispatch(run, landed, ahead=(story, sha))
        except Exception:
            log.warning("could not queue the next story ahead of %s's landing", story.key,
                        exc_info=True)

    join_ahead(lane)
    lane.ahead_thread = threading.Thread(target=queue_ahead, daemon=True, name="bmad-lookahead")
    lane.ahead_thread.start()


def join_ahead(lane) -> None:
    """Wait for the lane's last `dispatch_ahead`, so its rows are read after what it queued."""
    thread, lane.ahead_thread = getattr(lane, "ahead_thread", None), None
    if thread is not None:
        thread.join()


def prepare_when_landed(worker, story, branch: str) -> Prepared:
    """The worktree of a story queued ahead, made on its base now; returned once the story
    under it has landed. Raises GaveBack when it will not land (see the module)."""
    ctx, claim = worker.ctx, worker.claim
    prepared = ctx.workspace.prepare(story, branch, story.base_sha)
    crash_point("worker.awaiting_landing")
    with Heartbeat(ctx, claim):  # the wait may outlast the lease (a long verification)
        why = _await_landing(ctx, claim, story)
    if why is not None:
        _give_back(ctx, claim, story, prepared.worktree, branch, *why)
    return prepared


def _await_landing(ctx, claim, story) -> tuple[str, dict] | None:
    """None once every story under it is integrated with the head it was stacked on and the
    run still runs; else (event kind, its data) for giving the story back."""
    keys = [layer["key"] for layer in story.stacked_on]
    columns = select(Story.key, Story.seq, Story.state, Story.head_sha, Story.reason,
                     Story.integrated_sha)
    poll, seen = _FIRST_POLL_S, _rung
    while True:
        with ctx.db.read() as s:
            run_state = s.scalar(select(Run.state).where(Run.id == ctx.run_id))
            rows = {r.key: r for r in s.execute(columns.where(Story.run_id == ctx.run_id,
                                                              Story.key.in_(keys)))}
        why = stale_layer(story, rows)
        if why is not None:
            return "story.restacked", {"stacked_on": keys, "reason": why, "kept": None}
        if run_state != RunState.RUNNING or claim.stop_event.is_set():
            return "story.unqueued", {"run_state": run_state, "reason": "the run stopped "
                                      "running before the story under it landed"}
        if all(rows[k].state == StoryState.INTEGRATED for k in keys):
            landed = rows[keys[-1]].integrated_sha
            if landed != story.base_sha:  # recomposed on a target someone else moved
                return "story.restacked", {"stacked_on": keys, "kept": None, "reason": (
                    f"{keys[-1]} landed as {(landed or '?')[:12]}, not as the candidate "
                    f"{story.base_sha[:12]} this story was queued on")}
            return None
        seen = _wait_for_ring(seen, poll)
        poll = min(poll * 2, _MAX_POLL_S)


def _give_back(ctx, claim, story, worktree, branch: str, kind: str, data: dict) -> None:
    """Nothing of the story started: remove its worktree and branch (made on a base that is
    not the target), then hand it back as a fresh `pending` story (the lane dispatches it
    again)."""
    remove_worktree(ctx.git, Path(worktree))
    delete_branch(ctx.git, branch)
    with ctx.db.transaction() as s:
        row = claim.own(s)
        if row.session is not None:
            close_running_attempts(s, ctx.run_id, row)
        if transition_story(s, row.id, StoryState.WORKING, state=StoryState.PENDING, phase=None,
                            base_sha=None, stacked_on=None, port_block=None, heartbeat_at=None,
                            wait_reason=None):
            record(s, ctx.run_id, kind, story.key, was=StoryState.WORKING, **data)
    raise GaveBack(data["reason"])
