"""Speculative candidates: several verified at once, the target advanced through them in order.

With `[verify] commands` and a depth d = `[verify] parallel` (default `[scm] max_parallel`)
above 1, the lane does not wait for one candidate's verification before it composes the next.
It keeps a *stack* of up to d candidates in plan order — C1 = target + S1, C2 = C1 + S2, … —
each checked out in its own candidate worktree and verified by a thread of the lane's process,
all at once. The target advances through them one by one, each by compare-and-swap from its
predecessor, and only to a candidate whose own verification passed: the target only ever points
at a verified tree, and its sequence of trees is the one-at-a-time lane's (composition is
deterministic, so C2 is the very commit the one-at-a-time lane would compose on C1).

A candidate's verdict counts only once every candidate under it has advanced: when Ck fails
(verification or a conflict), the candidates above it are given up at once (`abandoned`, their
stories back to `ready`), and Sk escalates when Ck reaches the bottom. Then `on_escalation`
decides as for any escalation: `pause` stops there, `continue` composes the later stories again
without Sk. No batching: each tree the target takes was verified on its own.

Everything is in the rows: a story in the stack is `integrating`, its candidate records its
place (`stack`) and what it was composed on (`on_candidate_id`). A lane in a fresh process
(after a crash) finds the stack in the rows, restarts the verifications no thread here is
running, and goes on; a stack whose chain does not hold any more is given up from the first
broken link and composed again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from sqlalchemy import select

from ...db.models import Candidate, Run, Story, utcnow
from ...states import CANDIDATE_OPEN, CandidateState, StoryState
from ..escalation import COULD_NOT_RUN, Cause
from ..journal import EventKind, record
from ..runrows import LaneRow, StoryRow, next_in_plan
from ..transitions import transition_story
from ..verification.runner import VerifyResult
from .blame import CHECKING, JobKey
from .integrate import CandidateShas, Integrator
from ...db.database import Database
from ...policy import Policy

if TYPE_CHECKING:
    from ...queue.tasks import Tasks

__all__ = ["Stack", "Verifications", "speculating"]

log = logging.getLogger(__name__)

_LIVE = CANDIDATE_OPEN
_FAILED = frozenset({CandidateState.VERIFY_FAILED, CandidateState.CONFLICT})


@dataclass
class _Verification:
    slot: int
    stop: threading.Event
    thread: threading.Thread | None = None


class Verifications:
    """The candidate verifications this lane's threads are running. Rows say `verifying`; this
    says whether anyone here is actually doing it (a fresh process after a crash: nobody).
    Owned by the run's `Lane`, so it outlasts the tick that started them."""

    def __init__(self) -> None:
        self._jobs: dict[JobKey, _Verification] = {}  # candidate id -> its verification
        self._lock = threading.Lock()

    def any(self) -> bool:
        with self._lock:
            return bool(self._jobs)

    def running(self, cand_id: JobKey) -> bool:
        with self._lock:
            return cand_id in self._jobs

    def claim(self, cand_id: JobKey) -> _Verification | None:
        """A new verification of `cand_id` on the lowest free slot; None when one runs."""
        with self._lock:
            if cand_id in self._jobs:
                return None
            used = {v.slot for v in self._jobs.values()}
            slot = min(i for i in range(len(used) + 1) if i not in used)
            job = self._jobs[cand_id] = _Verification(slot, threading.Event())
            return job

    def release(self, cand_id: JobKey) -> None:
        with self._lock:
            self._jobs.pop(cand_id, None)

    def stop(self, cand_id: JobKey) -> None:
        with self._lock:
            job = self._jobs.get(cand_id)
        if job is not None:
            job.stop.set()  # its process group is ended; the verdict is not written


def speculating(policy: Policy, max_parallel: int) -> bool:
    """Does this run's lane keep a stack? (`VerifyPolicy.depth` says when it is deeper than 1.)"""
    return policy.verify.depth(max_parallel) > 1


_T = TypeVar("_T")


