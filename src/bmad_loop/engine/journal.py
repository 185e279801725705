"""The journal: one row per thing that happened, in order. `bmad-loop journal` reads it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any, cast

from sqlalchemy import Row, Table, bindparam, select
from sqlalchemy.orm import Session

from ..db.database import insert_at_commit
from ..db.models import Event, utcnow
from ..db.database import Database
from ..git.runner import Git

__all__ = ["EventKind", "record", "events_after", "event_rows_after", "event_json"]


class EventKind(str, Enum):
    """Every kind of journal event, with what it means: the one registry `record` accepts.
    docs/cli.md's event table lists the same kinds (a test holds the two together)."""

    meaning: str  # what the kind means (docs/cli.md's event table)

    def __new__(cls, value: str, meaning: str = "") -> EventKind:
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member

    def __str__(self) -> str:
        return self.value

    RUN_CREATED = "run.created", "the run was enqueued, with its plan"
    RUN_WARNING = "run.warning", "a policy warning for this run"
    RUN_PAUSING = "run.pausing", "the run parks: running stories finish, then it pauses"
    RUN_PAUSED = "run.paused", "the run is paused for a human"
    RUN_STOPPING = "run.stopping", "a stop was asked for; the run settles at safe boundaries"
    RUN_STOPPED = "run.stopped", "the run stopped"
    RUN_RESUMED = "run.resumed", "the run was resumed"
    RUN_COMPLETED = "run.completed", "every story of the plan is settled"
    RUN_FAILED = "run.failed", "something no retry could fix ended the run"
    RUN_ABANDONED = "run.abandoned", "`bmad-loop abandon` ended the run for good"
    RUN_POLICY_RELOADED = ("run.policy_reloaded",
        "`resume --reload-policy` took the policy file again (the keys that changed)")
    GATE_REACHED = "gate.reached", "the next epic's gate is closed"
    FOOTPRINT_EXCLUSIVE = ("footprint.exclusive",
        "a story's footprint is missing, empty or invalid, so it runs alone")
    FOOTPRINT_DRIFT = "footprint.drift", "a story changed files outside its footprint"
    STORY_WAITING = "story.waiting", "what holds a pending story back changed"
    STORY_RESTACKED = "story.restacked", "a story on a stacked base was sent back for a fresh start"
    STORY_QUEUED = "story.queued", "a story was admitted and sent to the story workers"
    STORY_UNQUEUED = ("story.unqueued",
        "a queued story's message found its run no longer live; it waits again")
    STORY_STARTED = "story.started", "a worker took the story"
    STORY_PREPARED = "story.prepared", "the story's worktree and branch are ready"
    STORY_PHASE = "story.phase", "the story entered a phase of its worker"
    STORY_PUSHED = "story.pushed", "remote mode: the story branch is on the remote"
    STORY_READY = "story.ready", "the story's work is finished and waits for the lane"
    ATTEMPT_STARTED = "attempt.started", "an agent session started"
    ATTEMPT_FINISHED = "attempt.finished", "an agent session ended (state, exit code, duration)"
    AGENT_UNAVAILABLE = ("agent.unavailable",
        "an environment fault of the agent CLI; the attempt is not charged")
    AGENT_WAITING = "agent.waiting", 'the story waits out an agent limit (`on_limit = "wait"`)'
    USAGE_INVALID = "usage.invalid", "a custom command's usage file was refused"
    USAGE_MISSING = "usage.missing", "a session reported no tokens or cost while a budget is set"
    LOG_TRUNCATED = ("log.truncated",
        "a log passed `[limits] max_log_bytes`, or a write of it failed")
    VERIFY_PASSED = "verify.passed", "verification in the story worktree passed"
    VERIFY_FAILED = "verify.failed", "verification in the story worktree failed"
    VERIFY_RESTORED = ("verify.restored",
        "a repeated verify put the worktree back to the agent's recorded output")
    VERIFY_FLAKY = ("verify.flaky",
        "a verify command failed, then passed on a retry of the same tree (both logs)")
    SESSION_RESTORED = ("session.restored",
        "an agent session re-run after a crash or a stop started from its first run's start tree")
    REVIEW_APPROVED = "review.approved", "a review approved"
    REVIEW_CHANGES_REQUESTED = "review.changes_requested", "a review asked for changes"
    STORY_LEDGER_REVERTED = ("story.ledger_reverted",
        "an agent's edit to a lane-owned file was reverted")
    GUARD_REFUSED = "guard.refused", "the guard refused a write to the target"
    STORY_INTEGRATING = "story.integrating", "the lane took the story"
    STORY_BRANCH_MISMATCH = ("story.branch_mismatch",
        "the story's branch no longer holds the commit its row names")
    CANDIDATE_COMPOSED = "candidate.composed", "the lane composed a candidate"
    CANDIDATE_VERIFIED = "candidate.verified", "a candidate passed verification"
    CANDIDATE_VERIFY_FAILED = "candidate.verify_failed", "a candidate failed verification"
    CANDIDATE_CONFLICT = "candidate.conflict", "a story's work conflicts with the target"
    CANDIDATE_STALE = "candidate.stale", "the target moved under a candidate"
    CANDIDATE_SETTLED = "candidate.settled", "a merge rule settled a path of a candidate"
    CANDIDATE_REGENERATE_FAILED = ("candidate.regenerate_failed",
        "a `regenerate` rule's command failed")
    CANDIDATE_ABANDONED = "candidate.abandoned", "a speculative candidate was given up"
    CANDIDATE_REVERIFYING = ("candidate.reverifying",
        "a candidate's verification started again in a fresh lane process")
    CANDIDATE_REVERIFY_POLICY = ("candidate.reverify_policy",
        "`resume` dropped a verified candidate whose checks changed")
    STORY_UNSTACKED = "story.unstacked", "a given-up candidate's story is ready again"
    TARGET_ADVANCED = "target.advanced", "the target branch moved to a verified candidate"
    TARGET_MOVED = "target.moved", "the target moved outside bmad-loop while the lane worked"
    TARGET_ADOPTED = ("target.adopted",
        "`resume` adopted a target that moved while the run was paused")
    TARGET_CHECKED = ("target.checked",
        "the lane ran a candidate's failing command on the target itself (passed or failed)")
    TARGET_RED = ("target.red",
        "the target itself fails a verify command: no story blamed, the run pauses")
    REPAIR_REQUESTED = ("repair.requested",
        "the lane sent a story back to its agent: its candidate failed or did not compose")
    REPAIR_STARTED = ("repair.started",
        "bmad-loop merged the target into the story's worktree; the repair session follows")
    REPAIR_FINISHED = ("repair.finished",
        "a repair ended (cause and outcome: ready, again, escalated)")
    STORY_INTEGRATED = "story.integrated", "the story is on the target"
    STORY_HELD = "story.held", "the story waits for an operator's sign-off"
    STORY_APPROVED = "story.approved", "an operator approved the story"
    STORY_REJECTED = "story.rejected", "an operator rejected the story"
    STORY_ESCALATED = "story.escalated", "the story is parked for a human"
    STORY_BLOCKED = "story.blocked", "the story is blocked behind a parked one"
    STORY_SKIPPED = ("story.skipped",
        "the story was skipped (already done, or no story file to create)")
    STORY_CREATED = "story.created", "the create phase committed the story file"
    CREATE_FAILED = "create.failed", "a create attempt failed"
    CREATE_DISCARDED = ("create.discarded",
        "changes of the create agent other than the story file were discarded")
    STORY_INTERRUPTED = "story.interrupted", "a stop interrupted the story"
    STORY_RECOVERED = "story.recovered", "orphan recovery took the story back"
    STORY_RETRY = "story.retry", "the story is tried again (`resume` or `retry`)"
    STORY_HUMAN_FIX = "story.human_fix", "a human's fix on the story branch is taken"
    STORY_BASE_MOVED = ("story.base_moved",
        "the story's branch took in a newer target: its base moved to their merge base")
    STORY_WORKTREE_MISSING = ("story.worktree_missing",
        "the story's worktree is made again from its branch")
    FAULT_RETRY = "fault.retry", "a step met a transient fault and is tried again"
    GIT_CONFIG_CHANGED = "git.config_changed", "an agent session changed git's configuration or hooks"
    GIT_LOCK_WAITED = "git.lock_waited", "a git step waited for a lock another process held"
    GIT_STALE_LOCK_REMOVED = ("git.stale_lock_removed",
                              "a lock left by a dead git step of bmad-loop's own was removed")
    ROWS_CONTRADICTED = "rows.contradicted", "the rows say integrated what git does not have"
    LANE_ACQUIRED = "lane.acquired", "a lane consumer took the lane lease"
    LANE_FENCED = "lane.fenced", "a lane lost its lease and was refused"
    NOTIFY_SENT = "notify.sent", "a notification was sent"
    NOTIFY_FAILED = "notify.failed", "a notification could not be sent"


