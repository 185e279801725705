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

from ..db.models import Run, Story
from ..states import check_transition

__all__ = ["transition_story", "transition_run"]


def _expected(expected) -> tuple[str, ...]:
    return (expected,) if isinstance(expected, str) else tuple(expected)


def transition_story(session: Session, story_id: int, expected, **values) -> bool:
    expected = _expected(expected)
    if "state" in values:
        for old in expected:
            check_transition("story", old, values["state"])
    result = session.execute(
        update(Story).where(Story.id == story_id, Story.state.in_(expected)).values(**values)
    )
    return result.rowcount == 1


def transition_run(session: Session, run_id: str, expected, **values) -> bool:
    expected = _expected(expected)
    if "state" in values:
        for old in expected:
            check_transition("run", old, values["state"])
    result = session.execute(
        update(Run).where(Run.id == run_id, Run.state.in_(expected)).values(**values)
    )
    return result.rowcount == 1
