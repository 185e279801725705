"""Integrate one ready story: compose a candidate on the latest target, verify it, advance by CAS.

Runs only on the lane (the single `integration` consumer thread). Steps, each persisted on the
candidate row: composing → verifying → verified → advancing → advanced. A target that moved
between composition and advance is never force-moved: the candidate goes `stale` and the story
is recomposed on the new target (up to `max_recompose`), then escalated. Conflicts and
verification failures escalate with the candidate's ref, worktree and an evidence file kept.

Each attempt's candidate is composed by `Composer`: git's merge, the merge rules, the lane's
write-back, and the `regenerate` rules' commands run in the candidate (boxed as the lane's
verify commands are); what happens to the candidate next (its verification, the CAS) is the
`Integrator`'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, cast

from sqlalchemy import Table, bindparam, func, select, update
from sqlalchemy.orm import Session

from ...git.trees.merge import foreign_parents
from ...git.trees.settle import Generators
from ...git.trees.compose import (
    Composition,
    overlapping_dirty,
    LaneEdit,
    Settling,
    commit_message,
    compose,
    integration_message,
)
from ...db.database import insert_now
from ...db.models import Candidate, Run, Story, utcnow
from ...git.worktrees import ensure_detached_worktree
from ...states import CANDIDATE_OPEN, CandidateState, StoryState
from ..workspace import make_workspace
from ..crashpoints import crash_point, delay_point
from ..escalation import Cause
from .aftermath import LaneSite, Aftermath, TargetMoved
from ..journal import EventKind, journal_git_locks, record
from ..runpaths import Layout
from ..mergerules import append_ledger_lines
from ..redo import RECOMPOSE_FLOOR
from .regenerate import settled_events, GeneratorInput, regenerate
from ..runrows import board_rel
from ..transitions import transition_candidate, transition_story
from .blame import Blame
from ..verification.childenv import BoxSite, settle_after_box
from ..verification.runner import LaneVerifier
from ..mergerules import run_merge_rules
from .stacking import replay
from .writeback import lane_tree_edit
from ...policy import Policy

if TYPE_CHECKING:
    from ..project import Project
    from .writeback import LaneTreeEdit
__all__ = ["Integrator", "LaneFenced", "TargetMoved", "Composer"]


class LaneFenced(Exception):
    """This lane lost its lease to another one: it must not move the target."""


log = logging.getLogger(__name__)

# Statements every integration runs, built once (building one costs more than running it).
_CANDIDATES_OF = (select(Candidate).where(Candidate.story_id == bindparam("story_id"))
                  .order_by(Candidate.attempt.desc()))
_RUNS = cast(Table, Run.__table__)  # a mapped class's table is typed as any FromClause
_RUN_HEAD = select(_RUNS.c.head_sha).where(_RUNS.c.id == bindparam("run_id"))
_SET_RUN_HEAD = (update(_RUNS).where(_RUNS.c.id == bindparam("run_id"))
                 .values(head_sha=bindparam("head")))


@dataclass(frozen=True)
class _Known:
    """A story's candidate rows and the run's baseline, read as its integration begins."""

    latest: Candidate | None  # the last attempt
    attempts: int
    stale: int
    baseline: str | None  # the SHA the lane last advanced the target to (run.head_sha)


class CandidateShas(NamedTuple):
    """What a candidate was made of: the target it was composed on, the story's branch head,
    and the candidate commit itself (for its evidence)."""

    target_sha: str
    branch_sha: str
    sha: str


class Integrator:
    def __init__(self, project: Project, run: Run, policy: Policy,
                 fence: Callable[[], bool] | None = None) -> None:
        self.project = project
        self.db = project.db
        self.run_id = run.id
        self.policy = policy
        self.git = journal_git_locks(project.git(policy), self.db, run.id)
        self.target = project.target(self.git, run.target_branch)
        self.layout = Layout(project.state_dir, run.id)
        self.workspace = make_workspace(policy, self.git, self.layout, self.target, root=project.root)
        self.aftermath = Aftermath(LaneSite(self.db, self.run_id, self.git, self.layout, self.target,
                                          self.workspace, policy))
        self.board_rel = board_rel(run, project.root)
        self.composer = Composer(self, project.root)  # the candidate of each attempt
        self.fence = fence  # () -> bool: does this lane still hold its lease?
        # The lane's verifications (candidates, the target itself, generators), sized by the
        # run's max_parallel (its snapshot) when the stack shares out the lane's ports.
        self.verifier = LaneVerifier(policy, self.git, self.layout, self.run_id, run.max_parallel,
                                     home_state=self.db.lock_dir)
        # Whose fault a failed candidate is (target check, repair, escalation); the pass gives
        # the speculative stack one that checks the target in a thread (tick.py).
        self.blame = Blame(self)
        self.landed: list[tuple[Story, int]] = []  # integrated, not yet cleaned up
        self.between: Callable[[], None] | None = None  # called between a candidate's verdict and its landing

    def clean_landed(self) -> None:
        """Clean up after the stories integrated since the last call (see `_finish`). A crash
        before it leaves worktrees and refs no row owns; `cleanup` removes those."""
        while self.landed:
            story, attempt = self.landed.pop(0)
            self.aftermath.clean_after_integration(story, attempt)

    def integrate(self, story_id: int) -> str:
        """The story's state afterwards: integrated, held (waiting for sign-off), escalated, or the
        state it already had when it was not this lane's to integrate (e.g. another lane finished it)."""
        with self.db.read() as s:
            story = s.get_one(Story, story_id)
            if story.state not in (StoryState.READY, StoryState.INTEGRATING):
                return story.state
            known = self._known(s, story)
        # A ready story that nothing will wait on (no verify commands, no sign-off, nothing to
        # resume) enters `integrating` in the transaction that records its composition.
        # A failed candidate is decided on again only for a story a lane left integrating (it
        # died deciding); a ready one (a red target sent it back) is composed and verified anew.
        was_integrating = story.state == StoryState.INTEGRATING
        quick = (story.state == StoryState.READY and not self._keeps_candidate(story)
                 and (known.latest is None or known.latest.state not in CANDIDATE_OPEN))
        if story.state == StoryState.READY and not quick:
            with self.db.transaction() as s:
                if not self.aftermath.enter_integrating(s, story):
                    return s.get_one(Story, story_id).state
                story = s.get_one(Story, story_id)
        resumed = self._resume_candidate(story, known.latest, decide=was_integrating)
        if resumed:
            return resumed
        given: _Known | None = known
        while True:
            outcome = self._one_composition(story, given)
            given = None  # a stale candidate changed the rows: a recomposition reads them again
            if outcome != CandidateState.STALE:
                return outcome

    def _known(self, s: Session, story: Story) -> "_Known":
        cands = list(s.scalars(_CANDIDATES_OF, {"story_id": story.id}))
        floor = (story.feedback or {}).get(RECOMPOSE_FLOOR, 0)  # stale before a retry: spent
        return _Known(cands[0] if cands else None, len(cands),
                      sum(c.state == CandidateState.STALE and c.attempt > floor for c in cands),
                      s.connection().execute(_RUN_HEAD, {"run_id": self.run_id}).scalar())

    # ------------------------------------------------------------------ one attempt
    def _one_composition(self, story: Story, known: "_Known | None" = None) -> str:
        quick = not self._keeps_candidate(story)
        begun = self.begin_on_target(story, known, row=not quick)
        if isinstance(begun, str):
            return begun
        cand_id, attempt, target_sha, branch_sha = begun
        if quick:
            return self._compose_and_land(story, attempt, target_sha, branch_sha)
        assert cand_id is not None  # a candidate that keeps its row has one (`row=True`)
        sha = self.compose_candidate(story, cand_id, attempt, target_sha, branch_sha)
        if sha is None:
            return self.blame.decide(story, cand_id)  # a repair, or an escalation
        verdict = self._verify(story, cand_id, attempt, sha, target_sha, branch_sha)
        if verdict != CandidateState.VERIFIED:
            return verdict
        crash_point("lane.after_verify")
        if self.between is not None:
            self.between()  # the lane starts what a worker freed meanwhile (see tick.py)
        return self.land(story, cand_id, attempt, sha, target_sha)

    def land(self, story: Story, cand_id: int, attempt: int, sha: str, target_sha: str) -> str:
        """A verified candidate: hold it for sign-off, or advance the target to it."""
        if self._needs_sign_off(story):
            return self._hold(story, cand_id, attempt, sha)
        return self._advance(story, cand_id, attempt, sha, target_sha)

    def begin_on_target(self, story: Story, known: "_Known | None" = None, *,
                        row: bool = True) -> tuple[int | None, int, str, str] | str:
        """The checks before composing on the target itself, then the candidate row:
        (row id, attempt, target SHA, branch SHA), or the story's state when it escalated.
        `known`: the rows as `integrate` read them; `row` False: no row yet (id None)."""
        if known is None:
            with self.db.transaction() as s:
                known = self._known(s, story)
        stale = known.stale
        if stale > self.policy.limits.max_recompose:
            return self.aftermath.escalate(story, None, f"target kept moving: {stale} stale compositions "
                                  f"(max_recompose = {self.policy.limits.max_recompose})",
                                  Cause.TARGET_MOVING)
        target_sha = self.target.sha()
        self.aftermath.check_foreign_move(story, target_sha, known.baseline)
        missing = self.fetch_story(story)
        if missing:
            return self.aftermath.escalate(story, None, missing, Cause.BRANCH)
        # `fetch_story` found the story's head; a target with no SHA fails in the composition.
        on_sha, head = cast(str, target_sha), cast(str, story.head_sha)
        if not row:
            return None, known.attempts + 1, on_sha, head
        cand_id, attempt = self.new_candidate(story, on_sha, stack=1, on_id=None)
        return cand_id, attempt, on_sha, head

    def _keeps_candidate(self, story: Story) -> bool:
        """Something may take time with the candidate (its verification, an operator's
        sign-off): it gets a ref and a row at each step. Otherwise the CAS follows at once."""
        return bool(self.policy.verify.commands) or story.merge_class == "operator"

    def _compose_and_land(self, story: Story, attempt: int, target_sha: str,
                          branch_sha: str) -> str:
        """Nothing waits on this candidate: its row is written once it is composed, and steps
        through `verifying` and `verified` (by no command) to `advancing` in that transaction.
        A crash before it leaves no row to resume: the story is simply composed again."""
        strategy = self.policy.scm.merge_strategy
        comp = self.composer.compose(story, strategy, target_sha, branch_sha, attempt)
        crash_point("lane.after_compose")
        delay_point("lane.in_compose")
        with self.db.transaction() as s:
            if story.state == StoryState.READY:
                if not self.aftermath.enter_integrating(s, story):  # stopped meanwhile, or not ours
                    return s.get_one(Story, story.id).state
                story.state = StoryState.INTEGRATING
            cand = Candidate(run_id=self.run_id, story_id=story.id, attempt=attempt,
                             strategy=strategy, target_sha=target_sha, branch_sha=branch_sha,
                             stack=1, state=CandidateState.COMPOSING)
            if not comp.conflicts:
                cand.candidate_sha, cand.verify_s = comp.sha, 0.0
                for step in (CandidateState.VERIFYING, CandidateState.VERIFIED,
                             CandidateState.ADVANCING):
                    cand.state = step  # each step of the machine, in this one transaction
                self._record_composed(s, story, cand, comp, target_sha, branch_sha)
                record(s, self.run_id, EventKind.CANDIDATE_VERIFIED, story.key, attempt=attempt,
                       duration_s=0.0, commands=0)
            cand_id = insert_now(s, cand)  # nobody reads the object back
        if comp.conflicts:
            ref = self.layout.candidate_ref(story.key, attempt)
            self.aftermath.record_conflict(story, cand_id, attempt, comp, target_sha, branch_sha, ref)
            return self.blame.decide(story, cand_id)  # a repair, or an escalation
        crash_point("lane.after_verify")
        if self.between is not None:
            self.between()
        sha = cast(str, comp.sha)  # composed without conflicts: a commit
        return self._advance(story, cand_id, attempt, sha, target_sha, advancing=True)

    def new_candidate(self, story: Story, on_sha: str, *, stack: int,
                      on_id: int | None) -> tuple[int, int]:
        """A `composing` row for the story's next attempt, composed on `on_sha`."""
        with self.db.transaction() as s:
            attempts = s.scalar(select(func.count()).select_from(Candidate)
                                .where(Candidate.story_id == story.id)) or 0
            cand = Candidate(run_id=self.run_id, story_id=story.id, attempt=attempts + 1,
                             strategy=self.policy.scm.merge_strategy, state=CandidateState.COMPOSING,
                             target_sha=on_sha, branch_sha=story.head_sha, stack=stack,
                             on_candidate_id=on_id)
            s.add(cand)
            s.flush()
            return cand.id, cand.attempt

    def compose_candidate(self, story: Story, cand_id: int, attempt: int, on_sha: str,
                          branch_sha: str) -> str | None:
        """Compose the candidate on `on_sha` and move its row to `verifying`: its SHA. On a
        conflict the row becomes `conflict` (tree and evidence kept) and None is returned;
        escalating the story is the caller's call."""
        strategy = self.policy.scm.merge_strategy
        comp = self.composer.compose(story, strategy, on_sha, branch_sha, attempt)
        ref = self.layout.candidate_ref(story.key, attempt)
        if comp.conflicts:
            self.aftermath.record_conflict(story, cand_id, attempt, comp, on_sha, branch_sha, ref)
            return None
        keep = self._keeps_candidate(story)  # else the CAS follows at once and the target keeps it
        if keep:
            self.git.run("update-ref", ref, comp.sha)
        crash_point("lane.after_compose")
        with self.db.transaction() as s:
            cand = s.get_one(Candidate, cand_id)
            cand.candidate_sha, cand.ref, cand.state = comp.sha, ref if keep else None, CandidateState.VERIFYING
            self._record_composed(s, story, cand, comp, on_sha, branch_sha)
        return comp.sha

    def _record_composed(self, s: Session, story: Story, cand: Candidate, comp: Composition,
                         on_sha: str,
                         branch_sha: str) -> None:
        record(s, self.run_id, EventKind.CANDIDATE_COMPOSED, story.key, attempt=cand.attempt,
               strategy=cand.strategy, target_sha=on_sha, branch_sha=branch_sha,
               candidate_sha=comp.sha, rebased=comp.rebased, stack=cand.stack,
               **({"on": cand.on_candidate_id} if cand.on_candidate_id else {}))
        if comp.settled:
            self._record_settled(s, story, cand, comp)

    def _record_settled(self, s: Session, story: Story, cand: Candidate, comp: Composition) -> None:
        """Each path a merge rule settled: journaled, and kept in the candidate's evidence."""
        events, evidence = settled_events(comp)
        for data in events:
            record(s, self.run_id, EventKind.CANDIDATE_SETTLED, story.key, attempt=cand.attempt, **data)
        cand.evidence = str(self.aftermath.write_evidence(story.key, cand.attempt, {
            **evidence, "story": story.key, "attempt": cand.attempt}))

    def candidate_reason(self, cand_id: int) -> str:
        with self.db.transaction() as s:
            return s.get_one(Candidate, cand_id).reason or "candidate failed"

    def fetch_story(self, story: Story) -> str | None:
        """Bring the story's commits here (remote mode: from the remote); why not, when the
        branch is not where its worker recorded it."""
        # The lane integrates the commit the row recorded at `ready`, never whatever the branch
        # points at now: a sibling agent may have written into another story's branch.
        where = self.target.location
        now = self.target.story_head(cast(str, story.branch))  # a ready story has its branch
        if now == story.head_sha:
            return self.foreign_parent(story)
        with self.db.transaction() as s:
            record(s, self.run_id, EventKind.STORY_BRANCH_MISMATCH, story.key, branch=story.branch,
                   recorded=story.head_sha, found=now)
        if now is None:
            return f"the story branch {story.branch} is not on {where}"
        return (f"the story branch {story.branch} on {where} is at {now[:12]}, "
                f"not at the {cast(str, story.head_sha)[:12]} its worker recorded")

    def foreign_parent(self, story: Story) -> str | None:
        """Why the story's commits are not all its own (git/trees/merge.py): e.g. a planted
        MERGE_HEAD or an agent's merge made a sibling's tip a parent. None: they are."""
        bad = story.base_sha and story.head_sha and \
            foreign_parents(self.git, story.base_sha, story.head_sha)
        if not bad:
            return None
        commit, parent = bad[0]
        return (f"commit {commit[:12]} of the story branch {story.branch} has a parent "
                f"{parent[:12]} that is neither the story's own commit nor on its base "
                f"{cast(str, story.base_sha)[:12]}")  # `bad` needs a base

    def _needs_sign_off(self, story: Story) -> bool:
        if story.merge_class != "operator":
            return False
        with self.db.transaction() as s:
            row = s.get_one(Story, story.id)
            return row.merge_class == "operator" and not row.signed_off

    def _hold(self, story: Story, cand_id: int, attempt: int, sha: str) -> str:
        """merge_class = operator: the verified candidate waits for `approve` or `reject`."""
        with self.db.transaction() as s:
            cand = s.get_one(Candidate, cand_id)
            if transition_story(s, story.id, StoryState.INTEGRATING, state=StoryState.HELD,
                                reason="waiting for operator sign-off (bmad-loop approve/reject)"):
                record(s, self.run_id, EventKind.STORY_HELD, story.key, attempt=attempt, candidate_sha=sha,
                       ref=cand.ref, worktree=cand.worktree)
        return StoryState.HELD

    def _verify(self, story: Story, cand_id: int, attempt: int, sha: str, target_sha: str,
                branch_sha: str) -> str:
        verifier = self.verifier
        worktree = verifier.candidate_checkout(story.key, attempt, sha)
        result = verifier.verify_candidate(story.key, attempt, worktree, sha, verifier.env())
        if self.aftermath.record_verdict(story, cand_id, attempt, result, worktree,
                               CandidateShas(target_sha, branch_sha, sha)):
            return CandidateState.VERIFIED
        with self.db.read() as s:
            if s.get_one(Candidate, cand_id).state != CandidateState.VERIFY_FAILED:
                return s.get_one(Story, story.id).state  # given up meanwhile: nothing to decide
        crash_point("lane.before_blame")
        return self.blame.decide(story, cand_id)  # the target checked, then a repair

    def _advance(self, story: Story, cand_id: int, attempt: int, sha: str, target_sha: str, *,
                 advancing: bool = False) -> str:
        # The target checkout's index is held from before the CAS until it follows the new
        # target (remote mode keeps none in step): nobody sees it half-way.
        with self._checkout_held() as checkout:
            if checkout is not None:
                overlap = overlapping_dirty(self.git, checkout, target_sha, sha)
                if overlap:
                    return self.aftermath.dirty_checkout(story, cand_id, attempt, checkout, overlap,
                                                target_sha, sha)
            if not advancing:
                with self.db.transaction() as s:
                    s.get_one(Candidate, cand_id).state = CandidateState.ADVANCING
            if self.fence is not None and not self.fence():
                raise LaneFenced(f"lost the lane lease before advancing {self.target.branch} "
                                 f"for {story.key}")
            advanced = self.target.advance(sha, target_sha)
            crash_point("lane.after_cas")
            if advanced and checkout is not None:
                self.target.sync_checkout(checkout, target_sha, sha)
                crash_point("lane.after_sync")
        if not advanced:
            with self.db.transaction() as s:
                cand = s.get_one(Candidate, cand_id)
                cand.state, cand.ended_at = CandidateState.STALE, utcnow()
                now_at = self.target.sha(fetch=False)
                record(s, self.run_id, EventKind.CANDIDATE_STALE, story.key, attempt=attempt,
                       composed_on=target_sha, target_now=now_at)
            self.aftermath.drop_candidate(story.key, attempt)
            self.aftermath.check_foreign_move(story, now_at)  # pause, or accept and recompose
            return CandidateState.STALE
        return self._finish(story, cand_id, attempt, sha, target_sha)

    def _checkout_held(self) -> AbstractContextManager[Path | None]:
        def waited(path: str) -> None:
            with self.db.transaction() as s:
                record(s, self.run_id, EventKind.GIT_LOCK_WAITED, path=path, step="checkout sync")

        def stale(path: str) -> None:
            with self.db.transaction() as s:
                record(s, self.run_id, EventKind.GIT_STALE_LOCK_REMOVED, path=path, step="checkout sync")

        return self.target.checkout_held(wait_s=self.policy.scm.lock_wait_s, on_wait=waited,
                                         on_stale=stale)

    def _finish(self, story: Story, cand_id: int, attempt: int, sha: str, target_sha: str) -> str:
        # A git-ignored ledger's lines follow the advance, before the row says integrated: a
        # kill -9 in between is finished by the next lane, and the append is written once.
        append_ledger_lines(self.project.root, self.project.state_dir, self.run_id, story.key,
                            story.ledger_lines or {})  # (None and {} append nothing alike)
        with self.db.transaction() as s:
            if not transition_story(s, story.id, StoryState.INTEGRATING, state=StoryState.INTEGRATED,
                                    integrated_sha=sha, ended_at=utcnow(), phase=None,
                                    port_block=None):
                return s.get_one(Story, story.id).state  # another lane finished it: record nothing
            if not transition_candidate(s, cand_id, CandidateState.ADVANCING,
                                        state=CandidateState.ADVANCED, ended_at=utcnow()):
                cand = s.get_one(Candidate, cand_id)  # not advancing: as the row's checks say
                cand.state, cand.ended_at = CandidateState.ADVANCED, utcnow()
            s.connection().execute(_SET_RUN_HEAD, {"run_id": self.run_id, "head": sha})
            record(s, self.run_id, EventKind.TARGET_ADVANCED, story.key, attempt=attempt,
                   old=target_sha, new=sha, strategy=self.policy.scm.merge_strategy)
            record(s, self.run_id, EventKind.STORY_INTEGRATED, story.key, sha=sha)
        # Its worktree, if its worker did not park it at ready, goes now (parked for the next
        # story to take); the rest of the clean-up waits until the lane has started what can
        # start now (`clean_landed`). Worktree and branch never change once a story is ready.
        self.workspace.release_worktree(story)
        self.landed.append((story, attempt))
        return StoryState.INTEGRATED

    def _resume_candidate(self, story: Story, cand: Candidate | None, *,
                          decide: bool = True) -> str | None:
        """A lane that died mid-integration: pick up its last candidate (`cand`) where it stopped."""
        if cand is None:
            return None
        if cand.state in (CandidateState.VERIFY_FAILED, CandidateState.CONFLICT):
            # It failed on the target as it still is, and died before deciding what follows.
            if (decide and cand.branch_sha == story.head_sha
                    and cand.target_sha == self.target.sha()):
                return self.blame.decide(story, cand.id)
            return None
        if cand.state not in CANDIDATE_OPEN:
            return None
        target_now = self.target.sha()
        if cand.candidate_sha and target_now == cand.candidate_sha:
            return self.finish_after_crash(story, cand)
        # A lane in another clone (the old one's host died) lacks the candidate: recompose.
        here = cand.candidate_sha and self.git.rev(cand.candidate_sha) is not None
        if cand.state in (CandidateState.VERIFIED, CandidateState.ADVANCING) and target_now == cand.target_sha and here:
            sha = cast(str, cand.candidate_sha)  # `here`: the candidate has a commit
            return self._advance(story, cand.id, cand.attempt, sha, cand.target_sha)
        with self.db.transaction() as s:
            row = s.get_one(Candidate, cand.id)
            row.state, row.ended_at = CandidateState.ABANDONED, utcnow()
            row.reason = "interrupted; recomposed"
            record(s, self.run_id, EventKind.CANDIDATE_ABANDONED, story.key, attempt=cand.attempt,
                   was=cand.state, reason=row.reason)
        return None

    def finish_after_crash(self, story: Story, cand: Candidate) -> str:
        """The CAS to `cand` happened but the row was not written: that counts as advanced. The
        checkout may be half-way (a crash during its sync): the sync is idempotent."""
        sha = cast(str, cand.candidate_sha)  # the target is at it
        with self._checkout_held() as checkout:
            if checkout is not None:
                self.target.sync_checkout(checkout, cand.target_sha, sha)
        return self._finish(story, cand.id, cand.attempt, sha, cand.target_sha)