def record(session: Session, run_id: str, kind: EventKind | str, story: str | None = None,
           **data: Any) -> None:
    """Append an event inside the caller's transaction (never commits). Its row is written
    when the transaction commits, in order with the transaction's other events. A kind that is
    not an `EventKind` is a ValueError: the journal's vocabulary is the registry's."""
    kind = EventKind(kind).value
    insert_at_commit(session, _EVENTS, {"run_id": run_id, "ts": utcnow(), "kind": kind,
                                                "story": story, "data": _jsonable(data)})


def events_after(session: Session, run_id: str, after_seq: int = 0,
                 kinds: Iterable[EventKind | str] = (), story: str | None = None) -> list[Event]:
    query = select(Event).where(Event.run_id == run_id, Event.seq > after_seq)
    if kinds:
        query = query.where(Event.kind.in_(list(kinds)))
    if story:
        query = query.where(Event.story == story)
    return list(session.scalars(query.order_by(Event.seq)))


_EVENTS = cast(Table, Event.__table__)  # a mapped class's table is typed as any FromClause
# event_rows_after's statement, built once: a follower polls it.
_EVENTS_AFTER = (select(_EVENTS).where(_EVENTS.c.run_id == bindparam("run_id"),
                                       _EVENTS.c.seq > bindparam("after_seq"))
                 .order_by(_EVENTS.c.seq))


def event_rows_after(session: Session, run_id: str, after_seq: int = 0) -> list[Row[Any]]:
    """`events_after` as plain rows (seq, ts, kind, story, data as attributes): for a poll
    that only shows them, without the cost of ORM objects."""
    return list(session.connection().execute(_EVENTS_AFTER, {"run_id": run_id,
                                                              "after_seq": after_seq}))


def event_json(event: Event) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "ts": event.ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "kind": event.kind,
        "story": event.story,
        "data": event.data or {},
    }


def _jsonable(value: object) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def journal_git_locks(git: Git, db: Database, run_id: str, story: str | None = None) -> Git:
    """Have `git` journal the locks it waits for (`git.lock_waited`) and the stale ones of
    ours it removes (`git.stale_lock_removed`) in this run. Returns `git`."""
    def told(kind: EventKind) -> Callable[[str, str], None]:
        def callback(path: str, command: str) -> None:
            with db.transaction() as s:
                record(s, run_id, kind, story, path=path, command=command)
        return callback

    git.on_lock_wait = told(EventKind.GIT_LOCK_WAITED)
    git.on_stale_lock = told(EventKind.GIT_STALE_LOCK_REMOVED)
    return git
