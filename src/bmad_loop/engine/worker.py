"""A story worker: prepare → dev → verify → review (→ fix → verify → review)* → commit → ready.

One call of `work()` is the body of one `stories` task. It claims the story row (a duplicate
message finds it already claimed and returns) and its lease, then walks the phases from the
one recorded in the row. Each phase does its slow work outside any transaction and ends in ONE
transaction (`_apply`) that closes the agent attempt, updates the counters and feedback, and
moves the story to its next phase or escalates it. A crash before that transaction re-runs the
phase (an unfinished session is marked interrupted and not counted); a crash after it never
re-runs a finished session.
"""

from __future__ import annotations

import logging
import shutil
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..compose import changed_paths, commit_worktree
from ..db.models import Attempt, Run, Story, utcnow
from ..errors import GitError, StopRequested
from ..footprint import path_matches
from ..profiles import load_profile
from ..worktrees import ensure_worktree
from . import leases
from .faults import crash_point
from .guard import guard_env
from .inplace import InPlace
from .journal import record
from .layout import Layout
from .notify import notify
from .ports import port_env, worker_block
from .rows import board_rel, run_policy, transition_story
from .sessions import Heartbeat, clean_env, run_session, sandbox_vars
from .verify import run_verify

__all__ = ["work", "StoryWorker", "story_lease_name"]

log = logging.getLogger(__name__)


def story_lease_name(story_id: int) -> str:
    return f"story:{story_id}"


class Escalate(Exception):
    """Internal: end this story's work as escalated, with a reason and evidence."""

    def __init__(self, reason: str, **evidence):
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence


@dataclass
class Outcome:
    """What a phase decided; `_apply` writes all of it in one transaction."""

    next_phase: str | None = None  # "ready" ends the walk; None with `escalate`
    escalate: str | None = None
    evidence: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)  # increments: dev_attempts, review_cycles
    feedback: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)  # plain column values
    events: list = field(default_factory=list)  # (kind, data)
    session: object = None  # a SessionResult whose attempt row this closes


def work(project, tasks, run_id: str, story_id: int) -> None:
    """Task body: claim the story, do its work, wake the lane."""
    db = project.db
    owner = leases.owner_id(f"story{story_id}")
    with db.transaction() as s:
        run = s.get(Run, run_id)
        if run is None:
            return
        if run.state not in ("running", "pausing"):
            # Stopped or paused before a worker picked it up: back in line, nothing started.
            if transition_story(s, story_id, "queued", state="pending", port_block=None):
                record(s, run_id, "story.unqueued", s.get(Story, story_id).key, run_state=run.state)
            return
        now = utcnow()
        if not transition_story(s, story_id, "queued", state="working", host=project.host,
                                heartbeat_at=now, started_at=now, claim=Story.claim + 1):
            return  # someone else has it, or it is no longer queued: a duplicate message
        story = s.get(Story, story_id)
        s.refresh(story)
        claim = story.claim
        record(s, run_id, "story.started", story.key, phase=story.phase or "prepare",
               host=project.host)
        policy = run_policy(run)
    token = leases.acquire(db, story_lease_name(story_id), owner, policy.leases.ttl_s) or 0
    try:
        worker = StoryWorker(project, run, story, owner, token, claim)
        worker.walk()
        worker.notify_escalation()
    except Fenced:
        log.warning("story %s was taken back while this worker stalled; it stops here", story_id)
    except StopRequested:
        _release_after_stop(project, run_id, story_id, claim)
    except Exception as exc:  # a bug or an environment failure: keep the work, tell a human
        log.exception("story %s failed unexpectedly", story_id)
        with db.transaction() as s:
            story = s.get(Story, story_id)
            if story.state == "working" and story.claim == claim:
                story.state, story.reason, story.ended_at = "escalated", f"internal error: {exc}", utcnow()
                record(s, run_id, "story.escalated", story.key, reason=story.reason,
                       traceback=traceback.format_exc()[-4000:])
    finally:
        leases.release(db, story_lease_name(story_id), owner)
        tasks.enqueue_lane(run_id)
    if project.remote is not None:
        _sweep(project, run_id)


def _sweep(project, run_id: str) -> None:
    from .cleanup import sweep_landed

    try:
        sweep_landed(project, run_id)
    except Exception:  # debris only: `cleanup` on this host removes what is left
        log.warning("could not remove landed worktrees of run %s", run_id, exc_info=True)


