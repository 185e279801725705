"""Operator actions on a run: find it, resume it, stop it, approve a story, recover on start.

Recovery never runs work directly: it puts rows back into a claimable state and sends the
wake-up messages, and the normal claim takes it from there.

**Verdicts that no longer hold** are dropped on `resume` when the checks or the target changed.
A `verified` candidate waiting to advance (or for sign-off) was verified by the run's checks as
they were, on the target as it was. When `resume --reload-policy` changes what verification
runs (`reverify_reason`), or `resume` adopts a target someone else moved, such a verdict says
nothing any more: every candidate still `verified` is given up (`abandoned`, journaled
`candidate.reverify_policy`) and its story goes back to `ready`, so the lane composes and
verifies it again under the checks in force. An `advancing` candidate is left alone (its
advance may have happened); a `verifying` one is verified again anyway, by the new checks.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, Callable

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from ...db.models import Run, Story, utcnow, Candidate
from ...errors import Ambiguous, NotFound, StateError
from ...states import (
    RUN_ABANDONABLE,
    RUN_ONE_PER_TARGET,
    RUN_LIVE,
    RUN_RESUMABLE,
    RUN_TERMINAL,
    STORY_DONE,
    CandidateState,
    RunState,
    StopMode,
    StoryState,
)
from ...bmad.selection import resolve_story_ref
from ...policy import identity_keys, load_policy, policy_from_dict
from .. import leases
from ..verification.targetcheck import forget_failed
from ..repairs import in_repair
from ..escalation import ENVIRONMENTAL, integration_cause
from ..journal import EventKind, record
from .ownership import save_run, target_check
from ..redo import retry_story, to_dev, to_human_fix, to_ready, to_repair
from ..recovery import ever_spawned, recover_orphans
from ..runrows import run_policy, stories_of
from ..transitions import transition_run, transition_story

if TYPE_CHECKING:
    from ...policy import Policy
    from ...queue.tasks import Tasks
    from ..project import Project

__all__ = ["find_run", "driver_of", "refuse_if_driven", "resume", "stop", "approve", "reject",
           "retry", "reconcile", "recover_live_runs", "requeue_run", "reverify_reason",
           "drop_verified"]


def find_run(session: Session, project: Project, ref: str | None) -> Run:
    """A run by id, unique prefix or unique suffix; the newest run when ref is None."""
    query = select(Run).where(Run.project == project.key)
    if ref is None:
        run = session.scalars(query.order_by(Run.created_at.desc(), Run.id.desc())).first()
        if run is None:
            raise NotFound(f"{project.root}: no runs yet")
        return run
    matches = list(session.scalars(query.where(or_(Run.id == ref, Run.id.startswith(ref),
                                                    Run.id.endswith(ref)))))
    exact = [r for r in matches if r.id == ref]
    if exact:
        return exact[0]
    if not matches:
        raise NotFound(f"no run matches '{ref}'")
    if len(matches) > 1:
        raise Ambiguous(f"run '{ref}' is ambiguous: " + ", ".join(sorted(r.id for r in matches)))
    return matches[0]


def reloaded_policy(run: Run, current: Policy) -> tuple[dict[str, Any], list[str]]:
    """The run's snapshot with every key taken from `current` (the policy file now) except
    its identity; the new snapshot and the keys that changed."""
    old, new = dict(run.policy), current.to_dict()
    for section, keys in identity_keys().items():  # the settings flagged identity=True
        new[section] = {**new.get(section, {}),
                        **{k: old[section][k] for k in keys if k in old.get(section, {})}}
    changed = sorted(f"{section}.{key}" for section in set(old) | set(new)
                     for key in set(old.get(section, {})) | set(new.get(section, {}))
                     if old.get(section, {}).get(key) != new.get(section, {}).get(key))
    policy_from_dict(new, source=f"run {run.id} reloaded policy", env={})  # validated again
    return new, changed


def resume(project: Project, tasks: Tasks, ref: str | None, *, reload_policy: bool = False) -> Run:
    """Continue a paused, stopped, failed or crashed run: same plan, scope and target.

    `reload_policy`: take the current policy file for every key but the run's identity
    (the policy settings flagged `identity`), e.g. to fix the mistake that paused it."""
    db = project.db
    current: Policy | None = None
    if reload_policy:
        current = load_policy(project.home)
    with db.read() as s:
        target_branch = find_run(s, project, ref).target_branch
    # Another database's live run on the target refuses; the record is rewritten under the lock.
    with target_check(project, target_branch) as foreign, db.transaction() as s:
        run = find_run(s, project, ref)
        if run.state not in RUN_RESUMABLE:
            raise StateError(f"run {run.id} is {run.state}: nothing to resume")
        refuse_if_driven(s, project, run)
        other = s.scalars(select(Run).where(Run.target_branch == run.target_branch,
                                            Run.project == run.project, Run.id != run.id,
                                            Run.state.in_(RUN_ONE_PER_TARGET))).first()
        if other is not None:
            raise StateError(f"run {other.id} is {other.state} on {run.target_branch}: "
                             "stop it before resuming this one")
        stale_checks = None
        if current is not None:
            snapshot, changed = reloaded_policy(run, current)
            run.policy = snapshot  # the columns projected from it follow
            record(s, run.id, EventKind.RUN_POLICY_RELOADED, changed=changed)
            stale_checks = reverify_reason(changed)
        policy = run_policy(run)
        previous = run.state
        gates = list(run.gates_passed or [])
        if run.gate_epic is not None and run.gate_epic not in gates:
            gates.append(run.gate_epic)
        run.state, run.reason, run.stop_mode, run.gate_epic = RunState.RUNNING, None, None, None
        run.gates_passed, run.ended_at = gates, None
        git = project.git(policy)
        git.repin_hooks()  # a human is in charge: the project's named hooks as they are now
        target = project.target(git, run.target_branch)
        target_now = target.sha()
        adopted = _adopt_target(s, run, target_now)
        forget_failed(s, run.id)  # a red target is checked again (verification/targetcheck.py)
        for story in stories_of(s, run.id):
            _reset_for_resume(s, target.story_head, run, story)
        if stale_checks or adopted:  # verdicts given under other checks, or on another target
            drop_verified(s, run.id, stale_checks or "the target moved (adopted on resume)",
                          target_now)
        record(s, run.id, EventKind.RUN_RESUMED, previous=previous, gates_passed=gates)
        for warning in foreign.warnings:
            record(s, run.id, EventKind.RUN_WARNING, message=warning)
        save_run(project, run)
        run_id = run.id
    requeue_run(project, tasks, run_id, stale_after=None)
    with db.transaction() as s:
        return s.get_one(Run, run_id)


def driver_of(session: Session, project: Project, run: Run) -> leases.Holder | None:
    """The live holder of the project's lane lease (`leases.Holder`) while `run` is live and
    another process holds it; None otherwise. The same heartbeats `status` lists."""
    if run.state not in RUN_LIVE:
        return None
    holder = leases.holder_of(session, project.lane_lease_name)
    if holder is None or holder.owner == leases.owner_id("lane"):
        return None  # nobody drives it, or this very process does
    return holder


def refuse_if_driven(session: Session, project: Project, run: Run) -> None:
    """`resume` of a run another process drives would make two drivers of one run."""
    holder = driver_of(session, project, run)
    if holder is not None:
        raise StateError(f"run {run.id} is {run.state} and driven by the lane of {holder} "
                         f"(heartbeat {holder.renewed_at:%H:%M:%S} UTC): watch it with "
                         f"`bmad-loop status --watch` or `bmad-loop attach`, or "
                         f"`bmad-loop stop {run.id}` first")


def _adopt_target(session: Session, run: Run, target_now: str | None) -> bool:
    """Resuming accepts the target as it is now: a move someone else made while the run was
    parked (the lane paused on it, or a human fixed something) becomes the lane's baseline.
    True when it had moved."""
    if target_now and target_now != run.head_sha:
        record(session, run.id, EventKind.TARGET_ADOPTED, old=run.head_sha, new=target_now)
        run.head_sha = target_now
        return True
    return False


def _reset_for_resume(session: Session, branch_head_of: Callable[[str], str | None], run: Run,
                      story: Story) -> None:
    if story.state in (StoryState.ESCALATED, StoryState.BLOCKED):
        branch_head = branch_head_of(story.branch) if story.branch else None
        human_fix = bool(branch_head and story.head_sha and branch_head != story.head_sha)
        cause = (integration_cause(session, run.id, story.key)
                 if story.state == StoryState.ESCALATED else None)
        if human_fix and branch_head:  # (human_fix holds only with a branch head)
            # A human changed the branch: verify and integrate it without the agent.
            to_human_fix(session, run.id, story, branch_head, by="resume")
        elif cause in ENVIRONMENTAL and branch_head and branch_head == story.head_sha:
            # Nothing of the story failed: the same commit is integrated again, no agent.
            to_ready(session, run.id, story, by="resume", cause=cause, reason=story.reason)
        elif in_repair(story) and branch_head and branch_head == story.head_sha:
            # Its repairs ran out: repaired again, from a fresh merge, with a fresh budget.
            to_repair(session, run.id, story, run.head_sha, by="resume", reason=story.reason)
        else:
            to_dev(session, run.id, story, by="resume", reason=story.reason)
    # A `working` story is left alone: if its worker died, its lease says so and orphan
    # recovery re-queues it; if it is alive (another host), it finishes.


def requeue_run(project: Project, tasks: Tasks, run_id: str,
                stale_after: dt.timedelta | None) -> int:
    """Send wake-ups for a live run: orphaned and queued stories, and the lane.

    `stale_after` None (resume) re-sends every queued story; otherwise only orphans found by
    their leases are taken back first (consumer start after a crash).
    """
    with project.db.transaction() as s:
        ttl = run_policy(s.get_one(Run, run_id)).leases.ttl_s
        spawned = ever_spawned(s, run_id)  # a run just enqueued has nothing to sweep for
    recover_orphans(project.db, tasks, run_id, ttl, spawned=spawned)
    resent: list[int] = []
    with project.db.transaction() as s:
        resent = [story.id for story in stories_of(s, run_id) if story.state == StoryState.QUEUED]
    for story_id in resent:
        tasks.enqueue_story(run_id, story_id)
    tasks.enqueue_lane(run_id)
    return len(resent)


def recover_live_runs(project: Project, tasks: Tasks, stale_after: dt.timedelta) -> list[str]:
    """On consumer start: re-queue runs that are running, pausing or stopping."""
    with project.db.transaction() as s:
        ids = [r.id for r in s.scalars(select(Run).where(
            Run.project == project.key, Run.state.in_(RUN_LIVE)))]
    for run_id in ids:
        requeue_run(project, tasks, run_id, stale_after)
    return ids


def stop(project: Project, tasks: Tasks, ref: str | None, now: bool = False) -> Run:
    with project.db.transaction() as s:
        run = find_run(s, project, ref)
        if run.state in RUN_TERMINAL | {RunState.FAILED}:
            raise StateError(f"run {run.id} is {run.state}: nothing to stop")
        if run.state in (RunState.PAUSED, RunState.STOPPED):
            run.state, run.reason = RunState.STOPPED, run.reason or "stopped by operator"
            record(s, run.id, EventKind.RUN_STOPPED, reason="stopped by operator", now=now)
            save_run(project, run)
            return run
        mode = StopMode.NOW if now else StopMode.GRACEFUL
        transition_run(s, run.id, RUN_LIVE, state=RunState.STOPPING,
                       stop_mode=mode, reason=f"stop requested ({mode})")
        record(s, run.id, EventKind.RUN_STOPPING, mode=mode)
        run_id = run.id
        settled = _settle_idle_stop(s, run_id)
    with project.db.read() as s:
        save_run(project, s.get_one(Run, run_id))
    if not settled:
        tasks.enqueue_lane(run_id)
    with project.db.transaction() as s:
        return s.get_one(Run, run_id)


def _settle_idle_stop(session: Session, run_id: str) -> bool:
    """A stopping run that nothing is working on stops at once: no lane tick needed (none may
    be running: `enqueue` then `stop` with no consumer). Stories queued but not yet claimed go
    back in line; a worker that claims one first keeps the run stopping until it is done."""
    stories = stories_of(session, run_id)
    if any(st.state in (StoryState.WORKING, StoryState.INTEGRATING) for st in stories):
        return False
    for st in stories:
        if st.state == StoryState.QUEUED and not transition_story(
                session, st.id, StoryState.QUEUED, state=StoryState.PENDING, port_block=None):
            return False
    if not transition_run(session, run_id, RunState.STOPPING, state=RunState.STOPPED,
                          reason="stopped by operator"):
        return False
    record(session, run_id, EventKind.RUN_STOPPED, reason="stopped by operator", settled="at once")
    return True


def abandon(project: Project, ref: str | None, reason: str | None = None) -> Run:
    """End a run for good (`abandoned`); its branches and evidence stay per `keep_failed`."""
    with project.db.transaction() as s:
        run = find_run(s, project, ref)
        if run.state not in RUN_ABANDONABLE:
            hint = "stop it first" if run.state in RUN_LIVE else "it has ended already"
            raise StateError(f"run {run.id} is {run.state}: {hint}")
        previous = run.state
        run.state, run.ended_at = RunState.ABANDONED, utcnow()
        run.reason = f"abandoned: {reason}" if reason else "abandoned by operator"
        record(s, run.id, EventKind.RUN_ABANDONED, previous=previous, reason=reason)
        save_run(project, run)
        return run


def approve(project: Project, tasks: Tasks, ref: str | None, story_key: str) -> Story:
    """Spec approval before dev, or sign-off of a held (merge_class = operator) candidate."""
    with project.db.transaction() as s:
        run = find_run(s, project, ref)
        story = _story_by_key(s, run, story_key)
        if story.state in STORY_DONE:
            raise StateError(f"run {run.id}: story {story.key} is {story.state}: nothing to approve")
        held = story.state == StoryState.HELD
        if held:
            story.signed_off = True
            story.state, story.reason = StoryState.READY, None  # the lane advances its verified candidate
        else:
            story.approved = True
        record(s, run.id, EventKind.STORY_APPROVED, story.key, sign_off=held)
        run_id = run.id
    tasks.enqueue_lane(run_id)
    return story


def reject(project: Project, tasks: Tasks, ref: str | None, story_key: str, reason: str) -> Story:
    """Refuse a held candidate: the story becomes escalated with the operator's reason."""
    from ...db.models import Candidate

    with project.db.transaction() as s:
        run = find_run(s, project, ref)
        story = _story_by_key(s, run, story_key)
        if story.state != StoryState.HELD:
            raise StateError(f"run {run.id}: story {story.key} is {story.state}, not held: "
                             "only a held candidate can be rejected")
        story.state, story.reason, story.ended_at = StoryState.ESCALATED, f"rejected by operator: {reason}", utcnow()
        for cand in s.scalars(select(Candidate).where(Candidate.story_id == story.id,
                                                      Candidate.state == CandidateState.VERIFIED)):
            cand.state, cand.reason = CandidateState.ABANDONED, f"rejected: {reason}"
        record(s, run.id, EventKind.STORY_REJECTED, story.key, reason=reason)
        record(s, run.id, EventKind.STORY_ESCALATED, story.key, reason=story.reason, phase="sign-off")
        run_id = run.id
    tasks.enqueue_lane(run_id)
    return story


