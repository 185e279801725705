"""A story worker: prepare → dev → verify → review (→ fix → verify → review)* → commit → ready.

A story whose file is not written yet goes prepare → create → back to pending (create_step.py);
its next claim starts again at prepare, from the target as it is then, and goes on to dev.

One call of `story_task.work()` is the body of one `stories` task. It claims the story row and
its lease (a duplicate message finds it claimed and returns), then walks on from the row's
phase (`StoryWorker.walk`). Each phase does its slow work outside any transaction and ends in
ONE transaction (`_apply`) that closes the agent attempt, updates the counters and feedback,
and moves the story on or escalates it. A crash before that transaction re-runs the phase (an
unfinished session is marked interrupted and not counted); a crash after it never re-runs a
finished session.

Prepare takes over a story branch pushed to the remote target (`adopt_pushed_branch`): in
remote mode a story's branch is pushed when it is ready (and a human may push a fix to it), so
a story prepared in another clone (its first host died after pushing) or fixed by a human
starts from what was pushed, not from what this clone happens to hold. Commit checks the
footprint's drift (`footprint_drift`): the paths the story's commit changed that its footprint
does not cover.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from sqlalchemy.orm import Session

from ...git.trees.merge import current_base
from ...git.trees.compose import changed_paths, commit_message
from ...db.models import Attempt, Run, Story, utcnow
from ...errors import GitError, StopRequested
from ...git.trees.compose import SessionFolderStaged
from ...git.trees.settle import MergeRules
from ...git.config_guard import CONFIG_CHANGED_PREFIX, changed_files
from ...states import AttemptState, Phase, RunState, StoryState
from ..verification.childenv import settle_after_box, story_verify_setup
from .agentpause import check_budget, settle_unavailable
from .context import Claim, Fenced, FinishedSession, Outcome, StoryContext
from .create_step import carry_forward, phase_create
from ..mergerules import StoryLedgers
from ..crashpoints import crash_point, delay_point
from ..verification.runner import record_flakes, NOTHING_TO_RUN, Retry, VerifySite, run_verify
from ..journal import EventKind, record
from ..repairs import in_repair
from .repair import Repair
from ..redo import RETRY_FROM
from ..escalation import Escalate
from .sessions import Heartbeat, SessionResult, run_session, forget_session_record
from ..transitions import transition_attempt, transition_run
from ...agents.process import Limits
from ..verification.record import back_to_record, before_verify, forget_record
from ...bmad.footprint import tree_directories
from ..workspace.base import matches_any
from ...git.runner import Git

__all__ = ["StoryWorker", "footprint_drift", "adopt_pushed_branch"]


log = logging.getLogger(__name__)

# (kind, data) of the journal events an `Outcome` records.
Events = list[tuple[str, dict[str, Any]]]


def quietly(step: Callable[..., object], *args: object) -> None:
    """A closing step whose failure (a full disk under the queue) must not hide the outcome."""
    try:
        step(*args)
    except Exception:
        log.warning("%s failed; recovery covers it", getattr(step, "__name__", step), exc_info=True)


class StoryWorker:
    """Walks one claimed story through its phases. Returns the escalation reason, if any."""

    def __init__(self, ctx: StoryContext, claim: Claim) -> None:
        self.ctx = ctx
        self.claim = claim
        self.policy = ctx.policy
        self.git = ctx.git
        self.key = ctx.key
        self.ledgers = StoryLedgers(ctx)  # merge rules, and union ledgers git ignores
        self.repair = Repair(self)  # the repair phase (repair.py)
        self._row: Story | None = None  # the row as the last transaction of this walk left it

    # ----------------------------------------------------------------- the walk
    def walk(self, claimed: Story | None = None) -> str | None:
        story = claimed if claimed is not None else self.claim.load()
        if claimed is not None and claimed.phase == Phase.PREPARE:
            self._row = claimed  # the claim just entered prepare: no transaction of its own
        phase: str = story.phase or Phase.PREPARE
        if phase != Phase.PREPARE and not self.ctx.workspace.usable(story.worktree):
            phase = Phase.PREPARE  # its worktree is another host's (that host died) or was removed
        if story.to_create and phase != Phase.PREPARE:
            phase = Phase.CREATE  # e.g. resumed after its create attempts ran out
        if phase == Phase.PREPARE:
            try:
                self.prepare()
            except Escalate as esc:
                return self._apply(Outcome(escalate=esc.reason, evidence=esc.evidence))
            phase = self._entered()  # by prepare's last transaction
        steps: dict[str, Callable[[], Outcome]] = {
            Phase.CREATE: lambda: phase_create(self),
            Phase.DEV: self.phase_dev, Phase.VERIFY: self.phase_verify,
            Phase.REVIEW: self.phase_review, Phase.FIX: self.phase_fix,
            Phase.REPAIR: self.repair.phase, Phase.COMMIT: self.phase_commit}
        while True:
            if self._row is None or self._row.phase != phase:
                self._enter_phase(phase, check_stop=True)  # else _apply just entered it
            try:
                outcome = steps[phase]()
            except Escalate as esc:
                outcome = Outcome(escalate=esc.reason, evidence=esc.evidence, session=esc.result)
            escalated = self._apply(outcome)
            if escalated or outcome.ready or outcome.pending:
                return escalated
            phase = self._entered()  # by `_apply` (which may have passed verify too)

    def _entered(self) -> str:
        """The phase the walk's last transaction entered (prepare's or `_apply`'s)."""
        assert self._row is not None and self._row.phase is not None  # it wrote both
        return self._row.phase

    # ----------------------------------------------------------------- phases
    def prepare(self) -> None:
        with Heartbeat(self.ctx, self.claim):  # its git steps may outlast the lease
            self._prepare()

    def _prepare(self) -> None:
        ctx = self.ctx
        story = self._row if self._row is not None else self._enter_phase(Phase.PREPARE)
        # A stacked start begins on the base the lane composed for it (stacking.py).
        base_sha = story.base_sha if story.stacked_on else ctx.target.sha()
        assert base_sha is not None  # a stacked start's base, or the target (planning found it)
        branch = ctx.layout.story_branch(self.key, self.policy.scm.branch_per)
        if ctx.target.publishes_stories:
            adopt_pushed_branch(ctx, story, branch)
        prepared = carry_forward(ctx, story, ctx.workspace.prepare(story, branch, base_sha), base_sha)
        self.ledgers.seed(prepared.worktree)  # git-ignored union ledgers, from the checkout
        # A human's fix or a retry from review goes on from the branch as it is: no dev.
        as_is = story.human_fix or (story.feedback or {}).get(RETRY_FROM) == Phase.REVIEW
        moved = as_is and story.base_sha and current_base(ctx.git, story.base_sha, "HEAD",
                                                          base_sha, cwd=prepared.worktree)
        delay_point("worker.in_prepare")
        crash_point("worker.after_worktree")
        with ctx.db.transaction() as s:
            values: dict[str, Any] = {"worktree": str(prepared.worktree), "branch": branch,
                                      "heartbeat_at": utcnow()}
            if prepared.feedback:
                values["feedback"] = {**(story.feedback or {}), **prepared.feedback}
            if not (as_is and story.base_sha):
                values["base_sha"] = prepared.base_sha
            elif moved != story.base_sha:  # a person merged or rebased the target into it
                values["base_sha"] = moved
                record(s, ctx.run_id, EventKind.STORY_BASE_MOVED, self.key, old=story.base_sha,
                       new=moved, phase=Phase.PREPARE.value)
            # The next phase is entered here, as `_enter_phase` would (a stop asked for ends
            # the walk once this is written).
            values["phase"] = (Phase.CREATE if story.to_create
                               else Phase.REPAIR if in_repair(story)
                               else Phase.VERIFY if as_is else Phase.DEV)
            run_state = self.claim.write(s, story, **values)
            record(s, ctx.run_id, EventKind.STORY_PREPARED, self.key, worktree=str(prepared.worktree),
                   branch=branch, base_sha=story.base_sha)
            record(s, ctx.run_id, EventKind.STORY_PHASE, self.key, phase=story.phase)
        self._row = story
        if run_state in (RunState.STOPPING, RunState.STOPPED):
            raise StopRequested()

    def phase_dev(self) -> Outcome:
        story = self._story()
        result = self.session(Phase.DEV, story.dev_attempts + 1)
        used = story.dev_attempts + 1
        if result.ok:
            return Outcome(Phase.VERIFY, counters={"dev_attempts": 1}, session=result)
        if used >= self.policy.limits.max_dev_attempts:
            return Outcome(escalate=f"dev attempts exhausted ({used}): {result.summary}",
                           counters={"dev_attempts": 1}, session=result)
        return Outcome(Phase.DEV, counters={"dev_attempts": 1}, session=result,
                       feedback={"verify_output": f"The previous attempt failed: {result.summary}\n"
                                                  + result.output[-4000:]})

    def phase_verify(self) -> Outcome:
        ctx = self.ctx
        story = self._story()
        label = f"{story.dev_attempts}-{story.review_cycles}"
        assert story.worktree is not None  # the prepare phase made it
        worktree = Path(story.worktree)
        # No commands, nothing to run: no environment (guard hooks) made, no heartbeat started.
        commands = self.policy.verify.commands
        log_path = ctx.layout.verify_log(self.key, label)
        env, box = story_verify_setup(ctx, worktree, log_path) if commands else (None, None)
        with Heartbeat(ctx, self.claim) if commands else contextlib.nullcontext():
            # Record or restore (engine/verification/record.py); a retry starts from the record again.
            kept = before_verify(ctx, self.claim, story, worktree)
            result = run_verify(
                commands, VerifySite(worktree, log_path, env, box, ctx.run_id, self.key),
                Limits(timeout_s=self.policy.verify.timeout_s, thaw_after_s=self.policy.leases.ttl_s,
                       max_log_bytes=self.policy.limits.max_log_bytes),
                stop_event=self.claim.stop_event, retry=self._retry(worktree, kept))
        if box is not None:
            settle_after_box(ctx.git, worktree, story.branch, ctx.scratch)
        if result.interrupted:
            raise StopRequested()
        event = result.event()
        human_fix = story.human_fix
        if result.ok:
            return replace(self._verified(story, event), flakes=result.flakes)
        feedback = {"verify_output": result.output, "verify_command": result.failed_command}
        if in_repair(story):
            return self.repair.verify_failed(story, event, feedback)
        if human_fix:
            return Outcome(escalate=f"verify failed on the human-fixed branch: {result.failed_command}",
                           evidence={"output": result.output[-4000:]}, events=[event],
                           feedback=feedback)
        if story.after_phase == Phase.FIX:
            return self._fix_cycle("verify failed after fix", story, events=[event], feedback=feedback)
        if story.dev_attempts >= self.policy.limits.max_dev_attempts:
            return Outcome(escalate=f"verify failed after {story.dev_attempts} dev attempts: "
                                    f"{result.failed_command}",
                           evidence={"output": result.output[-4000:]}, events=[event],
                           feedback=feedback)
        return Outcome(Phase.DEV, events=[event], feedback=feedback)

    def _retry(self, worktree: Path, kept: str | None) -> Retry:
        """How a failed story verify is tried again: on the agent's recorded output (in a
        person's checkout, where nothing is recorded, on the tree as it is)."""
        if kept is None:
            return Retry(self.policy.verify.retries, lambda: None)
        return Retry(self.policy.verify.retries,
                     lambda: back_to_record(self.ctx, self.key, worktree, kept))

    def _verified(self, story: Story, event: tuple[str, dict[str, Any]]) -> Outcome:
        nxt = Phase.COMMIT if story.human_fix or not self.policy.review.enabled else Phase.REVIEW
        return Outcome(nxt, feedback={"verify_output": ""}, events=[event])

    def phase_review(self) -> Outcome:
        story = self._story()
        cycle = story.review_cycles + 1
        result = self.session(Phase.REVIEW, cycle)
        if result.ok:
            return Outcome(Phase.COMMIT, session=result, events=[(EventKind.REVIEW_APPROVED, {"cycle": cycle})])
        return self._fix_cycle("review requested changes", story, session=result,
                               feedback={"review_notes": result.output[-20_000:]},
                               events=[(EventKind.REVIEW_CHANGES_REQUESTED,
                                        {"cycle": cycle, "summary": result.summary})])

    def _fix_cycle(self, why: str, story: Story, **outcome: Any) -> Outcome:
        cycles = story.review_cycles + 1
        if cycles > self.policy.limits.max_review_cycles:
            return Outcome(escalate=f"{why}: review cycles exhausted "
                                    f"({story.review_cycles} fix cycles)", **outcome)
        return Outcome(Phase.FIX, counters={"review_cycles": 1},
                       values={"after_phase": Phase.REVIEW}, **outcome)

    def phase_fix(self) -> Outcome:
        story = self._story()
        result = self.session(Phase.FIX, story.review_cycles)
        repairing = in_repair(story)  # a fix round of a repair counts like a dev attempt
        if result.ok:
            return Outcome(Phase.VERIFY, session=result, values={"after_phase": Phase.FIX},
                           counters={"dev_attempts": 1} if repairing else {})
        used = story.dev_attempts + 1
        if repairing and used >= self.policy.limits.max_dev_attempts:
            return self.repair.failed(story, f"fix round {used - 1} of the repair failed: "
                                      f"{result.summary}", session=result,
                                      counters={"dev_attempts": 1})
        if used >= self.policy.limits.max_dev_attempts:
            return Outcome(escalate=f"fix session failed and dev attempts are exhausted: "
                                    f"{result.summary}", counters={"dev_attempts": 1}, session=result)
        return Outcome(Phase.FIX, counters={"dev_attempts": 1}, session=result)

    def phase_commit(self) -> Outcome:
        with Heartbeat(self.ctx, self.claim):  # add, commit, diff (and push) may outlast the lease
            return self._phase_commit()

    def _phase_commit(self) -> Outcome:
        ctx = self.ctx
        story = self._story()
        self._follow_target(story)
        revert = list(self.policy.scm.lane_owned) + ([ctx.board_rel] if ctx.board_rel else [])
        merge = self.repair.merge_parents(story)  # a repaired story: the two-parent merge
        try:
            head, reverted = ctx.workspace.commit(story, self._commit_message(story), revert,
                                                  merge)
        except SessionFolderStaged as exc:  # a planted symlink, `add -f`: never lands
            return Outcome(escalate=str(exc))
        delay_point("worker.in_commit")
        crash_point("worker.after_repair_commit" if merge else "worker.after_commit")
        # Prepared: its base and branch are set.
        assert story.base_sha is not None and story.branch is not None
        changed = changed_paths(self.git, story.base_sha, head)
        drift = footprint_drift(self.git, story, changed, ctx.board_rel, self.ledgers.rules)
        values = {"head_sha": head, **self.ledgers.captured(story.worktree)}  # before it is parked
        events: Events = []
        if reverted:
            events.append((EventKind.STORY_LEDGER_REVERTED, {"paths": reverted}))
        if drift:
            events.append((EventKind.FOOTPRINT_DRIFT, {"paths": drift, "action": self.policy.footprints.drift}))
        if drift and self.policy.footprints.drift == "escalate":
            return Outcome(escalate=f"footprint drift: {', '.join(drift[:10])}",
                           evidence={"paths": drift}, events=events, values={"head_sha": head})
        try:
            if ctx.target.publish_story(story.branch, head):
                events.append((EventKind.STORY_PUSHED, {"branch": story.branch, "head_sha": head,
                                                "remote": ctx.target.location}))
        except GitError as exc:
            return Outcome(escalate=f"cannot push the story branch: {exc}", events=events,
                           values={"head_sha": head})
        if merge:
            events += self.repair.ready_events(story)
        events.append((EventKind.STORY_READY, {"head_sha": head, "changed": len(changed)}))
        return Outcome(ready=True, events=events, values=values)

    def _follow_target(self, story: Story) -> None:
        """The story's branch took in a newer target (a person's or bmad-loop's merge, or a
        rebase): its base moves there, so the ledger guard, drift and composition measure its
        changes from there and never revert the target's own board marks."""
        if not story.base_sha or not story.worktree:
            return
        moved = current_base(self.git, story.base_sha, "HEAD", self.ctx.target.ref,
                             cwd=Path(story.worktree))
        if moved != story.base_sha:
            with self.ctx.db.transaction() as s:
                old = story.base_sha
                self.claim.write(s, story, base_sha=moved)
                record(s, self.ctx.run_id, EventKind.STORY_BASE_MOVED, self.key, old=old, new=moved,
                       phase=Phase.COMMIT.value)

    # ----------------------------------------------------------------- persistence
    def _apply(self, outcome: Outcome) -> str | None:
        """Write what a phase decided, in one transaction. Returns the escalation reason."""
        ctx = self.ctx
        config_changed = outcome.evidence.get("git_config_changed")
        # No git at all for a story whose session changed git's configuration: leave it as is.
        head = self._escalation_head() if outcome.escalate and not config_changed else None
        known = self._story()  # only this worker writes the row while its claim holds
        self._row = None  # changed below; the next phase's entry reads it again
        values, passed = self._row_values(outcome, known, head)
        with ctx.db.transaction() as s:
            # Taken back (recovered as orphaned)? Then Fenced, and nothing is written.
            run_state = self.claim.write(s, known, **values)
            if outcome.session is not None:
                self._close_attempt(s, outcome.session)
            for kind, data in outcome.events:
                record(s, ctx.run_id, kind, self.key, **data)
            record_flakes(s, ctx.run_id, self.key, "story", outcome.flakes)
            if outcome.escalate:
                self.claim.drop_lease_in(s)
                record(s, ctx.run_id, EventKind.STORY_ESCALATED, self.key, reason=outcome.escalate,
                       phase=known.phase, head_sha=known.head_sha, **outcome.evidence)
                if config_changed and transition_run(s, ctx.run_id, RunState.RUNNING,
                                                     state=RunState.PAUSING, reason=outcome.escalate):
                    record(s, ctx.run_id, EventKind.RUN_PAUSING, self.key, reason=outcome.escalate,
                           pause="git-config")
                return outcome.escalate
            if outcome.ready or outcome.pending:
                self.claim.drop_lease_in(s)
                self._row = known  # the walk ends: kept for the worktree's release
                return None
            # The next phase is entered here, in the same transaction (stop checked too).
            record(s, ctx.run_id, EventKind.STORY_PHASE, self.key, phase=outcome.next_phase)
            if passed is not None:
                for kind, data in passed.events:
                    record(s, ctx.run_id, kind, self.key, **data)
                record(s, ctx.run_id, EventKind.STORY_PHASE, self.key, phase=passed.next_phase)
        if run_state in (RunState.STOPPING, RunState.STOPPED):
            raise StopRequested()
        self._row = known
        return None

    def _row_values(self, outcome: Outcome, known: Story,
                    head: str | None) -> tuple[dict[str, Any], Outcome | None]:
        """The story row's new values for `outcome`, and the verify it passed on entering
        (a verify with no command to run passes as it is entered), or None."""
        now = utcnow()
        values = {name: getattr(known, name) + inc for name, inc in outcome.counters.items()}
        if outcome.feedback:
            values["feedback"] = {**(known.feedback or {}), **outcome.feedback}
        forget_record(known, values)  # a verify's verdict: its record is done with
        if outcome.session is not None:  # a session's outcome: where it started is done with
            forget_session_record(known, values)
        values.update(outcome.values)
        passed = None  # verify with no command to run passes as it is entered
        if outcome.escalate:
            values.update(state=StoryState.ESCALATED, reason=outcome.escalate, ended_at=now,
                          heartbeat_at=None, head_sha=head or values.get("head_sha", known.head_sha))
        elif outcome.ready:
            values.update(state=StoryState.READY, phase=Phase.COMMIT, ready_at=now,
                          heartbeat_at=None, feedback={}, human_fix=False, after_phase=None)
        elif outcome.pending:  # created: dev is admitted like any story, by its footprint
            values.update(state=StoryState.PENDING, phase=Phase.PREPARE, heartbeat_at=None)
        else:
            values.update(phase=outcome.next_phase, heartbeat_at=now)
            if outcome.next_phase == Phase.VERIFY and not self.policy.verify.commands:
                passed = self._verified(known, NOTHING_TO_RUN.event())
                values["feedback"] = {**values.get("feedback", known.feedback or {}),
                                      **passed.feedback}
                values["phase"] = passed.next_phase
        return values, passed

    def _close_attempt(self, s: Session, session: FinishedSession) -> None:
        ended = session.attempt_values()
        if not transition_attempt(s, session.attempt_id, AttemptState.RUNNING,
                                  **ended):  # not running: as the row's checks say
            att = s.get(Attempt, session.attempt_id)
            for name, value in ended.items():
                setattr(att, name, value)
        record(s, self.ctx.run_id, EventKind.ATTEMPT_FINISHED, self.key, phase=session.phase,
               attempt=session.number, state=session.state,
               exit_code=session.exit_code, duration_s=ended["duration_s"])

    def _escalation_head(self) -> str | None:
        return self.ctx.workspace.leave(
            self.claim.load(), rollback=self.policy.scm.rollback_on_failure,
            pause_on_escalation=self.policy.parallel.on_escalation == "pause")

    def session(self, phase: Phase, number: int) -> SessionResult:
        ctx = self.ctx
        waited = 0
        while True:  # an agent that could not work charges nothing: pause, or wait and run again
            check_budget(ctx, self.claim)
            result = run_session(ctx, self.claim, phase, number, story=self._story())
            if result.fault is None or result.config_changes:
                break
            settle_unavailable(ctx, self.claim, result, waited)  # PauseRun unless it waited
            waited += 1
        if result.config_changes:
            # Checked first, even for an interrupted session: planted code must not run in
            # bmad-loop's own git, so the story stops before any, and the run pauses for a human.
            files = changed_files(result.config_changes)
            with ctx.db.transaction() as s:
                self.claim.own(s)
                record(s, ctx.run_id, EventKind.GIT_CONFIG_CHANGED, self.key, phase=phase,
                       files=files, changes=result.config_changes[:50])
            raise Escalate(f"{CONFIG_CHANGED_PREFIX} during the {phase} session of {self.key}: "
                           f"{', '.join(files[:5])}; check it, then `bmad-loop resume`",
                           result=result, git_config_changed=result.config_changes[:50])
        if result.state == AttemptState.INTERRUPTED:
            with ctx.db.transaction() as s:
                self.claim.own(s)
                for name, value in result.attempt_values().items():
                    setattr(s.get(Attempt, result.attempt_id), name, value)
                record(s, ctx.run_id, EventKind.ATTEMPT_FINISHED, self.key, phase=phase, attempt=number,
                       state=AttemptState.INTERRUPTED, counted=False)
            raise StopRequested()
        if result.guard_refusals:
            # Checked before anything else: the target never moved, but the story stops here.
            with ctx.db.transaction() as s:
                self.claim.own(s)
                record(s, ctx.run_id, EventKind.GUARD_REFUSED, self.key, phase=phase,
                       attempts=result.guard_refusals)
            raise Escalate(f"the agent tried to move the target branch ({result.phase} session): "
                           + "; ".join(result.guard_refusals[:3]), result=result,
                           refused=result.guard_refusals)
        return result

    # ----------------------------------------------------------------- helpers
    def _enter_phase(self, phase: str, *, check_stop: bool = False) -> Story:
        """One transaction at each phase's start: a stop asked for ends the walk here (with
        `check_stop`), the fence is checked, the phase and heartbeat written, and the row kept
        for the phase to read (nothing but this worker writes it until `_apply`)."""
        with self.ctx.db.transaction() as s:
            if check_stop and s.get_one(Run, self.ctx.run_id).state in (RunState.STOPPING,
                                                                        RunState.STOPPED):
                raise StopRequested()
            row = self.claim.own(s)
            if row.phase != phase:
                row.phase = phase
                record(s, self.ctx.run_id, EventKind.STORY_PHASE, self.key, phase=phase)
            row.heartbeat_at = utcnow()
        self._row = row
        return row

    @property
    def last_row(self) -> Story | None:
        """The row as this walk's last transaction left it (None: not known here)."""
        return self._row

    def _story(self) -> Story:
        """The story row: as this walk last wrote or read it, else read now."""
        return self._row if self._row is not None else self.claim.load()

    def _commit_message(self, story: Story) -> str:
        return commit_message(self.policy.scm.commit_message_template, story_key=story.key,
                              story_title=story.title, run_id=self.ctx.run_id, epic=story.epic)


