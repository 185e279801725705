"""Leases with heartbeats and fencing tokens, kept in the `leases` table, and who is alive by them.

A lease is a row (name, owner, token, expires_at). Acquiring succeeds when the row is absent,
expired, or already ours; a takeover from another owner increments the token, so a holder that
lost its lease (it stalled past the TTL while someone else took over) is *fenced*: every
renewal or fenced write compares the token it holds with the row's and fails when they differ.
All decisions take `now` from the caller: tests step a clock instead of sleeping.

**Which consumers are alive** is read from the same rows, the one source that decides it. Every
consumer set (`bmad-loop worker`, or the consumers `run` and `resume` start in-process) keeps a
lease named `consumer:<project>|<host>:<pid>:<queue>|<n>` renewed every third of
`[leases] ttl_s`, exactly as the lane keeps the lane lease; a graceful stop deletes it, a killed
consumer's lapses. Whether a consumer is alive, whether the lane is held, and whether a story's
worker is gone are all `is_live` of such a row, so `status` never shows a consumer as alive
that the lane would take over from, nor the reverse.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import CursorResult, Result, Table, bindparam, case, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..db.dialects import upsert_for
from ..db.models import Event, Lease, utcnow
from ..hostid import host_name
from ..caches import CACHES
from ..db.database import Database

if TYPE_CHECKING:
    from ..db.models import Run

__all__ = ["lane_lease_name", "story_lease_name", "acquire", "take", "take_in", "renew", "release",
           "release_in", "holds", "holds_in", "owner_id", "LeaseHolder", "pid_alive", "is_live",
           "Holder", "holder_of", "CONSUMER_PREFIX", "ConsumerRow", "consumer_lease_name",
           "queues_of", "consumers", "idle_warnings", "idle_after_s", "prune_lapsed",
           "live_run_view", "workers_alive"]

log = logging.getLogger(__name__)


def lane_lease_name(project_key: str) -> str:
    """The project's one integration lane (per state database)."""
    return f"lane:{project_key}"


def story_lease_name(story_id: int) -> str:
    """The lease a story worker holds while it works on the story."""
    return f"story:{story_id}"


def owner_id(tag: str = "") -> str:
    """host:pid[:tag] — lets a consumer on the same host tell a dead owner from a slow one."""
    base = f"{host_name()}:{os.getpid()}"
    return f"{base}:{tag}" if tag else base


def pid_alive(owner: str | None) -> bool | None:
    """For an owner on this host: is its process alive? None when it is another host's."""
    if not owner:
        return None
    parts = owner.split(":")
    if len(parts) < 2 or parts[0] != host_name():
        return None
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def is_live(owner: str | None, expires_at: dt.datetime | None, now: dt.datetime) -> bool:
    """THE liveness rule, wherever bmad-loop decides or shows whether someone is alive (a
    lease's takeover, an orphaned story, `resume` of a driven run, the consumers `status`
    lists): renewed within its ttl, and not a process of this host known to be gone."""
    return expires_at is not None and expires_at > now and pid_alive(owner) is not False


@dataclass(frozen=True)
class Holder:
    """Who holds a live lease, for a person: `host pid N`."""

    owner: str
    host: str
    pid: str
    renewed_at: dt.datetime

    def __str__(self) -> str:
        return f"{self.host} pid {self.pid}"


def holder_of(session: Session, name: str, now: dt.datetime | None = None) -> Holder | None:
    """The live holder of lease `name`, or None when it is free or expired."""
    row = session.get(Lease, name)
    if row is None or not is_live(row.owner, row.expires_at, now or utcnow()):
        return None
    parts = row.owner.split(":")
    return Holder(row.owner, parts[0], parts[1] if len(parts) > 1 else "?", row.renewed_at)


def acquire(db: Database, name: str, owner: str, ttl_s: float,
            now: dt.datetime | None = None) -> int | None:
    """Take or renew the lease; returns the fencing token, or None while someone else holds it."""
    now = now or utcnow()
    expires = now + dt.timedelta(seconds=ttl_s)
    host = owner.split(":")[0]
    with db.transaction() as s:
        row = s.get(Lease, name)
        if row is None:
            s.add(Lease(name=name, owner=owner, host=host, token=1, acquired_at=now,
                        renewed_at=now, expires_at=expires))
            try:
                s.flush()
            except IntegrityError:  # raced with another acquirer: they won
                return None
            return 1
        if row.owner == owner:
            row.renewed_at, row.expires_at = now, expires
            return row.token
        if is_live(row.owner, row.expires_at, now):
            return None
        token = row.token + 1
        result = s.execute(update(Lease).where(Lease.name == name, Lease.token == row.token)
                           .values(owner=owner, host=host, token=token, acquired_at=now,
                                   renewed_at=now, expires_at=expires))
        return token if _one_row(result) else None


