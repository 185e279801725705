"""The body of one `stories` task: claim the story row and its lease, walk its worker (walk.py)
from the row's phase, then wake the lane and give the worktree back.

A duplicate message finds the story claimed and returns. What ends the walk decides what
follows: escalated (a notification), a fault that persisted or an agent that cannot work (the
story back in line, the run paused), taken back while stalled (nothing more is written), a stop
(back in line), anything else (escalated as an internal error, the work kept). A walk cut short
hands the story back and closes the sessions left marked running as interrupted (uncounted).
"""
from __future__ import annotations

import logging
import traceback
from typing import TYPE_CHECKING, Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from ...db.models import Run, Story, utcnow, Attempt
from ...errors import StopRequested
from ...states import Phase, RunState, StoryState, AttemptState
from .. import leases
from .agentpause import PauseRun, pause_run
from .context import Claim, Fenced, story_context
from ..crashpoints import crash_point
from ..journal import EventKind, record
from ..notify import notify
from ..retry import FaultPersisted, pause_for_fault, retrying
from ..runrows import run_policy
from ..transitions import transition_story
from ..verification.record import drop_records
from .sessions import drop_session_records
from .walk import StoryWorker, quietly
from ..workspace.pool import sweep_landed
from ..workspace.pool import announce_park
from ...db.database import Database
from .context import StoryContext

if TYPE_CHECKING:
    from ...queue.tasks import Tasks
    from ..project import Project

# What `_walk` ends with: (the story's lease gone, its work finished, what ends the
# announcement of its worktree's park, or None).
WalkEnd = tuple[bool, bool, Callable[[], None] | None]

__all__ = ["work", "release_after_stop", "interrupt_open_attempts", "close_running_attempts"]


log = logging.getLogger(__name__)


def work(project: Project, tasks: Tasks, run_id: str, story_id: int,
         on_claim: Callable[[str, str], None] | None = None) -> None:
    """Task body: claim the story, do its work, wake the lane. `on_claim(run_id, key)` is
    called once the claim is committed (`bmad-loop worker` prints a line)."""
    db = project.db
    owner = leases.owner_id(f"story{story_id}")
    claimed = _claim(project, run_id, story_id, owner)
    if claimed is None:
        return
    story, ctx, claim = claimed
    if on_claim is not None:
        on_claim(run_id, ctx.key)
    tries: list[StoryWorker] = []  # the walkers, one per try
    lease_gone, finished = False, False
    parked: Callable[[], None] | None = None  # ends the park's announcement
    try:
        lease_gone, finished, parked = _walk(ctx, claim, story, tries)
    finally:
        if not lease_gone:
            quietly(leases.release, db, leases.story_lease_name(story_id), owner)
        quietly(tasks.enqueue_lane, run_id)  # lost: the consumers' watchdog wakes the lane
    try:
        if finished:
            # Its work is committed: the verify record goes, whatever the lane has made of the
            # story meanwhile (it may have integrated or escalated it already).
            quietly(drop_records, ctx)
            if tries[-1].repair.finished:
                quietly(tries[-1].repair.drop_ref)
            quietly(drop_session_records, ctx)
            # Beside the lane's work (which may park it first).
            _release_if_ready(ctx, claim, tries[-1].last_row)
    finally:
        if parked:
            parked()
    if not ctx.target.lane_removes_story_worktrees:
        _sweep(project, run_id)


def _claim(project: Project, run_id: str, story_id: int,
           owner: str) -> tuple[Story, StoryContext, Claim] | None:
    """(story, context, claim) once this worker holds the story, or None: the run is not live
    (the story goes back in line) or the message is a duplicate."""
    db = project.db
    with db.transaction() as s:
        run = s.get(Run, run_id)
        if run is None:
            return None
        if run.state not in (RunState.RUNNING, RunState.PAUSING):
            # Stopped or paused before a worker picked it up: back in line, nothing started.
            if transition_story(s, story_id, StoryState.QUEUED, state=StoryState.PENDING,
                                port_block=None):
                record(s, run_id, EventKind.STORY_UNQUEUED, s.get_one(Story, story_id).key,
                       run_state=run.state)
            return None
        now = utcnow()
        # Read, then claimed by one guarded UPDATE that the row takes as written: two racing
        # claims read the same generation, and only the one that finds the story queued wins.
        story = s.get_one(Story, story_id)
        first_start = story.phase is None  # it enters prepare here, as `_enter_phase` would
        if not transition_story(s, story_id, StoryState.QUEUED, state=StoryState.WORKING,
                                host=project.host, heartbeat_at=now, started_at=now,
                                claim=story.claim + 1, phase=story.phase or Phase.PREPARE):
            return None  # someone else has it, or it is no longer queued: a duplicate message
        generation = story.claim  # the claim's new generation, as the UPDATE wrote it
        record(s, run_id, EventKind.STORY_STARTED, story.key, phase=story.phase, host=project.host)
        if first_start:
            record(s, run_id, EventKind.STORY_PHASE, story.key, phase=Phase.PREPARE)
        if story.session is not None:  # a session ever began: only a lost worker's is still open
            close_running_attempts(s, run_id, story)
        policy = run_policy(run)
        ctx = story_context(project, run, story, policy)
        token = leases.take_in(s, leases.story_lease_name(story_id), owner, policy.leases.ttl_s)
    return story, ctx, Claim(db, run_id, story_id, generation, owner, token, policy.leases.ttl_s)


