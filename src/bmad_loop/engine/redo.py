"""Sending a story back to an earlier step: by `resume` (escalated, blocked) or by a person
(`bmad-loop retry STORY --from dev|review|integrate`).

- `integrate`: the commit its worker recorded (`head_sha`) goes back to `ready`; the lane
  composes, verifies and integrates it again. No agent session. A branch a person moved (they
  committed a fix on it, merged or rebased the target into it) is taken as their fix, as
  `resume` takes it (`to_human_fix`): its worktree verify runs, then the lane; no agent.
- `review`: back to `pending`; its worker verifies the branch as it is, then runs a review
  session (and fix cycles, as usual). No dev session.
- `dev`: back to `pending` with a fresh attempt budget; dev runs on the branch as it is.

Each is journaled as `story.retry` with `from` (the step), which also gives the story a fresh
recovery budget (recovery.RESET_KINDS). Open candidates of the story (a held one waiting for
sign-off, a verified one not yet advanced) are given up first: what lands is verified again.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..db.models import Candidate, Run, Story, utcnow
from ..errors import StateError
from ..states import CANDIDATE_OPEN, RUN_LIVE, RUN_RESUMABLE, CandidateState, Phase, StoryState
from .journal import EventKind, record
from .repairs import REPAIR_KEY
from .transitions import transition_story
from ..git.targets import Target

__all__ = ["FROM_STEPS", "RECOMPOSE_FLOOR", "RETRY_FROM", "to_ready", "to_review", "to_dev",
           "to_repair", "to_human_fix", "retry_story"]

FROM_STEPS = (Phase.DEV, Phase.REVIEW, Phase.INTEGRATE)
# Story feedback entries: stale compositions up to this candidate attempt were before the
# retry (they do not count against `max_recompose` again); the step a retry starts from.
RECOMPOSE_FLOOR = "recompose_after"
RETRY_FROM = "retry_from"
# What a retry may start from: a story no worker or lane holds, not landed.
RETRYABLE = frozenset({StoryState.ESCALATED, StoryState.BLOCKED, StoryState.HELD,
                       StoryState.READY, StoryState.PENDING})
_FEEDBACK_KEPT = ("verify_output", "review_notes", "pre_dirty")


def _give_up_candidates(session: Session, run_id: str, story: Story, why: str) -> int:
    """Abandon the story's open candidates; the highest candidate attempt so far (0: none)."""
    for cand in session.scalars(select(Candidate).where(Candidate.story_id == story.id,
                                                        Candidate.state.in_(CANDIDATE_OPEN))):
        was = cand.state
        cand.state, cand.ended_at, cand.reason = CandidateState.ABANDONED, utcnow(), why
        record(session, run_id, EventKind.CANDIDATE_ABANDONED, story.key, attempt=cand.attempt,
               was=was, reason=why)
    return session.scalar(select(func.max(Candidate.attempt))
                          .where(Candidate.story_id == story.id)) or 0


def to_ready(session: Session, run_id: str, story: Story, *, by: str, **data: Any) -> None:
    """Its recorded commit is composed, verified and integrated again, with no agent."""
    floor = _give_up_candidates(session, run_id, story, f"{by}: composed again")
    story.state, story.phase = StoryState.READY, Phase.COMMIT
    story.feedback = {RECOMPOSE_FLOOR: floor}
    story.human_fix, story.after_phase, story.signed_off = False, None, False
    story.reason, story.ended_at, story.ready_at = None, None, utcnow()
    story.repairs = 0  # a fresh repair budget, as every redo gives
    record(session, run_id, EventKind.STORY_RETRY, story.key, **{"from": Phase.INTEGRATE.value, "by": by,
                                                           "head_sha": story.head_sha, **data})


def to_human_fix(session: Session, run_id: str, story: Story, branch_head: str, *, by: str) -> None:
    """A person changed the story's branch (now at `branch_head`): it is verified in its
    worktree and integrated as their fix, with no agent session (`story.human_fix`)."""
    floor = _give_up_candidates(session, run_id, story, f"{by}: a person's fix is taken")
    story.state, story.phase = StoryState.PENDING, Phase.PREPARE
    story.feedback, story.human_fix, story.after_phase = {RECOMPOSE_FLOOR: floor}, True, None
    story.signed_off, story.head_sha = False, branch_head
    story.reason, story.ended_at = None, None
    record(session, run_id, EventKind.STORY_HUMAN_FIX, story.key, head_sha=branch_head, by=by)


def to_review(session: Session, run_id: str, story: Story, *, by: str, **data: Any) -> None:
    """Its branch is verified as it is, then reviewed (fix cycles as usual): no dev session."""
    _give_up_candidates(session, run_id, story, f"{by}: reviewed again")
    story.state, story.phase = StoryState.PENDING, Phase.VERIFY
    story.review_cycles, story.repairs = 0, 0
    story.feedback = {**_kept(story), RETRY_FROM: Phase.REVIEW.value, "verify_output": ""}
    story.human_fix, story.after_phase, story.signed_off = False, None, False
    story.reason, story.ended_at = None, None
    record(session, run_id, EventKind.STORY_RETRY, story.key, **{"from": Phase.REVIEW.value, "by": by, **data})