def _one_row(result: Result[Any]) -> bool:
    """Did the UPDATE change exactly one row? (An UPDATE's result is a cursor's.)"""
    return cast("CursorResult[Any]", result).rowcount == 1


_LEASES = cast(Table, Lease.__table__)  # a mapped class's table is typed as any FromClause
_TAKE: dict[str, Any] = {}  # dialect name -> the upsert, built once with bound parameters
CACHES.register("engine.lease_upserts", _TAKE.clear, bound="one per database dialect",
               holds="dialect -> the lease upsert statement, built once")
# The fencing check's read and the release, built once: they run with every story.
_HOLDER = select(_LEASES.c.owner, _LEASES.c.token, _LEASES.c.expires_at).where(
    _LEASES.c.name == bindparam("name"))
_RELEASE = delete(_LEASES).where(_LEASES.c.name == bindparam("name"),
                                 _LEASES.c.owner == bindparam("owner"))


def _take_statement(dialect: str, upsert: Callable[..., Any]) -> Any:
    """The story lease's upsert, built once per dialect: the statement's construction and its
    compiled form's look-up cost more than running it. On the table, not the mapped class, so it
    runs on the connection without the ORM's execution path."""
    stmt = _TAKE.get(dialect)
    if stmt is None:
        insert = upsert(_LEASES).values(
            name=bindparam("name"), owner=bindparam("owner"), host=bindparam("host"), token=1,
            acquired_at=bindparam("now"), renewed_at=bindparam("now"),
            expires_at=bindparam("expires"))
        new, c = insert.excluded, _LEASES.c
        stmt = insert.on_conflict_do_update(index_elements=[c.name], set_={
            "owner": new.owner, "host": new.host, "acquired_at": new.acquired_at,
            "renewed_at": new.renewed_at, "expires_at": new.expires_at,
            "token": case((c.owner == new.owner, c.token), else_=c.token + 1)}).returning(c.token)
        _TAKE[dialect] = stmt
    return stmt


def take(db: Database, name: str, owner: str, ttl_s: float, now: dt.datetime | None = None) -> int:
    """Take the lease whoever holds it (the caller already won the row it guards); the token."""
    with db.transaction() as s:
        return take_in(s, name, owner, ttl_s, now)


def take_in(session: Session, name: str, owner: str, ttl_s: float,
            now: dt.datetime | None = None) -> int:
    """`take` inside the caller's transaction: a story worker takes its lease in the one that
    claims the story row. The row's claim generation fences the previous worker, and a new
    token fences its lease."""
    now = now or utcnow()
    expires = now + dt.timedelta(seconds=ttl_s)
    host = owner.split(":")[0]
    dialect = session.get_bind().dialect
    upsert = upsert_for(dialect)
    if upsert is not None:
        # One statement, atomic on both databases (SQLite 3.35 and later).
        return cast(int, session.connection().execute(_take_statement(dialect.name, upsert), {
            "name": name, "owner": owner, "host": host, "now": now, "expires": expires}).scalar())
    for _ in range(3):  # lost a race with a concurrent creator (PostgreSQL): read again
        row = session.get(Lease, name, populate_existing=True)
        if row is None:
            try:
                with session.begin_nested():  # a savepoint: the caller's work is kept
                    session.add(Lease(name=name, owner=owner, host=host, token=1, acquired_at=now,
                                      renewed_at=now, expires_at=expires))
                return 1
            except IntegrityError:
                continue
        token = row.token if row.owner == owner else row.token + 1
        result = session.execute(update(Lease).where(Lease.name == name, Lease.token == row.token)
                                 .values(owner=owner, host=host, token=token, acquired_at=now,
                                         renewed_at=now, expires_at=expires))
        if _one_row(result):
            return token
    raise RuntimeError(f"lease {name}: could not be taken after three races")