class Fenced(StopRequested):
    """This worker's claim on the story is gone (recovery gave it to another): write nothing."""


def _release_after_stop(project, run_id: str, story_id: int, claim: int) -> None:
    """A stop reached this story: hand it back as pending, its phase and worktree kept."""
    with project.db.transaction() as s:
        story = s.get(Story, story_id)
        if story.claim == claim and transition_story(s, story_id, "working", state="pending",
                                                     heartbeat_at=None):
            record(s, run_id, "story.interrupted", story.key, phase=story.phase)


class StoryWorker:
    def __init__(self, project, run: Run, story: Story, owner: str, token: int = 0, claim: int = 0):
        self.project = project
        self.db = project.db
        self.run_id = run.id
        self.story_id = story.id
        self.key = story.key
        self.owner, self.token, self.claim = owner, token, claim
        self.policy = run_policy(run)
        self.git = project.git(self.policy)
        self.layout = Layout(project.state_dir, run.id)
        self.target_branch = run.target_branch
        self.board_rel = board_rel(run, project.root)
        self.in_place = self.policy.scm.isolation == "none"
        self.inplace = InPlace(self) if self.in_place else None
        self.stop_event = threading.Event()
        self.profile = load_profile(self.policy.adapter.profile) if self.policy.adapter.profile else None
        self.port_block = worker_block(self.policy, story.port_block)

    # ----------------------------------------------------------------- the walk
    def walk(self) -> None:
        story = self.load()
        phase = story.phase or "prepare"
        if phase != "prepare" and not self.in_place and not self._worktree_is_here(story.worktree):
            phase = "prepare"  # its worktree is another host's (that host died) or was removed
        if phase == "prepare":
            try:
                self.prepare()
            except Escalate as esc:
                self._apply(Outcome(escalate=esc.reason, evidence=esc.evidence))
                return
            story = self.load()
            phase = "verify" if story.feedback.get("human_fix") else "dev"
        while phase != "ready":
            self._check_stop()
            self._enter_phase(phase)
            try:
                outcome = getattr(self, f"phase_{phase}")()
            except Escalate as esc:
                outcome = Outcome(escalate=esc.reason, evidence=esc.evidence,
                                  session=getattr(esc, "result", None))
            self._apply(outcome)
            if outcome.escalate:
                return
            phase = outcome.next_phase

    def _worktree_is_here(self, worktree: str | None) -> bool:
        """A worktree of this repository (clone), still on disk."""
        if not worktree or not Path(worktree).is_dir():
            return False
        return Path(worktree).resolve().is_relative_to(self.project.state_dir.resolve())

    def _check_stop(self) -> None:
        with self.db.transaction() as s:
            if s.get(Run, self.run_id).state in ("stopping", "stopped"):
                raise StopRequested()

    # ----------------------------------------------------------------- phases
    def prepare(self) -> None:
        self._enter_phase("prepare")
        story = self.load()
        base_sha = self.project.target_sha(self.git, self.target_branch)
        branch = self.layout.story_branch(self.key, self.policy.scm.branch_per)
        if self.project.remote is not None:
            self._adopt_pushed_branch(story, branch)
        if self.in_place:
            worktree = self.project.root
            self.inplace.prepare(branch, base_sha)
        else:
            worktree = self.layout.story_worktree(self.key, self.policy.scm.branch_per)
            start = base_sha
            existing = self.git.rev(f"refs/heads/{branch}")
            if self.policy.scm.branch_per == "run" and existing and self.git.is_ancestor(existing, base_sha):
                # The shared run branch was integrated: move it up to the target before reuse.
                self.git.run("update-ref", f"refs/heads/{branch}", base_sha, existing)
                if worktree.exists():
                    self.git.run("reset", "-q", "--hard", base_sha, cwd=worktree)
            elif existing:
                start = existing
                # Resumed on its own branch: the story's changes are measured from the fork point.
                base_sha = self.git.out("merge-base", existing, base_sha)
            ensure_worktree(self.git, worktree, branch, start)
            self._seed(worktree)
        crash_point("worker.after_worktree")
        with self.db.transaction() as s:
            row = self.own(s)
            row.worktree, row.branch = str(worktree), branch
            if not (story.feedback.get("human_fix") and row.base_sha):
                row.base_sha = base_sha
            record(s, self.run_id, "story.prepared", self.key, worktree=str(worktree),
                   branch=branch, base_sha=row.base_sha)

    def _adopt_pushed_branch(self, story: Story, branch: str) -> None:
        """Remote mode: the remote's story branch wins when this clone has none (the story
        began on a host that died after pushing) or a human pushed a fix to it."""
        pushed = self.project.remote.fetch_branch(self.git, branch)
        local = self.git.rev(f"refs/heads/{branch}")
        if pushed is None or pushed == local:
            return
        if local is not None and not story.feedback.get("human_fix"):
            return
        if local is None:
            self.git.run("update-ref", f"refs/heads/{branch}", pushed)
        else:
            self.git.run("update-ref", f"refs/heads/{branch}", pushed, local)
            worktree = self.layout.story_worktree(self.key, self.policy.scm.branch_per)
            if worktree.exists():
                self.git.run("reset", "-q", "--hard", pushed, cwd=worktree)

    def phase_dev(self) -> Outcome:
        story = self.load()
        result = self._session("dev", story.dev_attempts + 1)
        used = story.dev_attempts + 1
        if result.ok:
            return Outcome("verify", counters={"dev_attempts": 1}, session=result)
        if used >= self.policy.limits.max_dev_attempts:
            return Outcome(escalate=f"dev attempts exhausted ({used}): {result.summary}",
                           counters={"dev_attempts": 1}, session=result)
        return Outcome("dev", counters={"dev_attempts": 1}, session=result,
                       feedback={"verify_output": f"The previous attempt failed: {result.summary}\n"
                                                  + result.output[-4000:]})

    def phase_verify(self) -> Outcome:
        story = self.load()
        label = f"{story.dev_attempts}-{story.review_cycles}"
        env = clean_env()
        env.update(sandbox_vars(self))
        if not self.in_place:
            env.update(guard_env(self.git, Path(story.worktree), self.target_branch,
                                 self.project.path("guard-hooks"),
                                 self.layout.scratch(self.key) / "guard.log"))
        with Heartbeat(self):
            result = run_verify(self.policy.verify.commands, cwd=Path(story.worktree),
                                log_path=self.layout.verify_log(self.key, label),
                                timeout_s=self.policy.verify.timeout_s, env=env,
                                stop_event=self.stop_event)
        if result.interrupted:
            raise StopRequested()
        event = ("verify.passed" if result.ok else "verify.failed",
                 {"command": result.failed_command, "exit_code": result.exit_code,
                  "timed_out": result.timed_out, "duration_s": round(result.duration_s, 3),
                  "log": result.log})
        human_fix = story.feedback.get("human_fix")
        if result.ok:
            nxt = "commit" if human_fix or not self.policy.review.enabled else "review"
            return Outcome(nxt, feedback={"verify_output": ""}, events=[event])
        feedback = {"verify_output": result.output, "verify_command": result.failed_command}
        if human_fix:
            return Outcome(escalate=f"verify failed on the human-fixed branch: {result.failed_command}",
                           evidence={"output": result.output[-4000:]}, events=[event],
                           feedback=feedback)
        if story.feedback.get("after") == "fix":
            return self._fix_cycle("verify failed after fix", story, events=[event], feedback=feedback)
        if story.dev_attempts >= self.policy.limits.max_dev_attempts:
            return Outcome(escalate=f"verify failed after {story.dev_attempts} dev attempts: "
                                    f"{result.failed_command}",
                           evidence={"output": result.output[-4000:]}, events=[event],
                           feedback=feedback)
        return Outcome("dev", events=[event], feedback=feedback)

    def phase_review(self) -> Outcome:
        story = self.load()
        cycle = story.review_cycles + 1
        result = self._session("review", cycle)
        if result.ok:
            return Outcome("commit", session=result, events=[("review.approved", {"cycle": cycle})])
        return self._fix_cycle("review requested changes", story, session=result,
                               feedback={"review_notes": result.output[-20_000:]},
                               events=[("review.changes_requested",
                                        {"cycle": cycle, "summary": result.summary})])

    def _fix_cycle(self, why: str, story: Story, **outcome) -> Outcome:
        cycles = story.review_cycles + 1
        if cycles > self.policy.limits.max_review_cycles:
            return Outcome(escalate=f"{why}: review cycles exhausted "
                                    f"({story.review_cycles} fix cycles)", **outcome)
        feedback = dict(outcome.pop("feedback", {}))
        feedback["after"] = "review"
        return Outcome("fix", counters={"review_cycles": 1}, feedback=feedback, **outcome)

    def phase_fix(self) -> Outcome:
        story = self.load()
        result = self._session("fix", story.review_cycles)
        if result.ok:
            return Outcome("verify", session=result, feedback={"after": "fix"})
        used = story.dev_attempts + 1
        if used >= self.policy.limits.max_dev_attempts:
            return Outcome(escalate=f"fix session failed and dev attempts are exhausted: "
                                    f"{result.summary}", counters={"dev_attempts": 1}, session=result)
        return Outcome("fix", counters={"dev_attempts": 1}, session=result)

    def phase_commit(self) -> Outcome:
        story = self.load()
        message = self.commit_message(story)
        revert = list(self.policy.scm.lane_owned) + ([self.board_rel] if self.board_rel else [])
        if self.in_place:
            head, reverted = self.inplace.commit(story, message, lambda p: _matches_any(p, revert))
        else:
            head, reverted = commit_worktree(self.git, Path(story.worktree), message,
                                             story.base_sha, revert, exclude=self._seed_names())
        crash_point("worker.after_commit")
        changed = changed_paths(self.git, story.base_sha, head)
        drift = self._drift(story, changed)
        events = []
        if reverted:
            events.append(("story.ledger_reverted", {"paths": reverted}))
        if drift:
            events.append(("footprint.drift", {"paths": drift, "action": self.policy.footprints.drift}))
        if drift and self.policy.footprints.drift == "escalate":
            return Outcome(escalate=f"footprint drift: {', '.join(drift[:10])}",
                           evidence={"paths": drift}, events=events, values={"head_sha": head})
        if self.project.remote is not None:
            try:
                self.project.remote.publish_branch(self.git, story.branch, head)
            except GitError as exc:
                return Outcome(escalate=f"cannot push the story branch: {exc}", events=events,
                               values={"head_sha": head})
            events.append(("story.pushed", {"branch": story.branch, "head_sha": head,
                                            "remote": self.project.remote.url}))
        events.append(("story.ready", {"head_sha": head, "changed": len(changed)}))
        return Outcome("ready", events=events, values={"head_sha": head})

    # ----------------------------------------------------------------- persistence
    def _apply(self, outcome: Outcome) -> None:
        head = None
        if outcome.escalate:
            head = self._escalation_head()
        with self.db.transaction() as s:
            row = self.own(s)  # taken back (recovered as orphaned)? then nothing is written
            if outcome.session is not None:
                att = s.get(Attempt, outcome.session.attempt_id)
                for name, value in outcome.session.attempt_values().items():
                    setattr(att, name, value)
                record(s, self.run_id, "attempt.finished", self.key, phase=outcome.session.phase,
                       attempt=outcome.session.number, state=outcome.session.state,
                       exit_code=outcome.session.exit_code, duration_s=att.duration_s)
            for name, inc in outcome.counters.items():
                setattr(row, name, getattr(row, name) + inc)
            if outcome.feedback:
                merged = dict(row.feedback or {})
                merged.update(outcome.feedback)
                row.feedback = merged
            for name, value in outcome.values.items():
                setattr(row, name, value)
            for kind, data in outcome.events:
                record(s, self.run_id, kind, self.key, **data)
            now = utcnow()
            if outcome.escalate:
                row.state, row.reason, row.ended_at, row.heartbeat_at = "escalated", outcome.escalate, now, None
                row.head_sha = head or row.head_sha
                record(s, self.run_id, "story.escalated", self.key, reason=outcome.escalate,
                       phase=row.phase, head_sha=row.head_sha, **outcome.evidence)
                self._escalated = outcome.escalate
            elif outcome.next_phase == "ready":
                row.state, row.phase, row.ready_at, row.heartbeat_at = "ready", "commit", now, None
                row.feedback = {}
            else:
                row.phase, row.heartbeat_at = outcome.next_phase, now
                record(s, self.run_id, "story.phase", self.key, phase=outcome.next_phase)

    def notify_escalation(self) -> None:
        reason = getattr(self, "_escalated", None)
        if reason:
            notify(self.db, self.policy, self.run_id, "story.escalated", story=self.key,
                   reason=reason)

    def _escalation_head(self) -> str | None:
        story = self.load()
        if self.in_place:
            return self.inplace.leave(story, self.policy.scm.rollback_on_failure)
        if story.worktree and Path(story.worktree).exists():
            return self.git.rev("HEAD", cwd=Path(story.worktree))
        return None

    def _session(self, phase: str, number: int):
        result = run_session(self, phase, number)
        if result.state == "interrupted":
            with self.db.transaction() as s:
                self.own(s)
                for name, value in result.attempt_values().items():
                    setattr(s.get(Attempt, result.attempt_id), name, value)
                record(s, self.run_id, "attempt.finished", self.key, phase=phase, attempt=number,
                       state="interrupted", counted=False)
            raise StopRequested()
        if result.guard_refusals:
            # Checked before anything else: the target never moved, but the story stops here.
            with self.db.transaction() as s:
                self.own(s)
                record(s, self.run_id, "guard.refused", self.key, phase=phase,
                       attempts=result.guard_refusals)
            raise _GuardEscalation(result)
        return result

    # ----------------------------------------------------------------- helpers
    def own(self, session) -> Story:
        """The story row, if this worker still holds its claim; otherwise Fenced."""
        row = session.get(Story, self.story_id)
        if row.state != "working" or row.claim != self.claim:
            raise Fenced()
        return row

    def load(self) -> Story:
        with self.db.transaction() as s:
            return s.get(Story, self.story_id)

    def beat(self, attempt_id: int | None = None) -> None:
        now = utcnow()
        with self.db.transaction() as s:
            row = s.get(Story, self.story_id)
            if row.state != "working" or row.claim != self.claim:
                self.stop_event.set()  # fenced: end the session; the walk then stops
                return
            row.heartbeat_at = now
            if attempt_id is not None:
                s.get(Attempt, attempt_id).heartbeat_at = now
        leases.renew(self.db, story_lease_name(self.story_id), self.owner, self.token,
                     self.policy.leases.ttl_s, now)

    def _enter_phase(self, phase: str) -> None:
        with self.db.transaction() as s:
            row = self.own(s)
            if row.phase != phase:
                row.phase = phase
                record(s, self.run_id, "story.phase", self.key, phase=phase)
            row.heartbeat_at = utcnow()

    def merge_feedback(self, **values) -> None:
        with self.db.transaction() as s:
            row = self.own(s)
            merged = dict(row.feedback or {})
            merged.update(values)
            row.feedback = merged

    def escalation(self, reason: str, **evidence) -> Escalate:
        return Escalate(reason, **evidence)

    def verdict_mode(self) -> str:
        """Profiles whose CLI always exits 0 mark their verdict in the output; commands use exit codes."""
        adapter = self.policy.adapter
        if self.profile and not adapter.command and not adapter.phase("review").command:
            return self.profile.verdict
        return "exit"

    def port_block_env(self) -> dict:
        return port_env(self.port_block)

    def commit_message(self, story: Story) -> str:
        return self.policy.scm.commit_message_template.format(
            story_key=story.key, story_title=story.title or story.key, run_id=self.run_id,
            epic=story.epic)

    def _drift(self, story: Story, changed: list[str]) -> list[str]:
        if story.footprint_reason:  # exclusive footprints conflict with everything already
            return []
        declared = list(story.footprint.get("files", [])) + list(story.footprint.get("shared", []))
        ignored = [self.board_rel] if self.board_rel else []
        return [p for p in changed if p not in ignored and not _matches_any(p, declared)]

    def _seed_names(self) -> list[str]:
        names = list(self.policy.scm.worktree_seed)
        if self.policy.scm.seed_adapter_defaults and self.profile:
            names += list(self.profile.seed_files)
        return names

    def _seed(self, worktree: Path) -> None:
        """Copy untracked seed files (policy list + the agent profile's config) into a worktree."""
        for name in self._seed_names():
            source = self.project.root / name
            if not source.exists() or (worktree / name).exists():
                continue
            (worktree / name).parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, worktree / name)
            else:
                shutil.copy2(source, worktree / name)


class _GuardEscalation(Escalate):
    def __init__(self, result):
        super().__init__(f"the agent tried to move the target branch ({result.phase} session): "
                         + "; ".join(result.guard_refusals[:3]), refused=result.guard_refusals)
        self.result = result


def _matches_any(path: str, patterns) -> bool:
    return any(path_matches(pattern, path) for pattern in patterns)
