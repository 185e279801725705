"""`Claim.write`: the worker's row writes as one guarded Core UPDATE, on a real SQLite file.

It replaced loading the story (forty columns) and flushing it at each phase's end. What the load
did besides is held here: a worker whose claim moved on writes nothing at all, a state change
the story machine forbids is refused before anything is written, the run's state comes back
with the write, and the worker's copy of the row shows what was written.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, insert, select

from bmad_loop.db.models import Attempt, Event, Run, Story, utcnow
from bmad_loop.engine.worker.context import Claim, Fenced
from bmad_loop.engine.journal import record
from bmad_loop.states import IllegalTransition, Phase, RunState, StoryState

from support import add_runs


@pytest.fixture
def db(db):
    """The shared database (conftest.py) with a running run and a story a worker holds."""
    add_runs(db, max_parallel=2)
    with db.transaction() as s:
        # Mid-walk, as no new row may start: written as a worker's claim left it.
        s.execute(insert(Story.__table__).values(
            run_id="r1", key="1-1-a", seq=1, epic="1", title="a", story_path="a.md",
            state=StoryState.WORKING, claim=3, phase=Phase.DEV, dev_attempts=1))
    return db


def _claim(db, generation=3) -> Claim:
    with db.read() as s:
        story_id = s.scalar(select(Story.id))
    return Claim(db, "r1", story_id, generation, owner="w", token=1, ttl_s=60)


def _row(db, claim) -> Story:
    with db.read() as s:
        return s.get(Story, claim.story_id)


def _events(db) -> int:
    with db.read() as s:
        return s.scalar(select(func.count()).select_from(Event))


def test_a_held_claim_writes_the_values_returns_the_run_state_and_updates_the_known_row(db):
    claim = _claim(db)
    known = _row(db, claim)
    with db.transaction() as s:
        state = claim.write(s, known, phase=Phase.VERIFY, dev_attempts=2,
                            feedback={"verify_output": "x"}, session="tmux-1")
    assert state == RunState.RUNNING
    after = _row(db, claim)
    assert (after.phase, after.dev_attempts, after.feedback, after.session) == (
        Phase.VERIFY, 2, {"verify_output": "x"}, "tmux-1")
    assert (known.phase, known.dev_attempts, known.session) == (Phase.VERIFY, 2, "tmux-1")
    with db.transaction() as s:
        s.get(Run, "r1").state = RunState.STOPPING
    with db.transaction() as s:
        assert claim.write(s, known, heartbeat_at=utcnow()) == RunState.STOPPING


@pytest.mark.parametrize("moved", ["claim", "state"])
def test_a_claim_that_moved_on_writes_nothing_not_even_the_rest_of_its_transaction(db, moved):
    claim = _claim(db)
    known = _row(db, claim)
    with db.transaction() as s:  # recovery took the story back meanwhile
        row = s.get(Story, claim.story_id)
        if moved == "claim":
            row.claim = 4
        else:
            row.state = StoryState.QUEUED
    with pytest.raises(Fenced):
        with db.transaction() as s:
            record(s, "r1", "story.phase", "1-1-a", phase=Phase.VERIFY)
            s.add(Attempt(run_id="r1", story_id=claim.story_id, phase=Phase.DEV, number=2,
                          state="running"))
            claim.write(s, known, phase=Phase.VERIFY)
    after = _row(db, claim)
    assert after.phase == Phase.DEV and known.phase == Phase.DEV
    assert _events(db) == 0
    with db.read() as s:
        assert s.scalar(select(func.count()).select_from(Attempt)) == 0


def test_a_state_change_the_story_machine_forbids_is_refused_before_anything_is_written(db):
    claim = _claim(db)
    known = _row(db, claim)
    with pytest.raises(IllegalTransition):
        with db.transaction() as s:
            claim.write(s, known, state=StoryState.INTEGRATED, phase=None)
    assert _row(db, claim).state == StoryState.WORKING
    with db.transaction() as s:
        claim.write(s, known, state=StoryState.READY, phase=Phase.COMMIT)
    assert _row(db, claim).state == StoryState.READY == known.state


def test_an_orm_row_added_earlier_in_the_transaction_is_written_with_it(db):
    claim = _claim(db)
    with db.transaction() as s:
        s.add(Attempt(run_id="r1", story_id=claim.story_id, phase=Phase.DEV, number=2,
                      state="running"))
        claim.write(s, None, phase=Phase.REVIEW)
    with db.read() as s:
        assert s.scalar(select(func.count()).select_from(Attempt)) == 1
    assert _row(db, claim).phase == Phase.REVIEW
