"""Guarded transitions: Core UPDATEs that behave, inside a session, as the ORM's did.

`engine/transitions.py` runs `… WHERE id = :id AND state IN (:expected)` on the session's
connection instead of through the ORM's bulk UPDATE. What the ORM did besides is done by hand,
and these tests hold it to that on a real SQLite file: a change still pending in the session is
written before the UPDATE (autoflush), a row the session holds shows what the UPDATE wrote,
and only a winning UPDATE changes it. The UPDATE of each shape is built once and kept: a call
of a shape seen before runs with its own row, values and parameters, never another call's.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from bmad_loop.db.database import insert_now
from bmad_loop.db.models import Attempt, Run, Story
from bmad_loop.engine.transitions import transition_story
from bmad_loop.states import IllegalTransition, StoryState

from support import add_runs


@pytest.fixture
def db(db):
    """The shared database (conftest.py) with a running run and its pending story."""
    add_runs(db)
    with db.transaction() as s:
        s.add(Story(run_id="r1", key="1-1-a", seq=1, epic="1", title="a", story_path="a.md",
                    state=StoryState.PENDING))
    return db


def _story_id(db) -> int:
    with db.read() as s:
        return s.scalar(select(Story.id))


def test_a_change_pending_in_the_session_is_written_before_the_guarded_update(db):
    story_id = _story_id(db)
    with db.transaction() as s:
        row = s.get(Story, story_id)
        row.state = StoryState.QUEUED  # pending: not flushed yet
        # Guarded on the pending state: it wins only if that change reached the row first.
        assert transition_story(s, story_id, StoryState.QUEUED, state=StoryState.WORKING)
    with db.read() as s:
        assert s.get(Story, story_id).state == StoryState.WORKING


def test_a_held_row_shows_what_a_winning_update_wrote_and_reads_a_computed_value_again(db):
    story_id = _story_id(db)
    with db.transaction() as s:
        row = s.get(Story, story_id)  # held by the session before the UPDATE
        claim = row.claim
        assert transition_story(s, story_id, StoryState.PENDING, state=StoryState.QUEUED,
                                wait_reason=None, queued_at=None)
        assert transition_story(s, story_id, StoryState.QUEUED, state=StoryState.WORKING,
                                host="h1", claim=Story.claim + 1)
        assert (row.state, row.host) == (StoryState.WORKING, "h1")
        assert row.claim == claim + 1  # `claim + 1` was computed by the database, read again
        assert not s.dirty  # taken as what the row holds, not as a change to write
    with db.read() as s:
        again = s.get(Story, story_id)
        assert (again.state, again.host, again.claim) == (StoryState.WORKING, "h1", claim + 1)


def test_a_losing_update_changes_nothing_the_session_holds(db):
    story_id = _story_id(db)
    with db.transaction() as s:
        row = s.get(Story, story_id)
        assert not transition_story(s, story_id, StoryState.QUEUED, state=StoryState.WORKING,
                                    host="h1")
        assert (row.state, row.host) == (StoryState.PENDING, None)
    with db.read() as s:
        assert s.get(Story, story_id).state == StoryState.PENDING


def test_a_transition_the_table_does_not_allow_is_refused_before_anything_is_written(db):
    story_id = _story_id(db)
    with pytest.raises(IllegalTransition):
        with db.transaction() as s:
            transition_story(s, story_id, StoryState.PENDING, state=StoryState.INTEGRATED)
    with db.read() as s:
        assert s.get(Story, story_id).state == StoryState.PENDING


def test_insert_now_writes_an_orm_objects_row_with_its_defaults_and_checks(db):
    """`insert_now`: a new row the writer does not read back, as one Core INSERT."""
    story_id = _story_id(db)
    with pytest.raises(IllegalTransition):  # the model's validator still runs
        Attempt(run_id="r1", story_id=story_id, phase="dev", number=1, state="succeeded")
    with db.transaction() as s:
        s.get(Story, story_id).state = StoryState.QUEUED  # pending: flushed first
        attempt = Attempt(run_id="r1", story_id=story_id, phase="dev", number=1,
                          state="running", host="h1")
        attempt_id = insert_now(s, attempt)
        assert attempt not in s
    with db.read() as s:
        row = s.get(Attempt, attempt_id)
        assert (row.story_id, row.number, row.state, row.host) == (story_id, 1, "running", "h1")
        assert row.started_at is not None  # the column's default, as a flush would give it
        assert s.get(Story, story_id).state == StoryState.QUEUED


def test_a_further_condition_is_part_of_the_guard(db):
    """`when`: e.g. the lane enters `integrating` only while its run may still land stories."""
    story_id = _story_id(db)
    may_run = select(Run.state).where(Run.id == "r1").scalar_subquery().in_(("running",))
    with db.transaction() as s:
        s.get(Run, "r1").state = "stopping"
    with db.transaction() as s:
        assert not transition_story(s, story_id, StoryState.PENDING, when=may_run,
                                    state=StoryState.QUEUED)
    with db.read() as s:
        assert s.get(Story, story_id).state == StoryState.PENDING
    with db.transaction() as s:
        s.get(Run, "r1").state = "running"  # resumed
        assert transition_story(s, story_id, StoryState.PENDING, when=may_run,
                                state=StoryState.QUEUED)
    with db.read() as s:
        assert s.get(Story, story_id).state == StoryState.QUEUED


# --- the UPDATE kept per shape: a shape seen before runs with its own values, never another's --

def _add_story(db, key: str, state=StoryState.PENDING) -> int:
    with db.transaction() as s:
        row = Story(run_id="r1", key=key, seq=int(key.split("-")[1]), epic="1", title=key,
                    story_path=f"{key}.md", state=state)
        s.add(row)
        s.flush()
        return row.id


def test_a_kept_statement_runs_with_each_calls_own_row_and_values(db):
    first, second = _story_id(db), _add_story(db, "1-2-b")
    with db.transaction() as s:  # the same shape twice: the second must not reuse the first's values
        assert transition_story(s, first, StoryState.PENDING, state=StoryState.QUEUED, host="h1",
                                feedback={"why": ["first"]})
        assert transition_story(s, second, StoryState.PENDING, state=StoryState.QUEUED, host="h2",
                                feedback={"why": ["second"]})
    with db.read() as s:
        rows = {r.id: r for r in s.scalars(select(Story))}
    assert (rows[first].host, rows[first].feedback) == ("h1", {"why": ["first"]})
    assert (rows[second].host, rows[second].feedback) == ("h2", {"why": ["second"]})


def test_shapes_that_differ_only_in_the_expected_states_are_not_confused(db):
    story_id = _story_id(db)
    with db.transaction() as s:
        assert transition_story(s, story_id, StoryState.PENDING, state=StoryState.QUEUED)
    with db.transaction() as s:  # same columns, other expected state: its own guard
        assert not transition_story(s, story_id, StoryState.PENDING, state=StoryState.QUEUED)
        assert transition_story(s, story_id, (StoryState.QUEUED,), state=StoryState.PENDING)
    with db.read() as s:
        assert s.get(Story, story_id).state == StoryState.PENDING


def test_a_computed_value_and_a_plain_one_for_the_same_column_are_two_shapes(db):
    story_id = _story_id(db)
    with db.transaction() as s:
        assert transition_story(s, story_id, StoryState.PENDING, state=StoryState.QUEUED,
                                claim=Story.claim + 5)
        assert transition_story(s, story_id, StoryState.QUEUED, state=StoryState.PENDING)
        # The same states and column as the first call, with a plain value this time.
        assert transition_story(s, story_id, StoryState.PENDING, state=StoryState.QUEUED,
                                claim=2)
    with db.read() as s:
        assert s.get(Story, story_id).claim == 2


def test_a_condition_built_once_takes_each_calls_parameters(db):
    """The way the hot callers use `when`: one clause with bind parameters, filled per call."""
    from sqlalchemy import bindparam

    story_id = _story_id(db)
    claim_is = Story.claim == bindparam("claim_is")
    with db.transaction() as s:
        assert not transition_story(s, story_id, StoryState.PENDING, when=claim_is,
                                    params={"claim_is": 3}, state=StoryState.QUEUED)
        assert transition_story(s, story_id, StoryState.PENDING, when=claim_is,
                                params={"claim_is": 0}, state=StoryState.QUEUED)
    with db.read() as s:
        assert s.get(Story, story_id).state == StoryState.QUEUED


def test_clauses_built_for_one_call_each_stay_correct_and_the_kept_statements_stay_bounded(db):
    from bmad_loop.engine import transitions

    story_id = _story_id(db)
    states = [StoryState.PENDING, StoryState.QUEUED]
    for i in range(transitions._KEPT_STATEMENTS + 20):
        old, new = states[i % 2], states[(i + 1) % 2]
        with db.transaction() as s:  # a fresh clause every time, as a one-off caller builds it
            runs_now = select(Run.state).where(Run.id == "r1").scalar_subquery().in_(("running",))
            assert transition_story(s, story_id, old, when=runs_now, state=new)
        assert len(transitions._STATEMENTS) <= transitions._KEPT_STATEMENTS
    with db.read() as s:
        assert s.get(Story, story_id).state == states[(transitions._KEPT_STATEMENTS + 20) % 2]