def retry(project: Project, tasks: Tasks, ref: str | None, story_key: str,
          start: str) -> tuple[Run, Story]:
    """A person's explicit redo of one story from `start` (redo.FROM_STEPS); see redo.py."""
    with project.db.transaction() as s:
        run = find_run(s, project, ref)
        story = _story_by_key(s, run, story_key)
        target = project.target(project.git(run_policy(run)), run.target_branch)
        wake = retry_story(s, target, run, story, start)
        run_id = run.id
    if wake:
        tasks.enqueue_lane(run_id)
    with project.db.read() as s:
        return s.get_one(Run, run_id), s.get_one(Story, story.id)


VERDICTS = {
    "integrated": "integrated", "skipped": "integrated", "held": "held",
    "escalated": "parked", "blocked": "parked", "failed": "parked",
}


def reconcile(project: Project, ref: str | None) -> tuple[dict[str, Any], int]:
    """One verdict per story, changing nothing; exit 4 if any is open, else 3 if any is held
    or parked, else 0."""
    with project.db.transaction() as s:
        run = find_run(s, project, ref)
        rows = [{"key": st.key, "seq": st.seq, "state": st.state,
                 "verdict": VERDICTS.get(st.state, "open"),
                 "reason": st.reason if st.state in VERDICTS and st.state not in (StoryState.INTEGRATED,) else None}
                for st in stories_of(s, run.id)]
        report: dict[str, Any] = {"run": run.id, "state": run.state, "stories": rows}
    verdicts = {r["verdict"] for r in rows}
    code = 4 if "open" in verdicts else 3 if verdicts & {"held", "parked"} else 0
    report["exit_code"] = code
    return report, code


