"""The lane's rows-against-git check reads its rows in one statement (engine/lane/tick.py):
the latest integrated story and every one integrated without a commit, on a real SQLite file."""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from bmad_loop.db.models import Story
from bmad_loop.engine.lane.tick import integrated_rows
from bmad_loop.states import StoryState

from support import add_runs


@pytest.fixture
def db(db):
    """The shared database (conftest.py) with two running runs."""
    return add_runs(db, ("r1", "r2"))


def _stories(db, run_id, rows) -> None:
    with db.transaction() as s:
        for seq, (state, sha) in enumerate(rows, start=1):
            s.execute(insert(Story.__table__).values(  # rows as a run leaves them
                run_id=run_id, key=f"1-{seq}-s", seq=seq, epic="1", title="s",
                story_path="s.md", state=state, integrated_sha=sha))


def _read(db, run_id):
    with db.read() as s:
        latest, bad = integrated_rows(s, run_id)
    return (latest and (latest.key, latest.integrated_sha)), [(r.key, r.integrated_sha) for r in bad]


def test_the_latest_integrated_story_and_those_without_a_commit(db):
    _stories(db, "r1", [(StoryState.INTEGRATED, "a" * 40), (StoryState.INTEGRATED, None),
                        (StoryState.INTEGRATED, "c" * 40), (StoryState.INTEGRATED, None),
                        (StoryState.INTEGRATED, "e" * 40), (StoryState.PENDING, None)])
    _stories(db, "r2", [(StoryState.INTEGRATED, None)] * 8)  # another run's rows stay out
    assert _read(db, "r1") == (("1-5-s", "e" * 40), [("1-2-s", None), ("1-4-s", None)])


def test_a_latest_story_without_a_commit_is_both_the_latest_and_a_contradiction(db):
    _stories(db, "r1", [(StoryState.INTEGRATED, "a" * 40), (StoryState.INTEGRATED, None),
                        (StoryState.READY, None)])
    assert _read(db, "r1") == (("1-2-s", None), [("1-2-s", None)])


def test_nothing_integrated_yet(db):
    _stories(db, "r1", [(StoryState.READY, None), (StoryState.PENDING, None)])
    assert _read(db, "r1") == (None, [])
