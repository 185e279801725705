"""The journal: one row per thing that happened, in order. `bmad-loop journal` reads it."""

from __future__ import annotations

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from ..db.database import insert_at_commit
from ..db.models import Event, utcnow

__all__ = ["record", "events_after", "event_rows_after", "event_json"]


def record(session: Session, run_id: str, kind: str, story: str | None = None, **data) -> None:
    """Append an event inside the caller's transaction (never commits). Its row is written
    when the transaction commits, in order with the transaction's other events."""
    insert_at_commit(session, Event.__table__, {"run_id": run_id, "ts": utcnow(), "kind": kind,
                                                "story": story, "data": _jsonable(data)})


def events_after(session: Session, run_id: str, after_seq: int = 0, kinds=(), story=None):
    query = select(Event).where(Event.run_id == run_id, Event.seq > after_seq)
    if kinds:
        query = query.where(Event.kind.in_(list(kinds)))
    if story:
        query = query.where(Event.story == story)
    return list(session.scalars(query.order_by(Event.seq)))


_EVENTS = Event.__table__
# event_rows_after's statement, built once: a follower polls it.
_EVENTS_AFTER = (select(_EVENTS).where(_EVENTS.c.run_id == bindparam("run_id"),
                                       _EVENTS.c.seq > bindparam("after_seq"))
                 .order_by(_EVENTS.c.seq))


def event_rows_after(session: Session, run_id: str, after_seq: int = 0) -> list:
    """`events_after` as plain rows (seq, ts, kind, story, data as attributes): for a poll
    that only shows them, without the cost of ORM objects."""
    return list(session.connection().execute(_EVENTS_AFTER, {"run_id": run_id,
                                                              "after_seq": after_seq}))


def event_json(event: Event) -> dict:
    return {
        "seq": event.seq,
        "ts": event.ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "kind": event.kind,
        "story": event.story,
        "data": event.data or {},
    }


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def journal_git_locks(git, db, run_id: str, story: str | None = None):
    """Have `git` journal the locks it waits for (`git.lock_waited`) and the stale ones of
    ours it removes (`git.stale_lock_removed`) in this run. Returns `git`."""
    def told(kind):
        def callback(path: str, command: str) -> None:
            with db.transaction() as s:
                record(s, run_id, kind, story, path=path, command=command)
        return callback

    git.on_lock_wait = told("git.lock_waited")
    git.on_stale_lock = told("git.stale_lock_removed")
    return git