def _story_by_key(session: Session, run: Run, key: str) -> Story:
    stories = stories_of(session, run.id)
    found = resolve_story_ref(stories, key, f"run {run.id}")
    return next(s for s in stories if s.key == found)


# Reloaded keys that change what a candidate's verification runs or sees (`verify.parallel`
# only says how many run at once).
_VERIFY_SECTIONS = ("verify.", "resources.ports")
_NOT_A_CHECK = ("verify.parallel",)


def reverify_reason(changed: list[str]) -> str | None:
    """Why verdicts given before a policy reload that changed `changed` no longer hold."""
    keys = [k for k in changed if k.startswith(_VERIFY_SECTIONS) and k not in _NOT_A_CHECK]
    return f"the reloaded policy changed {', '.join(keys)}" if keys else None


def drop_verified(session: Session, run_id: str, reason: str, target_now: str | None) -> list[str]:
    """Give up the run's `verified` candidates; their stories back to `ready`. Their keys.
    One the target points at already (advanced, its row not written: a crash) is kept."""
    keys: list[str] = []
    cands = list(session.scalars(select(Candidate).where(
        Candidate.run_id == run_id, Candidate.state == CandidateState.VERIFIED)
        .order_by(Candidate.id)))
    for cand in cands:
        if target_now is not None and cand.candidate_sha == target_now:
            continue
        story = session.get_one(Story, cand.story_id)
        cand.state, cand.ended_at = CandidateState.ABANDONED, utcnow()
        cand.reason = f"verified before {reason}: verified again"
        transition_story(session, story.id, (StoryState.INTEGRATING, StoryState.HELD,
                                             StoryState.READY),
                         state=StoryState.READY, signed_off=False)
        record(session, run_id, EventKind.CANDIDATE_REVERIFY_POLICY, story.key, attempt=cand.attempt,
               candidate_sha=cand.candidate_sha, reason=reason)
        keys.append(story.key)
    return keys
