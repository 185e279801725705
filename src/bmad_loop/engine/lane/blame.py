"""Whose fault a failed candidate is: the target's, or the story's — and what follows.

Only the bottom candidate decides anything: it is composed on the target itself, so its verdict
counts (a speculative candidate higher up is given up when one under it fails, and composed
again). When it failed:

- **verification** (after `[verify] retries`): the failing command runs on the target's own
  commit first (the target check of engine/verification/targetcheck.py). If the target fails
  too, the target is *red*: no story is blamed or charged, the story goes back to `ready`,
  `target.red` is journaled and the run pauses (whatever `[parallel] on_escalation` says)
  until a person fixes the target and resumes.
  If the target passes, the failure is the story's own.
- **composition** (a merge conflict no merge rule settles): the story's own.

The story's own failure sends it back to its agent for a *repair* (the worker's `repair` phase,
engine/worker/repair.py) while its `[limits] max_repairs` last, with the evidence: the conflicting
paths or the failing command and its log tail, and the stories that landed since the story's base.
Then it escalates as before. Every other failure (a branch not where its worker left it, a
generator that failed, a verification that could not run) escalates as before.

The one-at-a-time lane checks the target in its own thread (it waits for verifications anyway);
the speculative stack runs the check in a verification thread of its own, with its share of the
lane's ports, and decides once the check's row says `passed` or `failed`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import select

from ...db.models import Candidate, Story
from ...git.trees.compose import changed_paths
from ...states import CandidateState, StoryState
from ..escalation import Cause, failure_cause
from ..crashpoints import crash_point
from ..journal import EventKind, record
from ..transitions import transition_story
from ..verification import targetcheck
from ..verification.targetcheck import CheckKey
from ..verification.runner import LaneVerifier
from ...db.database import Database
from ...git.runner import Git
from ...git.targets import Target
from ...policy import Policy
from .aftermath import Aftermath

__all__ = ["Blame", "TargetRed", "RED_PREFIX", "CHECKING", "landed_since"]

log = logging.getLogger(__name__)

RED_PREFIX = "the target is red"
CHECKING = "checking"  # `decide`: the target check runs in a thread; nothing is decided yet


# What a verification in a thread of the lane is known by: a candidate's id, or ("target",
# sha, command) for a target check.
JobKey = Hashable


class Job(Protocol):
    """A verification running in a thread of the lane (speculation.py's `_Verification`)."""

    slot: int  # its share of the lane's ports
    stop: threading.Event
    thread: threading.Thread | None


class CheckSlots(Protocol):
    """Where the lane's threaded verifications are kept (speculation.py's `Verifications`)."""

    def claim(self, key: JobKey) -> Job | None: ...

    def release(self, key: JobKey) -> None: ...


class BlameSite(Protocol):
    """What `Blame` needs of the lane's integration (integrate.py's `Integrator`)."""

    @property
    def db(self) -> Database: ...

    @property
    def run_id(self) -> str: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def git(self) -> Git: ...

    @property
    def target(self) -> Target: ...

    @property
    def verifier(self) -> LaneVerifier: ...

    @property
    def aftermath(self) -> Aftermath: ...


class TargetRed(Exception):
    """The target itself fails a verify command: the run pauses (tick.py's `landing`)."""


def generator_failure(evidence: dict[str, Any]) -> dict[str, Any]:
    """A regenerate failure's evidence as a repair's details: the generator that ran last (the
    one that failed), its log, and why it failed with its output."""
    runs = evidence.get("regenerated") or [{}]
    return {**evidence, "command": runs[-1].get("command") or "the regenerate command",
            "log": runs[-1].get("log"),
            "output": f"{evidence.get('reason') or ''}\n{evidence.get('output') or ''}".strip()}


class Blame:
    """Decides for the `integrator` (integrate.py). `checks`: the run's `Verifications`, to run
    a target check in a thread of its own (the stack); None: in the caller's thread. `wake`:
    wakes the lane once a threaded check ends."""

    def __init__(self, integrator: BlameSite, checks: CheckSlots | None = None,
                 wake: Callable[[], None] | None = None) -> None:
        self.integrator = integrator
        self.checks = checks
        self.wake = wake

    def decide(self, story: Story, cand_id: int) -> str:
        """The story's state once its failed candidate `cand_id` is dealt with; `CHECKING`
        while a target check runs in a thread (the lane is woken when it ends). Raises
        `TargetRed` when the target itself fails."""
        with self.integrator.db.read() as s:
            cand = s.get_one(Candidate, cand_id)
        details = _evidence_of(cand)
        cause = failure_cause(cand.state, cand.reason)
        if cause == Cause.CONFLICT and details.get("kind") != Cause.CONFLICT:
            # A generator failed on the composition (a lock script the story broke, a manifest
            # that no longer resolves): the story's agent gets its output, as for a failed
            # check. Not a verify command, so no target check.
            cause, details = Cause.VERIFY, generator_failure(details)
        elif cause == Cause.VERIFY and self.integrator.policy.verify.retries:  # 0: as before
            key = CheckKey(cand.target_sha, details.get("command") or "")
            state = self._target_state(story, key)
            if state is None:
                return CHECKING
            if state == targetcheck.FAILED:
                self._red(story, cand, key)
        if cause in (Cause.CONFLICT, Cause.VERIFY):
            return self.integrator.aftermath.repair_or_escalate(
                story, cand, cause, details, landed_since(self.integrator, story.id))
        return self.integrator.aftermath.escalate(story, cand.id, cand.reason or "candidate failed",
                                                 failure_cause(cand.state, cand.reason))

    # ------------------------------------------------------------------ the target check
    def _target_state(self, story: Story, key: CheckKey) -> str | None:
        integrator = self.integrator
        row = targetcheck.recorded(integrator.db, integrator.run_id, key)
        if row is not None and row.state != targetcheck.RUNNING:
            return row.state
        if self.checks is None:  # here and now (a row left running: a dead lane's, run again)
            targetcheck.begin(integrator.db, integrator.run_id, key, story.key)
            crash_point("lane.in_target_check")
            result = targetcheck.run_check(integrator.verifier, key, integrator.verifier.env())
            return targetcheck.finish(integrator.db, integrator.run_id, key, result)
        job_key = ("target", key.target_sha, key.command)
        job = self.checks.claim(job_key)
        if job is None:
            return None  # running in this lane's thread already
        try:
            targetcheck.begin(integrator.db, integrator.run_id, key, story.key)
            self._launch(key, job_key, job)
        except BaseException:
            self.checks.release(job_key)
            raise
        return None

    def _launch(self, key: CheckKey, job_key: JobKey, job: Job) -> None:
        integrator, checks, wake = self.integrator, self.checks, self.wake
        assert checks is not None  # only a lane with threaded checks launches one
        env = integrator.verifier.env(slot=job.slot)

        def check() -> None:
            try:
                result = targetcheck.run_check(integrator.verifier, key, env, stop_event=job.stop)
                if not job.stop.is_set():
                    targetcheck.finish(integrator.db, integrator.run_id, key, result)
            except Exception:  # the row stays running: the next tick runs it again
                log.exception("the target check of %s on %s failed to run", key.command,
                              key.target_sha[:12])
            finally:
                checks.release(job_key)
                if wake is not None:
                    try:
                        wake()
                    except Exception:
                        log.exception("could not wake the lane after a target check")

        job.thread = threading.Thread(target=check, name=f"target-check-{key.target_sha[:8]}",
                                      daemon=True)
        job.thread.start()

    def _red(self, story: Story, cand: Candidate, key: CheckKey) -> None:
        integrator = self.integrator
        row = targetcheck.recorded(integrator.db, integrator.run_id, key)
        log_path = row.log if row is not None else None
        reason = (f"{RED_PREFIX}: `{key.command}` fails on {integrator.target.branch} at "
                  f"{key.target_sha[:12]} itself (log {log_path}); fix the target first, then "
                  "`bmad-loop resume`")
        with integrator.db.transaction() as s:
            if transition_story(s, story.id, StoryState.INTEGRATING, state=StoryState.READY):
                record(s, integrator.run_id, EventKind.TARGET_RED, story.key, command=key.command,
                       target_sha=key.target_sha, log=log_path, candidate=cand.attempt,
                       reason=reason)
        raise TargetRed(reason)


def landed_since(integrator: BlameSite, story_id: int) -> list[dict[str, Any]]:
    """The stories of the run integrated since `story_id`'s base, in plan order: key, title,
    the paths each changed, and its commit on the target."""
    git = integrator.git
    with integrator.db.read() as s:
        story = s.get_one(Story, story_id)
        rows = list(s.scalars(select(Story).where(Story.run_id == story.run_id,
                                                  Story.state == StoryState.INTEGRATED)
                              .order_by(Story.seq)))
    base = story.base_sha
    landed = []
    for row in rows:
        if not row.integrated_sha or (base and git.is_ancestor(row.integrated_sha, base)):
            continue
        paths = (changed_paths(git, row.base_sha, row.head_sha)
                 if row.base_sha and row.head_sha else [])
        landed.append({"key": row.key, "title": row.title or "", "paths": sorted(paths),
                       "sha": row.integrated_sha})
    return landed


def _evidence_of(cand: Candidate) -> dict[str, Any]:
    """The failed candidate's evidence file (conflicts, or the failing command and output)."""
    if not cand.evidence:
        return {}
    try:
        data = json.loads(Path(cand.evidence).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