def to_dev(session: Session, run_id: str, story: Story, *, by: str, **data: Any) -> None:
    """A fresh attempt budget; dev runs again on the branch as it is."""
    _give_up_candidates(session, run_id, story, f"{by}: developed again")
    if story.phase in (Phase.COMMIT, Phase.INTEGRATE, None) or not story.worktree:
        story.phase = None  # prepare finds its branch and goes on to dev
    else:
        story.phase = Phase.DEV
    story.state = StoryState.PENDING
    story.dev_attempts, story.review_cycles, story.repairs = 0, 0, 0
    story.feedback = _kept(story)
    story.human_fix, story.after_phase, story.signed_off = False, None, False
    story.reason, story.ended_at = None, None
    record(session, run_id, EventKind.STORY_RETRY, story.key, **{"from": Phase.DEV.value, "by": by, **data})


def to_repair(session: Session, run_id: str, story: Story, target_sha: str | None, *, by: str,
              **data: Any) -> None:
    """Its repairs ran out: it is repaired again with a fresh budget, from a fresh merge of the
    target as the lane knows it now (`target_sha`)."""
    _give_up_candidates(session, run_id, story, f"{by}: repaired again")
    request = dict((story.feedback or {}).get(REPAIR_KEY) or {})
    if target_sha:
        request["target_sha"] = target_sha
    story.state, story.phase = StoryState.PENDING, Phase.REPAIR
    story.dev_attempts, story.review_cycles, story.repairs = 0, 0, 0
    story.feedback = {REPAIR_KEY: request}
    story.human_fix, story.after_phase, story.signed_off = False, None, False
    story.reason, story.ended_at = None, None
    record(session, run_id, EventKind.STORY_RETRY, story.key, **{"from": Phase.REPAIR.value, "by": by,
                                                           **data})


def _kept(story: Story) -> dict[str, Any]:
    return {k: v for k, v in (story.feedback or {}).items() if k in _FEEDBACK_KEPT}


def retry_story(session: Session, target: Target, run: Run, story: Story, start: str) -> bool:
    """`bmad-loop retry`: send `story` (a row of `session`, in `run`) back to `start`;
    `target` tells where its branch is now. StateError (exit 2) for a story that is being
    worked on, has ended, or cannot start there. True when the run is live (wake its lane)."""
    if run.state not in RUN_RESUMABLE | RUN_LIVE:
        raise StateError(f"run {run.id} is {run.state}: nothing to retry")
    if story.state not in RETRYABLE:
        ended = story.state in (StoryState.INTEGRATED, StoryState.SKIPPED, StoryState.FAILED)
        raise StateError(f"run {run.id}: story {story.key} is {story.state} "
                         f"({'it has ended' if ended else 'it is being worked on'}): nothing to retry")
    # The row held from here (its state as read, or this retry loses to whoever moved it).
    if not transition_story(session, story.id, story.state, state=story.state):
        raise StateError(f"run {run.id}: story {story.key} changed meanwhile: try again")
    session.refresh(story)
    now = target.story_head(story.branch) if story.branch else None
    if start != Phase.DEV and story.to_create:
        raise StateError(f"run {run.id}: story {story.key} has no story file yet: "
                         "only --from dev (its create phase runs first)")
    if start == Phase.INTEGRATE:
        if story.state in (StoryState.BLOCKED, StoryState.PENDING):
            raise StateError(f"run {run.id}: story {story.key} is {story.state}: it has no "
                             "finished work waiting to integrate; use --from dev or review")
        _check_recorded_head(run, story, now)
        assert now is not None  # refused just above when the branch has no head
        if now != story.head_sha:  # a person's fix on the branch: verified, then integrated
            record(session, run.id, EventKind.STORY_RETRY, story.key,
                   **{"from": Phase.INTEGRATE.value, "by": "retry", "head_sha": now,
                      "human_fix": True})
            to_human_fix(session, run.id, story, now, by="retry")
        else:
            to_ready(session, run.id, story, by="retry")
    elif start == Phase.REVIEW:
        if now is None:
            raise StateError(f"run {run.id}: story {story.key} has no branch to review: use --from dev")
        to_review(session, run.id, story, by="retry")
    else:
        to_dev(session, run.id, story, by="retry")
    return run.state in RUN_LIVE


def _check_recorded_head(run: Run, story: Story, now: str | None) -> None:
    if not story.head_sha or now is None:
        raise StateError(f"run {run.id}: story {story.key} has no finished commit on its branch "
                         f"{story.branch or '(none)'}: use --from dev")
