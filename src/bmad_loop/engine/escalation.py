"""Escalations: a story step's `Escalate`, and why a story escalated at integration, as the
lane records it and `resume` reads it.

Every `story.escalated` the lane writes carries a `cause`. Some causes are the story's own
work: a merge conflict with the target (`conflict`), a candidate whose verification failed
(`verify-failed`), a branch that is not where its worker left it (`branch`). The others stood outside
the story: local changes in the target checkout overlapping the candidate (`checkout`), a
target that kept moving under it (`target-moving`), a verification that could not even run
(`fault`). Once such a cause is gone nothing about the story needs redoing: `resume` sends it
back to `ready` and the lane composes, verifies and integrates the very commit again, with no
agent session — provided its branch still points at that commit.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from ..db.models import Event
from ..states import CandidateState, Phase
from .journal import EventKind

__all__ = ["Escalate", "Cause", "ENVIRONMENTAL", "COULD_NOT_RUN", "failure_cause",
           "integration_cause"]


class Escalate(Exception):
    """End this story's work as escalated, with a reason and evidence (and the session, if any)."""

    # `result`: the worker's session result, carried back to it; opaque at this layer.
    def __init__(self, reason: str, *, result: Any = None, **evidence: Any) -> None:
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence
        self.result = result


class Cause:
    CONFLICT = CandidateState.CONFLICT.value  # the story's own: its failed candidate's state
    VERIFY = CandidateState.VERIFY_FAILED.value
    BRANCH = "branch"
    CHECKOUT = "checkout"
    TARGET_MOVING = "target-moving"
    FAULT = "fault"


ENVIRONMENTAL = frozenset({Cause.CHECKOUT, Cause.TARGET_MOVING, Cause.FAULT})

# How a candidate verification that raised before any verdict names its "failed command".
COULD_NOT_RUN = "(verification could not run"

_LAST_ESCALATION = (select(Event.data).where(Event.run_id == bindparam("run_id"),
                                             Event.story == bindparam("key"),
                                             Event.kind == EventKind.STORY_ESCALATED)
                    .order_by(Event.seq.desc()).limit(1))


def failure_cause(state: str, reason: str | None) -> str:
    """The cause of a failed (conflict or verify-failed) candidate's escalation."""
    if state == CandidateState.CONFLICT:
        return Cause.CONFLICT
    if reason and COULD_NOT_RUN in reason:
        return Cause.FAULT
    return Cause.VERIFY


def integration_cause(session: Session, run_id: str, key: str) -> str | None:
    """The cause of the story's last escalation when it happened at integration, else None."""
    data = session.execute(_LAST_ESCALATION, {"run_id": run_id, "key": key}).scalar()
    if not isinstance(data, dict) or data.get("phase") != Phase.INTEGRATE:
        return None
    return data.get("cause")