def renew(db: Database, name: str, owner: str, token: int, ttl_s: float,
          now: dt.datetime | None = None) -> bool:
    now = now or utcnow()
    with db.transaction() as s:
        result = s.execute(update(Lease).where(Lease.name == name, Lease.owner == owner,
                                               Lease.token == token)
                           .values(renewed_at=now, expires_at=now + dt.timedelta(seconds=ttl_s)))
        return _one_row(result)


def holds(db: Database, name: str, owner: str, token: int, now: dt.datetime | None = None) -> bool:
    """The fencing check: is this (owner, token) still the unexpired holder?"""
    with db.read() as s:
        return holds_in(s, name, owner, token, now)


def holds_in(session: Session, name: str, owner: str, token: int,
             now: dt.datetime | None = None) -> bool:
    """`holds` inside the caller's read (the lane's tick asks it with the run's row)."""
    now = now or utcnow()
    row = session.connection().execute(_HOLDER, {"name": name}).first()
    return bool(row and row.owner == owner and row.token == token and row.expires_at > now)


def release(db: Database, name: str, owner: str) -> None:
    with db.transaction() as s:
        release_in(s, name, owner)


def release_in(session: Session, name: str, owner: str) -> None:
    """`release` inside the caller's transaction."""
    session.connection().execute(_RELEASE, {"name": name, "owner": owner})


class LeaseHolder:
    """Keeps one lease renewed from a thread; calls on_acquired / on_lost as it comes and goes."""

    def __init__(self, db: Database, name: str, owner: str, ttl_s: float, *,
                 on_acquired: Callable[[int], None] | None = None,
                 on_lost: Callable[[], None] | None = None,
                 clock: Callable[[], dt.datetime] = utcnow) -> None:
        self.db, self.name, self.owner, self.ttl_s = db, name, owner, ttl_s
        self.on_acquired, self.on_lost, self.clock = on_acquired, on_lost, clock
        self.on_renewed: Callable[[], None] | None = None  # called after each renewal (the lane refreshes its run records)
        self.token: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self.token is not None

    def still_holds(self, session: Session | None = None) -> bool:
        """Is the lease still ours? In `session` (a read the caller has open) if given."""
        if self.token is None:
            return False
        if session is not None:
            return holds_in(session, self.name, self.owner, self.token, self.clock())
        return holds(self.db, self.name, self.owner, self.token, self.clock())

    def step(self) -> None:
        """One iteration: acquire when free, renew when held, report a loss."""
        now = self.clock()
        if self.token is None:
            token = acquire(self.db, self.name, self.owner, self.ttl_s, now)
            if token is not None:
                self.token = token
                if self.on_acquired:
                    self.on_acquired(token)
            return
        if not renew(self.db, self.name, self.owner, self.token, self.ttl_s, now):
            self.token = None
            if self.on_lost:
                self.on_lost()
        elif self.on_renewed:
            self.on_renewed()

    def start(self, interval_s: float | None = None) -> None:
        interval = interval_s or max(self.ttl_s / 3.0, 0.2)
        self.step()

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.step()
                except Exception:  # a database hiccup: try again next beat, but say so
                    log.warning("lease %s: renewal step failed; retrying", self.name, exc_info=True)

        self._thread = threading.Thread(target=loop, daemon=True, name=f"lease-{self.name}")
        self._thread.start()

    def stop(self, release_lease: bool = True) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if release_lease and self.token is not None:
            release(self.db, self.name, self.owner)
            self.token = None


CONSUMER_PREFIX = "consumer:"
_instances = itertools.count(1)  # two consumer sets of one process keep two rows


def consumer_lease_name(project_key: str, owner: str) -> str:
    return f"{CONSUMER_PREFIX}{project_key}|{owner}|{next(_instances)}"


def queues_of(queue: str) -> list[str]:
    """The huey queues a consumer set started with `--queue queue` takes tasks from."""
    return ["stories", "integration"] if queue == "all" else [queue]


@dataclass(frozen=True)
class ConsumerRow:
    host: str
    pid: int | None
    role: str  # the --queue it was started with: stories, integration or all
    queues: list[str]
    heartbeat_at: dt.datetime
    live: bool
    lane: str | None  # "holds" the lane lease, "standby", or None (no integration queue)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "role": self.role, "queues": self.queues,
                "heartbeat_at": _iso(self.heartbeat_at), "lane": self.lane}