class StackPass(Protocol):
    """What the stack uses of the tick's `LanePass` (tick.py's docstring lists it)."""

    @property
    def integrator(self) -> Integrator: ...

    @property
    def db(self) -> Database: ...

    @property
    def run_id(self) -> str: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def tasks(self) -> Tasks: ...

    @property
    def verifications(self) -> Verifications: ...

    @property
    def pause_on_escalation(self) -> bool: ...

    def landing(self, story: StoryRow, action: Callable[[], _T]) -> _T | None: ...

    def after_integration(self, story: StoryRow, outcome: str) -> None: ...

    def may_land(self, run: Run) -> bool: ...


@dataclass
class _Entry:
    story: Story
    cand: Candidate | None


class Stack:
    """One lane tick's view of the run's stack (a `LaneStrategy`, tick.py); `step` does
    one thing and says whether it did."""

    def __init__(self, lane_pass: StackPass, depth: int) -> None:
        self.lane = lane_pass
        self.integrator = lane_pass.integrator
        self.db = lane_pass.db
        self.run_id = lane_pass.run_id
        self.policy = lane_pass.policy
        self.depth = depth
        self.verifications: Verifications = lane_pass.verifications  # kept by the run's Lane

    # ------------------------------------------------------------------ one step
    def step(self, run: Run, stories: list[LaneRow]) -> bool:
        entries = self._entries()
        if self._mend_chain(run, entries):
            return True
        if entries and self._resolve_bottom(run, stories, entries[0]):
            return True
        self._keep_verifying(entries)
        return self._extend(run, stories, entries)

    def stop_now(self, reason: str) -> bool:
        """`stop --now`: every candidate not yet advancing is given up, its story back to ready."""
        return self._give_up([e for e in self._entries()
                              if e.cand is None or e.cand.state != CandidateState.ADVANCING], reason)

    # ------------------------------------------------------------------ reading the rows
    def _entries(self) -> list[_Entry]:
        """The stories in the stack (`integrating`), in plan order, each with its latest candidate."""
        with self.db.transaction() as s:
            rows = list(s.scalars(select(Story).where(Story.run_id == self.run_id,
                                                      Story.state == StoryState.INTEGRATING)
                                  .order_by(Story.seq)))
            latest: dict[int, Candidate] = {}
            if rows:
                for cand in s.scalars(select(Candidate).where(
                        Candidate.story_id.in_([r.id for r in rows])).order_by(Candidate.attempt)):
                    latest[cand.story_id] = cand
            return [_Entry(r, latest.get(r.id)) for r in rows]

    # ------------------------------------------------------------------ the chain
    def _mend_chain(self, run: Run, entries: list[_Entry]) -> bool:
        """Give up the stack from its first broken link: a candidate missing, interrupted while
        composing, or composed on something other than the one under it (the bottom: on the
        target the lane last advanced to); and everything above a failed candidate."""
        broken = None
        for i, entry in enumerate(entries):
            cand = entry.cand
            if cand is None or cand.state not in _LIVE | _FAILED or cand.state == CandidateState.COMPOSING:
                broken = i
                break
            if i == 0:
                if cand.target_sha != run.head_sha and not self._already_advanced(cand):
                    broken = i
                    break
            else:
                link = cast(Candidate, entries[i - 1].cand)  # a link checked just before
                if link.state in _FAILED or cand.on_candidate_id != link.id:
                    broken = i
                    break
        if broken is None:
            return False
        below = entries[broken - 1].cand if broken else None
        if below is not None and below.state in _FAILED:
            why = f"the candidate under it ({entries[broken - 1].story.key}) failed"
        else:
            why = "its stack no longer holds (interrupted, or composed on a candidate given up)"
        return self._give_up(entries[broken:], why)

    def _already_advanced(self, cand: Candidate) -> bool:
        """The CAS to this candidate happened but its row was not written (a crash)."""
        return (cand.state in (CandidateState.VERIFIED, CandidateState.ADVANCING)
                and cand.candidate_sha is not None
                and self.integrator.target.sha(fetch=False) == cand.candidate_sha)

    def _give_up(self, entries: list[_Entry], reason: str) -> bool:
        changed = False
        for entry in entries:
            cand = entry.cand
            if cand is not None:
                self.verifications.stop(cand.id)
            with self.db.transaction() as s:
                if cand is not None:
                    row = s.get_one(Candidate, cand.id)
                    if row.state in _LIVE:
                        was = row.state
                        row.state, row.ended_at, row.reason = CandidateState.ABANDONED, utcnow(), reason
                        row.evidence = str(self._evidence(entry.story, row, was, reason))
                        record(s, self.run_id, EventKind.CANDIDATE_ABANDONED, entry.story.key,
                               attempt=row.attempt, was=was, stack=row.stack, reason=reason)
                        changed = True
                if transition_story(s, entry.story.id, StoryState.INTEGRATING, state=StoryState.READY):
                    record(s, self.run_id, EventKind.STORY_UNSTACKED, entry.story.key, reason=reason)
                    changed = True
        return changed

    def _evidence(self, story: Story, cand: Candidate, was: str, reason: str) -> Path:
        """What a given-up candidate was: its ref, worktree and verify log stay for a look."""
        layout = self.integrator.layout
        return self.integrator.aftermath.write_evidence(story.key, cand.attempt, {
            "kind": "abandoned", "story": story.key, "attempt": cand.attempt, "was": was,
            "reason": reason, "stack": cand.stack, "target_sha": cand.target_sha,
            "branch_sha": cand.branch_sha, "candidate_sha": cand.candidate_sha,
            "ref": cand.ref, "worktree": cand.worktree,
            "log": str(layout.verify_log(story.key, f"candidate-{cand.attempt}")),
        })

    # ------------------------------------------------------------------ the bottom
    def _resolve_bottom(self, run: Run, stories: list[LaneRow], entry: _Entry) -> bool:
        """Advance the target to the bottom candidate once it is verified; escalate its story
        once it failed (its verdict counts now: everything under it has advanced)."""
        if not self.lane.may_land(run):
            return False
        first = next_in_plan(stories, self.lane.pause_on_escalation)
        if first is None or first.id != entry.story.id:
            return False
        cand = cast(Candidate, entry.cand)  # the chain holds (`_mend_chain`): each has one
        if cand.state in _FAILED:  # the target checked, then a repair (blame.py)
            outcome = self.lane.landing(entry.story,
                                        lambda: self.integrator.blame.decide(entry.story, cand.id))
            if outcome == CHECKING:
                return False  # its thread wakes the lane when the check ends
            if outcome is not None:
                self.lane.after_integration(entry.story, outcome)
            return True
        if cand.state not in (CandidateState.VERIFIED, CandidateState.ADVANCING):
            return False  # still verifying
        if self._already_advanced(cand):
            outcome = self.integrator.finish_after_crash(entry.story, cand)
        else:
            sha = cast(str, cand.candidate_sha)  # a verified candidate is a commit
            outcome = self.lane.landing(entry.story, lambda: self.integrator.land(
                entry.story, cand.id, cand.attempt, sha, cand.target_sha))
        if outcome is not None:
            self.lane.after_integration(entry.story, outcome)
        return True

    # ------------------------------------------------------------------ verification
    def _keep_verifying(self, entries: list[_Entry]) -> None:
        """Every `verifying` candidate has a verification running here (a lane in a fresh
        process restarts the ones a crash cut short)."""
        # What a dead lane left running in those worktrees was ended by the tick's orphan
        # recovery (`recovery.sweep_dead_owners`, first thing in a fresh process).
        for entry in entries:
            if entry.cand is not None and entry.cand.state == CandidateState.VERIFYING:
                if not self.verifications.running(entry.cand.id):
                    with self.db.transaction() as s:
                        record(s, self.run_id, EventKind.CANDIDATE_REVERIFYING, entry.story.key,
                               attempt=entry.cand.attempt, stack=entry.cand.stack,
                               reason="its verification was not running in this lane (restarted)")
                    self._start(entry.story, entry.cand)

    def _start(self, story: Story, cand: Candidate) -> None:
        worktree = self.integrator.verifier.candidate_checkout(  # a composed candidate's commit
            story.key, cand.attempt, cast(str, cand.candidate_sha))
        with self.db.transaction() as s:  # where it is being verified, for status and evidence
            s.get_one(Candidate, cand.id).worktree = str(worktree) if worktree else None
        job = self.verifications.claim(cand.id)
        if job is None:
            return
        try:
            self._launch(story, cand, job, worktree)
        except BaseException:  # nothing runs it, so nothing may say it does
            self.verifications.release(cand.id)
            raise

    def _launch(self, story: Story, cand: Candidate, job: _Verification,
                worktree: Path | None) -> None:
        """The verification's thread: run the commands, write the verdict, wake the lane."""
        integrator = self.integrator
        env = integrator.verifier.env(slot=job.slot)
        tasks, run_id, verifications = self.lane.tasks, self.run_id, self.verifications
        cand_id, attempt = cand.id, cand.attempt
        # A composed candidate names the branch it was made of and its commit.
        target_sha, branch_sha = cand.target_sha, cast(str, cand.branch_sha)
        sha = cast(str, cand.candidate_sha)

        def verify() -> None:
            try:
                result = integrator.verifier.verify_candidate(story.key, attempt, worktree, sha, env,
                                                         stop_event=job.stop)
                if not job.stop.is_set():
                    integrator.aftermath.record_verdict(story, cand_id, attempt, result, worktree,
                                              CandidateShas(target_sha, branch_sha, sha))
            except Exception as exc:  # counts as a failed verification, never a silent retry loop
                log.exception("verification of candidate %s (%s) failed to run", cand_id, story.key)
                failed = VerifyResult(ok=False, failed_command=f"{COULD_NOT_RUN}: {exc})",
                                      exit_code=None, timed_out=False, output=str(exc),
                                      duration_s=0.0, log=None)
                integrator.aftermath.record_verdict(story, cand_id, attempt, failed, worktree,
                                          CandidateShas(target_sha, branch_sha, sha))
            finally:
                verifications.release(cand_id)
                try:
                    tasks.enqueue_lane(run_id)  # the lane advances, escalates or settles now
                except Exception:
                    log.exception("could not wake the lane of run %s", run_id)

        job.thread = threading.Thread(target=verify, name=f"verify-{story.key}-{attempt}",
                                      daemon=True)
        job.thread.start()

    # ------------------------------------------------------------------ extending
    def _extend(self, run: Run, stories: list[LaneRow], entries: list[_Entry]) -> bool:
        """Compose the next ready story in plan order on the top of the stack (or on the
        target, when the stack is empty) and start its verification."""
        if len(entries) >= self.depth or not self.lane.may_land(run):
            return False
        top = entries[-1] if entries else None
        if top is not None:
            # The chain holds (`_mend_chain`): the top has its candidate.
            if cast(Candidate, top.cand).state not in (CandidateState.VERIFYING,
                                                       CandidateState.VERIFIED):
                return False  # failed (its story escalates at the bottom) or advancing
            if top.story.merge_class == "operator" and not top.story.signed_off:
                return False  # what it will be after sign-off is not known yet
        nxt = next_in_plan(stories, self.lane.pause_on_escalation,
                           after_seq=top.story.seq if top else None)
        if nxt is None or nxt.state != StoryState.READY:
            return False  # plan order: a later ready story waits for this one
        with self.db.transaction() as s:
            if not transition_story(s, nxt.id, StoryState.READY, state=StoryState.INTEGRATING):
                return True
            record(s, self.run_id, EventKind.STORY_INTEGRATING, nxt.key,
                   stack=len(entries) + 1, **({"on": top.story.key} if top else {}))
            story = s.get_one(Story, nxt.id)
        integrator = self.integrator
        if top is None:
            begun = self.lane.landing(story, lambda: integrator.begin_on_target(story))
            if not isinstance(begun, tuple):
                if begun is not None:
                    self.lane.after_integration(story, begun)
                return True
            begun_id, attempt, on_sha, branch_sha = begun
            cand_id = cast(int, begun_id)  # begun with its row (`row=True`)
        else:
            top_cand = cast(Candidate, top.cand)
            missing = integrator.fetch_story(story)
            if missing:
                outcome = integrator.aftermath.escalate(story, None, missing, Cause.BRANCH)
                self.lane.after_integration(story, outcome)
                return True
            # The top is composed; `fetch_story` found the story's head.
            on_sha, branch_sha = cast(str, top_cand.candidate_sha), cast(str, story.head_sha)
            cand_id, attempt = integrator.new_candidate(story, on_sha, stack=len(entries) + 1,
                                                        on_id=top_cand.id)
        sha = integrator.compose_candidate(story, cand_id, attempt, on_sha, branch_sha)
        if sha is not None:
            with self.db.transaction() as s:
                cand = s.get_one(Candidate, cand_id)
            self._start(story, cand)
        return True
