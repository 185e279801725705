"""What an integration leaves behind when it does not simply advance, and after it lands.

`Aftermath` works for the `Integrator` (integrate.py) and the speculative stack on one
`LaneSite`: a conflict or a dirty target checkout keeps its evidence (a JSON file, the
conflicted tree as a commit and a worktree) and escalates the story; a landed story's
candidates, worktree and branch are cleaned up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from ...db.database import Database
from ...db.models import Candidate, Run, Story, utcnow
from ...git.runner import Git
from ...git.targets import Target
from ...policy import Policy
from ...states import CandidateState, Phase, RunState, StoryState
from ...git.worktrees import delete_ref, ensure_detached_worktree, remove_worktree
from ..escalation import Cause
from ..crashpoints import crash_point
from ..journal import EventKind, record
from ..repairs import REPAIR_KEY
from ..verification.runner import record_flakes
from ..runpaths import Layout
from ..runrows import RUN_STATE
from ..transitions import transition_story
from ..workspace import Workspace
from ..verification.runner import VerifyResult
from ...git.trees.compose import Composition

# ready -> integrating only while the run may still land it: checked in the UPDATE itself
# (built once; transitions.py keeps the statement made with it).
_RUN_MAY_LAND = RUN_STATE.scalar_subquery().in_((RunState.RUNNING, RunState.PAUSING))
_CANDIDATE_REFS = select(Candidate.attempt, Candidate.ref, Candidate.state).where(
    Candidate.story_id == bindparam("story_id"))

__all__ = ["LaneSite", "Aftermath", "TargetMoved"]


class TargetMoved(Exception):
    """Someone other than the lane moved the target, and `[scm] on_foreign_move = "pause"`."""

    def __init__(self, old: str, new: str, commits: list[str]):
        super().__init__(f"target moved by someone else: {old[:12]}..{new[:12]} "
                         f"({len(commits)} commit(s): {', '.join(c[:12] for c in commits[:5])})")
        self.old, self.new, self.commits = old, new, commits


@dataclass(frozen=True)
class LaneSite:
    """What an integration works on: the run's rows, its git, where its files go, its target,
    the story worktrees and the policy snapshot."""

    db: Database
    run_id: str
    git: Git
    layout: Layout
    target: Target
    workspace: Workspace
    policy: Policy


class Aftermath:
    """The ends of an integration other than the advance itself, on one `LaneSite`."""

    def __init__(self, site: LaneSite) -> None:
        self.db, self.run_id, self.git = site.db, site.run_id, site.git
        self.layout, self.target, self.workspace, self.policy = \
            site.layout, site.target, site.workspace, site.policy

    def dirty_checkout(self, story: Story, cand_id: int, attempt: int, checkout: Path,
                       overlap: Sequence[str], target_sha: str, sha: str) -> str:
        evidence = self.write_evidence(story.key, attempt, {
            "kind": "dirty-target-checkout", "story": story.key, "checkout": str(checkout),
            "paths": overlap, "target_sha": target_sha, "candidate_sha": sha,
        })
        with self.db.transaction() as s:
            cand = s.get_one(Candidate, cand_id)
            cand.state, cand.evidence, cand.ended_at = CandidateState.ABANDONED, str(evidence), utcnow()
            cand.reason = f"local changes in {checkout} overlap: {', '.join(overlap)}"
        return self.escalate(story, cand_id, f"the target checkout {checkout} has local "
                              f"changes that overlap the candidate: {', '.join(overlap)}",
                              Cause.CHECKOUT)

    def record_conflict(self, story: Story, cand_id: int, attempt: int, comp: Composition,
                        target_sha: str, branch_sha: str, ref: str) -> None:
        # Keep the conflicted tree (with markers) as a commit and a worktree for a human.
        preserved = None
        if comp.tree:
            preserved = self.git.out("commit-tree", comp.tree, "-p", target_sha, "-p", branch_sha,
                                     "-m", f"bmad-loop: conflicted candidate for {story.key}",
                                     env=self.git.identity_env(self.git.commit_date(branch_sha)))
            self.git.run("update-ref", ref, preserved)
            worktree = self.layout.candidate_worktree(story.key, attempt)
            ensure_detached_worktree(self.git, worktree, preserved)
        else:
            worktree = None
        evidence = self.write_evidence(story.key, attempt, {
            "kind": "regenerate-failed" if comp.failure else "conflict", "story": story.key,
            "attempt": attempt, "strategy": comp.strategy, "conflicts": list(comp.conflicts),
            "target_sha": target_sha, "branch_sha": branch_sha, "candidate_ref": ref if preserved else None,
            "settled": [x.to_dict() for x in comp.settled],
            "regenerated": [r.to_dict() for r in comp.regenerated],
            **({"reason": comp.failure, "output": comp.failure_output} if comp.failure else {}),
        })
        with self.db.transaction() as s:
            cand = s.get_one(Candidate, cand_id)
            cand.state, cand.evidence, cand.ended_at = CandidateState.CONFLICT, str(evidence), utcnow()
            cand.ref = ref if preserved else None
            cand.candidate_sha = preserved
            cand.worktree = str(worktree) if worktree else None
            cand.reason = comp.failure or f"merge conflict with the target in {', '.join(comp.conflicts)}"
            if comp.failure:
                record(s, self.run_id, EventKind.CANDIDATE_REGENERATE_FAILED, story.key, attempt=attempt,
                       paths=list(comp.conflicts), reason=comp.failure,
                       commands=[r.to_dict() for r in comp.regenerated],
                       output=comp.failure_output[-2000:], evidence=str(evidence))
            else:
                record(s, self.run_id, EventKind.CANDIDATE_CONFLICT, story.key, attempt=attempt,
                       paths=list(comp.conflicts), evidence=str(evidence))

    def enter_integrating(self, s: Session, story: Story, *, to_escalate: bool = False) -> bool:
        """ready -> integrating, while the run may still integrate (a stop settles a run whose
        stories are only ready at once: then nothing lands). `to_escalate`: on the way to
        `escalated`, which needs no such check."""
        may_land = None if to_escalate else _RUN_MAY_LAND
        if not transition_story(s, story.id, StoryState.READY, when=may_land,
                                params=None if may_land is None else {"of_run": self.run_id},
                                state=StoryState.INTEGRATING):
            return False
        record(s, self.run_id, EventKind.STORY_INTEGRATING, story.key)
        return True

    def escalate(self, story: Story, cand_id: int | None, reason: str, cause: str) -> str:
        """`cause` (escalation.Cause) tells `resume` whether the story's own work failed or
        something outside it did: the latter goes back to `ready` without an agent."""
        with self.db.transaction() as s:
            row = s.get_one(Story, story.id)
            if row.state == StoryState.READY:  # found before composing, on the quick path
                self.enter_integrating(s, row, to_escalate=True)
            feedback = dict(row.feedback or {})
            # A fresh attempt after resume sees why integration failed.
            feedback["verify_output"] = f"Integration onto {self.target.branch} failed: {reason}"
            escalated = transition_story(s, story.id, StoryState.INTEGRATING, state=StoryState.ESCALATED,
                                         reason=reason, ended_at=utcnow(), feedback=feedback)
            if escalated:
                record(s, self.run_id, EventKind.STORY_ESCALATED, story.key, reason=reason,
                       candidate=cand_id, phase=Phase.INTEGRATE, cause=cause)
            row = s.get_one(Story, story.id)
        if escalated:
            self.workspace.restore_worktree(row)  # released at ready: a human gets it back
        return StoryState.ESCALATED

    def repair_or_escalate(self, story: Story, cand: Candidate, cause: str, details: dict[str, Any],
                           landed: list[dict[str, Any]]) -> str:
        """The story's own failure (`cause` conflict or verify-failed, its candidate `cand`):
        back to its agent for a repair while `[limits] max_repairs` lasts (`integrating →
        pending` at phase `repair`, next in plan order), else escalated as before."""
        limit = self.policy.limits.max_repairs
        reason = cand.reason or "candidate failed"
        with self.db.read() as s:
            used = s.get_one(Story, story.id).repairs
        if used >= limit or not self.workspace.story_worktrees:  # never in a person's checkout
            if limit and self.workspace.story_worktrees:
                reason = f"{reason} (repairs used up: {used} of max_repairs = {limit})"
            return self.escalate(story, cand.id, reason, cause)
        request = {"cause": cause, "reason": reason, "candidate": cand.attempt,
                   "target_sha": cand.target_sha, "landed": landed,
                   "conflicts": list(details.get("conflicts") or ()),
                   "command": details.get("command"), "log": details.get("log"),
                   "output": str(details.get("output") or "")[-8000:]}
        with self.db.transaction() as s:
            row = s.get_one(Story, story.id)
            if row.state == StoryState.READY:  # found on the quick path, before a row said so
                self.enter_integrating(s, row, to_escalate=True)
            sent = transition_story(s, story.id, StoryState.INTEGRATING, state=StoryState.PENDING,
                                    phase=Phase.REPAIR, dev_attempts=0, review_cycles=0,
                                    after_phase=None, feedback={REPAIR_KEY: request},
                                    wait_reason=None, reason=None, heartbeat_at=None)
            if sent:
                record(s, self.run_id, EventKind.REPAIR_REQUESTED, story.key, cause=cause,
                       reason=reason, candidate=cand.attempt, target_sha=cand.target_sha,
                       repairs=used, landed=[x["key"] for x in landed])
            row = s.get_one(Story, story.id)
        if sent:
            self.workspace.restore_worktree(row)  # released at ready: the repair works in it
        return row.state

    def record_verdict(self, story: Story, cand_id: int, attempt: int, result: VerifyResult,
                       worktree: Path | None, shas: tuple[str, str, str]) -> bool:
        """Write the verification's outcome on a `verifying` row: True for `verified`. A row
        that is no longer `verifying` (given up meanwhile) is left as it is: False."""
        target_sha, branch_sha, sha = shas
        commands = self.policy.verify.commands
        with self.db.transaction() as s:
            cand = s.get_one(Candidate, cand_id)
            if cand.state != CandidateState.VERIFYING:
                return False
            cand.worktree = str(worktree) if worktree else None
            cand.verify_s = round(result.duration_s, 3)
            if result.log_cut is not None:
                record(s, self.run_id, EventKind.LOG_TRUNCATED, story.key, phase="candidate verify",
                       attempt=attempt, log=result.log, **result.log_cut.event_data())
            if result.ok:
                cand.state = CandidateState.VERIFIED
                record_flakes(s, self.run_id, story.key, "candidate", result.flakes,
                              attempt=attempt, tree=sha)
                record(s, self.run_id, EventKind.CANDIDATE_VERIFIED, story.key, attempt=attempt,
                       duration_s=cand.verify_s, commands=len(commands), boxed=result.boxed)
                return True
        evidence = self.write_evidence(story.key, attempt, {
            "kind": "verify-failed", "story": story.key, "attempt": attempt,
            "target_sha": target_sha, "branch_sha": branch_sha, "candidate_sha": sha,
            "command": result.failed_command, "exit_code": result.exit_code,
            "timed_out": result.timed_out, "output": result.output, "log": result.log,
        })
        with self.db.transaction() as s:
            cand = s.get_one(Candidate, cand_id)
            if cand.state != CandidateState.VERIFYING:
                return False
            cand.state, cand.evidence, cand.ended_at = CandidateState.VERIFY_FAILED, str(evidence), utcnow()
            cand.reason = f"candidate verification failed: {result.failed_command}"
            record(s, self.run_id, EventKind.CANDIDATE_VERIFY_FAILED, story.key, attempt=attempt,
                   command=result.failed_command, evidence=str(evidence), boxed=result.boxed)
        return False

    def write_evidence(self, key: str, attempt: int, payload: dict[str, Any]) -> Path:
        path = self.layout.evidence(key, attempt)
        path.parent.mkdir(parents=True, exist_ok=True)
        if "settled" not in payload and path.exists():  # a later verdict keeps what was settled
            try:
                earlier = json.loads(path.read_text())
            except (OSError, ValueError):
                earlier = {}
            for kept in ("settled", "regenerated"):
                if kept in earlier:
                    payload = {**payload, kept: earlier[kept]}
        path.write_text(json.dumps(payload, indent=2, sort_keys=True))
        return path

    def drop_candidate(self, key: str, attempt: int, *, ref: bool = True) -> None:
        remove_worktree(self.git, self.layout.candidate_worktree(key, attempt))
        if ref:
            delete_ref(self.git, self.layout.candidate_ref(key, attempt))

    def clean_after_integration(self, story: Story, attempt: int) -> None:
        """Candidates and, per policy, the story's worktree and branch go once it landed."""
        with self.db.read() as s:
            # A ref the row does not name may still exist: one cut short between writing the
            # ref and its row (left `composing`, or `abandoned` by the lane that took over).
            attempts = [(n, ref is not None
                         or state in (CandidateState.COMPOSING, CandidateState.ABANDONED))
                        for n, ref, state in s.connection().execute(
                            _CANDIDATE_REFS, {"story_id": story.id})]
        for n, has_ref in attempts:
            self.drop_candidate(story.key, n, ref=has_ref)
        crash_point("lane.during_cleanup")
        # Its worktree and branch never change once it is ready: the row as integrated says them.
        self.workspace.discard_landed(story, delete_branch=self.policy.scm.delete_branch)

    def check_foreign_move(self, story: Story, target_now: str | None,
                            baseline: str | None = None) -> None:
        """The lane's baseline is the run's start, then each SHA it advanced to: a target found
        anywhere else was moved by someone else. Journaled; `pause` stops here for a human,
        `accept` takes it as the new baseline (the candidate is composed on top)."""
        if baseline is None:
            with self.db.transaction() as s:
                baseline = s.get_one(Run, self.run_id).head_sha
        if not target_now or not baseline or target_now == baseline:
            return
        commits = self._commits_between(baseline, target_now)
        action = self.policy.scm.on_foreign_move
        with self.db.transaction() as s:
            record(s, self.run_id, EventKind.TARGET_MOVED, story.key, old=baseline, new=target_now,
                   commits=commits[:50], action=action)
            if action == "accept":
                s.get_one(Run, self.run_id).head_sha = target_now
        if action != "accept":
            raise TargetMoved(baseline, target_now, commits)

    def _commits_between(self, old: str, new: str) -> list[str]:
        proc = self.git.run("rev-list", "--max-count=200", f"{old}..{new}", check=False)
        if proc.returncode != 0:  # `old` is not an ancestor we know (history rewritten)
            return [new]
        return proc.stdout.split()