class Composer:
    """Needs from the lane's integration (`lane`): git, policy, layout, run_id, board_rel, and
    its `verifier` (the environment and the box of a command run for the lane)."""

    def __init__(self, lane: Integrator, root: Path) -> None:
        self.lane = lane
        self.rules = run_merge_rules(lane.policy, root, lane.board_rel)

    def compose(self, story: Story, strategy: str, target_sha: str, branch_sha: str,
                attempt: int) -> Composition:
        """The candidate. A story that started on a stacked base brings only its own commits
        (`base_sha..head`): they are replayed onto the target first, then composed as usual.
        Merge rules settle what they cover (git/trees/settle.py); generators run last."""
        git, rules, settled = self.lane.git, self.rules, None
        if story.stacked_on:
            # A stacked start records its base.
            replayed = replay(git, target_sha, cast(str, story.base_sha), branch_sha, rules)
            if replayed.tip is None:
                return Composition(None, replayed.tree, replayed.conflicts, strategy, True,
                                   replayed.settled, replayed.regenerate)
            branch_sha, settled = replayed.tip, replayed
            rules = type(rules)()  # the replay settled the story's own change
        board_edit = self._board_edit(story)  # None: the run has no board and no story file
        comp = compose(git, strategy, target_sha, branch_sha, self._message(story, strategy),
                       edit=None if board_edit is None else
                       LaneEdit(board_edit, f"bmad-loop: mark {story.key} done"),
                       # A repaired story's branch holds its own version of a generator's
                       # paths (the repair merge kept it): regenerate them whatever conflicts.
                       settling=Settling(rules, None if story.stacked_on else story.base_sha,
                                         Generators.EVERY if story.repairs
                                         else Generators.AS_RULED))
        if settled is not None:
            comp = replace(comp, settled=settled.settled, regenerate=settled.regenerate)
        if comp.ok and comp.regenerate:
            comp = self._regenerate(story, attempt, comp, target_sha, branch_sha)
        return comp

    def _regenerate(self, story: Story, attempt: int, comp: Composition, target_sha: str,
                    branch_sha: str) -> Composition:
        lane = self.lane
        base = story.base_sha or lane.git.out("merge-base", target_sha, branch_sha)
        worktree = lane.layout.candidate_worktree(story.key, attempt)
        log_path = lane.layout.verify_log(story.key, f"regenerate-{attempt}")
        scratch = lane.layout.scratch(story.key) / f"regenerate-{attempt}"
        ensure_detached_worktree(lane.git, worktree, cast(str, comp.sha))  # composed: a commit
        env = lane.verifier.env()
        box = lane.verifier.box(BoxSite(worktree, scratch, log_path), env)
        try:
            return regenerate(lane.git, GeneratorInput(comp, base, target_sha, branch_sha, story.key),
                              worktree=worktree, log_path=log_path, env=env, run_id=lane.run_id,
                              box=box)
        finally:
            if box is not None:
                settle_after_box(lane.git, worktree, None, scratch)

    def _message(self, story: Story, strategy: str) -> str:
        title = commit_message(self.lane.policy.scm.commit_message_template, story_key=story.key,
                               story_title=story.title, run_id=self.lane.run_id, epic=story.epic)
        return integration_message(title, strategy, cast(str, story.branch))  # a ready story's

    def _board_edit(self, story: Story) -> LaneTreeEdit | None:
        """The lane's BMAD write-back inside the candidate: board line, epic line, story file."""
        return lane_tree_edit(self.lane.git, key=story.key, epic=story.epic,
                              board_rel=self.lane.board_rel, story_path=story.story_path)
