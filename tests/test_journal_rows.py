"""The journal's rows are written when their transaction commits (`insert_at_commit`): all of a
transaction's events in one statement, in the order they were recorded, or none at all."""

from __future__ import annotations

import pytest
from sqlalchemy import event, select

from bmad_loop.db.models import Event, Lease, utcnow
from bmad_loop.engine.journal import event_rows_after, events_after, record


def _kinds(db) -> list[str]:
    with db.read() as s:
        return [e.kind for e in events_after(s, "r1")]


def test_a_transactions_events_are_one_insert_in_the_order_recorded(db):
    statements = []
    listener = lambda *args: statements.append(args[2])  # noqa: E731  (conn, cursor, text, …)
    event.listen(db.engine, "before_cursor_execute", listener)
    try:
        with db.transaction() as s:
            record(s, "r1", "run.created", "s1", n=1)
            s.add(Lease(name="x", owner="o", host="h", token=1, acquired_at=utcnow(),
                        renewed_at=utcnow(), expires_at=utcnow()))
            s.flush()  # other rows flush as before; the events wait for the commit
            record(s, "r1", "story.started", None, n=2)
            record(s, "r1", "story.ready", "s3", path=__file__)
    finally:
        event.remove(db.engine, "before_cursor_execute", listener)
    assert sum("INSERT INTO events" in text for text in statements) == 1
    with db.read() as s:
        rows = event_rows_after(s, "r1")
    assert [(r.kind, r.story, r.data) for r in rows] == [
        ("run.created", "s1", {"n": 1}), ("story.started", None, {"n": 2}),
        ("story.ready", "s3", {"path": __file__})]
    assert [r.seq for r in rows] == sorted(r.seq for r in rows)
    assert rows[0].ts <= rows[1].ts <= rows[2].ts  # the time each was recorded


def test_a_transaction_that_fails_writes_none_of_its_events(db):
    with pytest.raises(RuntimeError, match="boom"):
        with db.transaction() as s:
            record(s, "r1", "run.paused")
            raise RuntimeError("boom")
    with db.transaction() as s:
        record(s, "r1", "run.resumed")
    assert _kinds(db) == ["run.resumed"]


def test_an_event_recorded_in_a_read_is_refused_and_nothing_is_written(db):
    with pytest.raises(RuntimeError, match="read-only"):
        with db.read() as s:
            record(s, "r1", "run.warning")
    assert _kinds(db) == []


def test_a_session_committed_twice_writes_each_batch_once(db):
    session = db.session()
    try:
        record(session, "r1", "run.completed")
        session.commit()
        record(session, "r1", "run.resumed")
        session.commit()
        session.commit()  # nothing pending: nothing written
    finally:
        session.close()
    assert _kinds(db) == ["run.completed", "run.resumed"]
    with db.read() as s:
        assert s.scalars(select(Event.kind)).all() == ["run.completed", "run.resumed"]


def test_events_wait_for_the_outermost_commit_not_a_savepoints_release(db):
    """A savepoint released inside the transaction writes no event: a savepoint rolled back
    later could otherwise take events recorded before it along."""
    from sqlalchemy.exc import IntegrityError

    with db.transaction() as s:
        record(s, "r1", "story.queued")
        with s.begin_nested():
            s.add(Lease(name="dup", owner="o", host="h", token=1, acquired_at=utcnow(),
                        renewed_at=utcnow(), expires_at=utcnow()))
        record(s, "r1", "story.started")
        with pytest.raises(IntegrityError):
            with s.begin_nested():  # fails at its release: the journal must not go with it
                s.add(Lease(name="dup", owner="o", host="h", token=2, acquired_at=utcnow(),
                            renewed_at=utcnow(), expires_at=utcnow()))
        record(s, "r1", "story.phase")
    assert _kinds(db) == ["story.queued", "story.started", "story.phase"]

    with pytest.raises(RuntimeError, match="outer"):
        with db.transaction() as s:
            record(s, "r1", "run.failed")
            with s.begin_nested():
                pass
            raise RuntimeError("outer")
    assert _kinds(db) == ["story.queued", "story.started", "story.phase"]


def test_a_kind_outside_the_registry_is_refused_and_nothing_is_written(db):
    with pytest.raises(ValueError, match="story.finished"):
        with db.transaction() as s:
            record(s, "r1", "story.ready")
            record(s, "r1", "story.finished")  # not an EventKind
    assert _kinds(db) == []
