"""Verdicts that no longer hold: dropped on `resume` when the checks or the target changed.

A `verified` candidate waiting to advance (or for sign-off) was verified by the run's checks
as they were, on the target as it was. When `resume --reload-policy` changes what verification
runs (`reverify_reason`), or `resume` adopts a target someone else moved, such a verdict says
nothing any more: every candidate still `verified` is given up (`abandoned`, journaled
`candidate.reverify_policy`) and its story goes back to `ready`, so the lane composes and
verifies it again under the checks in force. An `advancing` candidate is left alone (its
advance may have happened); a `verifying` one is verified again anyway, by the new checks.
"""

from __future__ import annotations

from sqlalchemy import select

from ..db.models import Candidate, Story, utcnow
from ..states import CandidateState, StoryState
from .journal import record
from .transitions import transition_story

__all__ = ["reverify_reason", "drop_verified"]

# Reloaded keys that change what a candidate's verification runs or sees (`verify.parallel`
# only says how many run at once).
_VERIFY_SECTIONS = ("verify.", "resources.ports")
_NOT_A_CHECK = ("verify.parallel",)


def reverify_reason(changed: list[str]) -> str | None:
    """Why verdicts given before a policy reload that changed `changed` no longer hold."""
    keys = [k for k in changed if k.startswith(_VERIFY_SECTIONS) and k not in _NOT_A_CHECK]
    return f"the reloaded policy changed {', '.join(keys)}" if keys else None


def drop_verified(session, run_id: str, reason: str, target_now: str | None) -> list[str]:
    """Give up the run's `verified` candidates; their stories back to `ready`. Their keys.
    One the target points at already (advanced, its row not written: a crash) is kept."""
    keys = []
    cands = list(session.scalars(select(Candidate).where(
        Candidate.run_id == run_id, Candidate.state == CandidateState.VERIFIED)
        .order_by(Candidate.id)))
    for cand in cands:
        if target_now is not None and cand.candidate_sha == target_now:
            continue
        story = session.get(Story, cand.story_id)
        cand.state, cand.ended_at = CandidateState.ABANDONED, utcnow()
        cand.reason = f"verified before {reason}: verified again"
        transition_story(session, story.id, (StoryState.INTEGRATING, StoryState.HELD,
                                             StoryState.READY),
                         state=StoryState.READY, signed_off=False)
        record(session, run_id, "candidate.reverify_policy", story.key, attempt=cand.attempt,
               candidate_sha=cand.candidate_sha, reason=reason)
        keys.append(story.key)
    return keys