def consumers(session: Session, project_key: str, lane_lease: str,
              now: dt.datetime | None = None) -> list[ConsumerRow]:
    """Every consumer row of the project, live or lapsed (a graceful stop leaves none)."""
    now = now or utcnow()
    prefix = f"{CONSUMER_PREFIX}{project_key}|"
    lane = holder_of(session, lane_lease, now)
    rows = []
    for row in session.scalars(select(Lease).where(Lease.name.startswith(prefix, autoescape=True))
                               .order_by(Lease.acquired_at)):
        parts = row.owner.split(":")
        role = parts[2] if len(parts) > 2 else "?"
        queues = queues_of(role) if role in ("stories", "integration", "all") else []
        live = is_live(row.owner, row.expires_at, now)
        holds = lane is not None and lane.owner == f"{parts[0]}:{parts[1] if len(parts) > 1 else ''}:lane"
        rows.append(ConsumerRow(
            host=parts[0], pid=int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None,
            role=role, queues=queues, heartbeat_at=row.renewed_at, live=live,
            lane=("holds" if holds else "standby") if "integration" in queues else None))
    return rows


def prune_lapsed(db: Database, project_key: str, now: dt.datetime | None = None) -> None:
    """Forget consumer rows lapsed for over a day (killed consumers'): `status` reads the rest."""
    cutoff = (now or utcnow()) - dt.timedelta(days=1)
    with db.transaction() as s:
        s.execute(delete(Lease).where(Lease.name.startswith(f"{CONSUMER_PREFIX}{project_key}|",
                                                            autoescape=True),
                                      Lease.expires_at < cutoff))


def live_run_view(session: Session, run: Run,
                  now: dt.datetime | None = None) -> dict[str, Any]:
    """What `status` shows of the run's consumers: {"consumers": [...live], "warnings": [...]}."""
    from ..states import RUN_LIVE
    from .runrows import run_policy

    now = now or utcnow()
    lane = lane_lease_name(run.project)
    rows = consumers(session, run.project, lane, now)
    warnings: list[str] = []
    if run.state in RUN_LIVE:
        alive = holder_of(session, lane, now) is not None
        ttl: float
        try:
            ttl = run_policy(run).leases.ttl_s
        except Exception:  # a snapshot that no longer validates: `status` still shows the run
            ttl = 60.0
        warnings = idle_warnings(session, run.id, rows, alive, ttl, now)
    return {"consumers": [r.to_json() for r in rows if r.live], "warnings": warnings}


def workers_alive(session: Session, story_ids: list[int],
                  now: dt.datetime | None = None) -> dict[int, bool]:
    """For working stories: is the worker holding each one's lease alive (`is_live`)?"""
    now = now or utcnow()
    names = {story_lease_name(i): i for i in story_ids}
    alive = dict.fromkeys(story_ids, False)
    if names:
        for row in session.scalars(select(Lease).where(Lease.name.in_(list(names)))):
            alive[names[row.name]] = is_live(row.owner, row.expires_at, now)
    return alive


def idle_after_s(ttl_s: float) -> float:
    """How long a live run may go without a story or lane consumer before `status` warns."""
    return max(30.0, 2 * ttl_s)


def idle_warnings(session: Session, run_id: str, rows: list[ConsumerRow], lane_alive: bool,
                  ttl_s: float,
                  now: dt.datetime | None = None) -> list[str]:
    """For a live run: a line for each kind of consumer (story, lane) none of which has been
    alive for longer than `idle_after_s`, counted from the later of the run's last journal
    event and the last heartbeat of a consumer of that kind."""
    now = now or utcnow()
    limit = idle_after_s(ttl_s)
    last_event = session.scalar(select(func.max(Event.ts)).where(Event.run_id == run_id))
    out = []
    for kind, queue, alive in (("story", "stories", any(r.live and "stories" in r.queues for r in rows)),
                               ("lane", "integration", lane_alive)):
        if alive:
            continue
        beats = [r.heartbeat_at for r in rows if queue in r.queues] + [last_event]
        since = max((b for b in beats if b is not None), default=None)
        if since is None or (now - since).total_seconds() > limit:
            ago = f" for {int((now - since).total_seconds())} s" if since else ""
            out.append(f"no {kind} consumer alive{ago} (more than {limit:g} s): start one with "
                       f"`bmad-loop worker --queue {queue}` or `bmad-loop resume {run_id}`")
    return out


def _iso(value: dt.datetime | None) -> str | None:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else None
