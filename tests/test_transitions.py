"""Guarded transitions: Core UPDATEs that behave, inside a session, as the ORM's did.

`engine/transitions.py` runs `… WHERE id = :id AND state IN (:expected)` on the session's
connection instead of through the ORM's bulk UPDATE. What the ORM did besides is done by hand,
and these tests hold it to that on a real SQLite file: a change still pending in the session is
written before the UPDATE (autoflush), a row the session holds shows what the UPDATE wrote,
and only a winning UPDATE changes it.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from bmad_loop.db.database import insert_now
from bmad_loop.db.models import Attempt, Run, Story
from bmad_loop.engine.transitions import transition_story
from bmad_loop.states import IllegalTransition, StoryState

from support import state_database


@pytest.fixture
def db(tmp_path):
    database = state_database(tmp_path)
    with database.transaction() as s:
        s.add(Story(run_id="r1", key="1-1-a", seq=1, epic="1", title="a", story_path="a.md",
                    state=StoryState.PENDING))
    return database


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