def footprint_drift(git: Git, story: Story, changed: list[str], board_rel: str | None,
                    settled: MergeRules | None = None) -> list[str]:
    """`changed` paths outside `story`'s declared footprint (the board, which the lane writes,
    and the paths a merge rule settles, `settled`, aside). An exclusive footprint conflicts with
    everything already: it never drifts."""
    if story.footprint_reason:
        return []
    declared = list(story.footprint.get("files", [])) + list(story.footprint.get("shared", []))
    ignored = [board_rel] if board_rel else []
    # Read the footprint as admission did: a literal path covers a folder only if the story's
    # base has that folder (`newdir` is a file, `newdir/` a folder). Knowing no folder at all
    # covers least, so a path covered that way is covered in any tree: the base's folders are
    # listed (one git process) only for the paths left.
    unsure = [p for p in changed if p not in ignored and not matches_any(p, declared, frozenset())
              and not (settled and settled.covers(p))]
    if not unsure:
        return []
    directories = tree_directories(git, story.base_sha)
    return [p for p in unsure if not matches_any(p, declared, directories)]


def adopt_pushed_branch(ctx: StoryContext, story: Story, branch: str) -> None:
    """The pushed story branch wins when this clone has none (the story began on a host that
    died after pushing) or a human pushed a fix to it."""
    git = ctx.git
    pushed = ctx.target.story_head(branch)
    local = git.rev(f"refs/heads/{branch}")
    if pushed is None or pushed == local:
        return
    if local is not None and not story.human_fix:
        return
    if local is None:
        git.run("update-ref", f"refs/heads/{branch}", pushed)
        return
    git.run("update-ref", f"refs/heads/{branch}", pushed, local)
    worktree = ctx.layout.story_worktree(story.key, ctx.policy.scm.branch_per)
    if worktree.exists():
        git.run("reset", "-q", "--hard", pushed, cwd=worktree)
