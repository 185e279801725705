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
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql.elements import ClauseElement

from ..db.models import Attempt, Candidate, Run, Story
from ..states import check_transition

__all__ = ["transition_story", "transition_story_reading", "transition_run", "transition_attempt",
           "transition_candidate"]


def _transition(session: Session, model, machine: str, row_id, expected, values: dict,
                when=None, returning=None):
    """None when this caller lost; else the row `returning` read in the UPDATE (an empty
    tuple without one)."""
    expected = (expected,) if isinstance(expected, str) else tuple(expected)
    if "state" in values:
        for old in expected:
            check_transition(machine, old, values["state"])
    # A Core UPDATE on the session's connection: the ORM's bulk UPDATE costs twice as much
    # CPU here, and these run about six times per story. What it did besides is done by hand:
    # pending changes (new, changed or deleted rows) are flushed first, as its autoflush did
    # (a clean session's flush returns at once), and a row this session holds takes the new
    # values (its "evaluate" synchronisation).
    session.flush()
    table = model.__table__
    guard = [table.c.id == row_id, table.c.state.in_(expected)]
    if when is not None:  # a further condition, e.g. on the run's row: checked in the UPDATE
        guard.append(when)
    statement = update(table).where(*guard).values(**values)
    if returning is None:
        won = () if session.connection().execute(statement).rowcount == 1 else None
    else:
        won = session.connection().execute(statement.returning(returning)).first()
    if won is None:
        return None
    held = session.identity_map.get(session.identity_key(model, row_id))
    if held is not None:
        computed = [key for key, value in values.items() if isinstance(value, ClauseElement)]
        for key, value in values.items():
            if key not in computed:
                set_committed_value(held, key, value)
        if computed:  # e.g. `claim = claim + 1`: read again when asked for
            session.expire(held, computed)
    return won


def transition_story(session: Session, story_id: int, expected, /, *, when=None,
                     **values) -> bool:
    """`when`: a further SQL condition the row must meet (it loses otherwise)."""
    return _transition(session, Story, "story", story_id, expected, values, when) is not None


def transition_story_reading(session: Session, story_id: int, expected, returning, /, *,
                             when=None, **values):
    """`transition_story` that also reads `returning` (an SQL expression) in its UPDATE: the
    row it read, or None when this caller lost."""
    return _transition(session, Story, "story", story_id, expected, values, when, returning)


def transition_run(session: Session, run_id: str, expected, **values) -> bool:
    return _transition(session, Run, "run", run_id, expected, values) is not None


def transition_attempt(session: Session, attempt_id: int, expected, **values) -> bool:
    return _transition(session, Attempt, "attempt", attempt_id, expected, values) is not None


def transition_candidate(session: Session, candidate_id: int, expected, **values) -> bool:
    return _transition(session, Candidate, "candidate", candidate_id, expected, values) is not None
