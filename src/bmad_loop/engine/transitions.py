"""Guarded transitions: conditional UPDATEs that only the caller who wins may make.

`… WHERE id = :id AND state IN (:expected)`: the rowcount says whether this caller won, so a
duplicate queue message or a racing lane is harmless. Each (expected, new) pair must be in the
machine's transition table (`bmad_loop.states`): asking for one that is not raises
`IllegalTransition` before anything is written. (Assignments through the ORM are checked by the
models' validators; bulk UPDATEs bypass those, hence the check here.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Row, Table, bindparam, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql.dml import Update
from sqlalchemy.sql.elements import ClauseElement, ColumnElement

from ..db.models import Attempt, Base, Candidate, Run, Story
from ..states import check_transition
from ..caches import CACHES

__all__ = ["transition_story", "transition_story_reading", "transition_run", "transition_attempt",
           "transition_candidate"]


@dataclass(frozen=True)
class _Extra:
    """What a transition may add to its UPDATE: `when`, a further condition the row must meet;
    `returning`, what the UPDATE reads back; `params`, the bind parameters of those clauses
    (so a clause built once serves every call: see `_statement`)."""

    when: ColumnElement[bool] | None = None
    returning: ColumnElement[Any] | None = None
    params: dict[str, Any] | None = None


_PLAIN = _Extra()

# The state (or states) a row must be in for the transition to win.
Expected = str | Iterable[str]


def _transition(session: Session, model: type[Base], machine: str, row_id: int | str,
                expected: Expected, values: dict[str, Any],
                extra: _Extra = _PLAIN) -> Row[Any] | tuple[()] | None:
    """None when this caller lost; else the row `extra.returning` read in the UPDATE (an
    empty tuple without one)."""
    when, returning, params = extra.when, extra.returning, extra.params
    states = (expected,) if isinstance(expected, str) else tuple(expected)
    if "state" in values:
        for old in states:
            check_transition(machine, old, values["state"])
    # A Core UPDATE on the session's connection: the ORM's bulk UPDATE costs twice as much
    # CPU here, and these run about six times per story. What it did besides is done by hand:
    # pending changes (new, changed or deleted rows) are flushed first, as its autoflush did
    # (a clean session's flush returns at once), and a row this session holds takes the new
    # values (its "evaluate" synchronisation).
    session.flush()
    table = cast(Table, model.__table__)  # a mapped class's table is typed as any FromClause
    statement = _statement(table, states, values, when, returning)
    bound = {f"{_VALUE}{name}": value for name, value in values.items()
             if not isinstance(value, ClauseElement)}
    bound[_ROW] = row_id
    if params:
        bound.update(params)
    won: Row[Any] | tuple[()] | None
    if returning is None:
        won = () if session.connection().execute(statement, bound).rowcount == 1 else None
    else:
        won = session.connection().execute(statement, bound).first()
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


# The UPDATE of each shape (table, expected states, columns set, further condition, what it
# reads), built once with bind parameters: building the statement cost three times as much
# CPU as running it. A computed value or a clause is part of the shape by identity, and its
# entry holds it, so an identity is never reused while cached: a clause built for one call
# only costs what it did before. Bounded: the shapes in the code are a few dozen.
_VALUE, _ROW = "new_", "row_id_"
_STATEMENTS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_KEPT_STATEMENTS = 256
CACHES.register("engine.transition_statements", _STATEMENTS.clear,
               bound=f"{_KEPT_STATEMENTS} shapes", holds="an UPDATE's shape -> its statement")


def _statement(table: Table, expected: tuple[str, ...], values: dict[str, Any],
               when: ColumnElement[bool] | None, returning: ColumnElement[Any] | None) -> Update:
    shape = (table.name, expected, id(when), id(returning),
             tuple((name, id(value)) if isinstance(value, ClauseElement) else name
                   for name, value in values.items()))
    cached = _STATEMENTS.get(shape)
    if cached is not None:
        return cast(Update, cached[0])
    guard = [table.c.id == bindparam(_ROW), table.c.state.in_(expected)]
    if when is not None:  # a further condition, e.g. on the run's row: checked in the UPDATE
        guard.append(when)
    statement = update(table).where(*guard).values(
        {name: value if isinstance(value, ClauseElement) else bindparam(f"{_VALUE}{name}")
         for name, value in values.items()})
    if returning is not None:
        statement = statement.returning(returning)
    if len(_STATEMENTS) >= _KEPT_STATEMENTS:
        _STATEMENTS.clear()
    # The entry holds what `shape` names by identity, so none of them is freed while it lasts.
    _STATEMENTS[shape] = (statement, when, returning,
                          [value for value in values.values() if isinstance(value, ClauseElement)])
    return statement


def transition_story(session: Session, story_id: int, expected: Expected, /, *,
                     when: ColumnElement[bool] | None = None, params: dict[str, Any] | None = None,
                     **values: Any) -> bool:
    """`when`: a further SQL condition the row must meet (it loses otherwise); `params` fills
    its bind parameters."""
    return _transition(session, Story, "story", story_id, expected, values,
                       _Extra(when, None, params)) is not None


def transition_story_reading(session: Session, story_id: int, expected: Expected,
                             returning: ColumnElement[Any], /, *,
                             when: ColumnElement[bool] | None = None,
                             params: dict[str, Any] | None = None,
                             **values: Any) -> Row[Any] | None:
    """`transition_story` that also reads `returning` (an SQL expression) in its UPDATE: the
    row it read, or None when this caller lost."""
    read = _transition(session, Story, "story", story_id, expected, values,
                       _Extra(when, returning, params))
    return cast("Row[Any] | None", read)  # with `returning`: a row, never the empty tuple


def transition_run(session: Session, run_id: str, expected: Expected, **values: Any) -> bool:
    return _transition(session, Run, "run", run_id, expected, values) is not None


def transition_attempt(session: Session, attempt_id: int, expected: Expected,
                       **values: Any) -> bool:
    return _transition(session, Attempt, "attempt", attempt_id, expected, values) is not None


def transition_candidate(session: Session, candidate_id: int, expected: Expected,
                         **values: Any) -> bool:
    return _transition(session, Candidate, "candidate", candidate_id, expected, values) is not None