def _walk(ctx: StoryContext, claim: Claim, story: Story, tries: list[StoryWorker]) -> WalkEnd:
    """Walk the story (retried over transient faults); (lease gone, finished, parked). A fault,
    a pause, a stop or a bug each leave the story and the run where a human can go on."""
    db, run_id, story_id, generation = ctx.db, ctx.run_id, claim.story_id, claim.generation
    policy = ctx.policy

    def walk_once() -> str | None:
        if tries:  # a try cut short by a fault left its session open (the claim closed older ones)
            interrupt_open_attempts(claim)
        claimed = story if not tries else None  # as the claim left it; a retry reads it again
        tries.append(StoryWorker(ctx, claim))
        return tries[-1].walk(claimed)

    try:
        escalated = retrying(walk_once, db=db, run_id=run_id, story=ctx.key, what=f"story {ctx.key}")
        lease_gone = claim.lease_dropped  # by the walk's last transaction, which committed
        crash_point("worker.after_ready")
        if escalated:
            notify(db, policy, run_id, EventKind.STORY_ESCALATED, story=ctx.key, reason=escalated)
            return lease_gone, False, None
        return lease_gone, True, announce_park()  # the lane is woken first, then the worktree parked
    except FaultPersisted as exc:
        # Not the story's fault: it goes back in line, its phase and work kept, and the run pauses.
        release_after_stop(db, run_id, story_id, generation, fault=exc.fault.describe())
        if pause_for_fault(db, run_id, exc.fault, exc.attempts, story=ctx.key):
            notify(db, policy, run_id, EventKind.RUN_PAUSED, story=ctx.key, reason=exc.fault.describe())
    except PauseRun as exc:  # the agent cannot work, or a budget is spent (agentpause.py)
        release_after_stop(db, run_id, story_id, generation, fault=exc.reason)
        if pause_run(db, run_id, ctx.key, exc):
            notify(db, policy, run_id, EventKind.RUN_PAUSED, story=ctx.key, reason=exc.reason)
    except Fenced:
        log.warning("story %s was taken back while this worker stalled; it stops here", story_id)
    except StopRequested:
        release_after_stop(db, run_id, story_id, generation)
    except Exception as exc:  # a bug or an environment failure: keep the work, tell a human
        log.exception("story %s failed unexpectedly", story_id)
        _escalate_internal_error(db, run_id, story_id, generation, exc)
    return False, False, None


def _escalate_internal_error(db: Database, run_id: str, story_id: int, generation: int,
                             exc: Exception) -> None:
    with db.transaction() as s:
        story = s.get_one(Story, story_id)
        if story.state == StoryState.WORKING and story.claim == generation:
            story.state, story.reason = StoryState.ESCALATED, f"internal error: {exc}"
            story.ended_at = utcnow()
            record(s, run_id, EventKind.STORY_ESCALATED, story.key, reason=story.reason,
                   traceback=traceback.format_exc()[-4000:])


def _release_if_ready(ctx: StoryContext, claim: Claim, known: Story | None) -> None:
    """A ready story's work is all on its branch: its worktree goes to the pool, so a story
    dispatched into the freed slot takes it instead of checking out a new one. (Should its
    integration escalate, the lane gives it one back; should the lane get there first, it
    parks it and this park finds nothing to do.)"""
    if claim.state() == StoryState.READY:  # one column: worktree and branch are known
        quietly(ctx.workspace.release_worktree, known if known is not None else claim.load())


def _sweep(project: Project, run_id: str) -> None:
    """A story host removes its own landed worktrees (the lane, in another clone, cannot)."""
    try:
        sweep_landed(project, run_id)
    except Exception:  # debris only: `cleanup` on this host removes what is left
        log.warning("could not remove landed worktrees of run %s", run_id, exc_info=True)


def release_after_stop(db: Database, run_id: str, story_id: int, generation: int,
                       fault: str | None = None) -> None:
    """A stop (or a persistent fault) reached this story: hand it back as pending, its phase
    and worktree kept."""
    with db.transaction() as s:
        story = s.get_one(Story, story_id)
        if story.claim == generation and transition_story(s, story_id, StoryState.WORKING,
                                                          state=StoryState.PENDING,
                                                          heartbeat_at=None):
            data = {"fault": fault} if fault else {}
            record(s, run_id, EventKind.STORY_INTERRUPTED, story.key, phase=story.phase, **data)


def interrupt_open_attempts(claim: Claim) -> None:
    """Close this story's sessions still marked running (uncounted): only ours can be, since we
    hold its claim, and a retried step starts a new one."""
    with claim.db.transaction() as s:
        close_running_attempts(s, claim.run_id, claim.own(s))


def close_running_attempts(s: Session, run_id: str, row: Story) -> None:
    for att in s.scalars(select(Attempt).where(Attempt.story_id == row.id,
                                               Attempt.state == AttemptState.RUNNING)):
        att.state, att.counted, att.ended_at = AttemptState.INTERRUPTED, False, utcnow()
        record(s, run_id, EventKind.ATTEMPT_FINISHED, row.key, phase=att.phase, attempt=att.number,
               state=AttemptState.INTERRUPTED, counted=False, why="retried after a fault")
