"""Guarded transitions: conditional UPDATEs that only the caller who wins may make.

`… WHERE id = :id AND state IN (:expected)`: the rowcount says whether this caller won, so a
duplicate queue message or a racing lane is harmless. Each (expected, new) pair must be in the
machine's transition table (`bmad_loop.states`): asking for one that is not raises
`IllegalTransition` before anything is written. (Assignments through the ORM are checked by the
models' validators; bulk UPDATEs bypass those, hence the check here.)
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from ..db.models import Attempt, Candidate, Run, Story
from ..states import check_transition

__all__ = ["transition_story", "transition_run", "transition_attempt", "transition_candidate"]


def _transition(session: Session, model, machine: str, row_id, expected, values: dict) -> bool:
    expected = (expected,) if isinstance(expected, str) else tuple(expected)
    if "state" in values:
        for old in expected:
            check_transition(machine, old, values["state"])
    result = session.execute(
        update(model).where(model.id == row_id, model.state.in_(expected)).values(**values)
    )
    return result.rowcount == 1


def transition_story(session: Session, story_id: int, expected, **values) -> bool:
    return _transition(session, Story, "story", story_id, expected, values)


def transition_run(session: Session, run_id: str, expected, **values) -> bool:
    return _transition(session, Run, "run", run_id, expected, values)


def transition_attempt(session: Session, attempt_id: int, expected, **values) -> bool:
    return _transition(session, Attempt, "attempt", attempt_id, expected, values)


def transition_candidate(session: Session, candidate_id: int, expected, **values) -> bool:
    return _transition(session, Candidate, "candidate", candidate_id, expected, values)
