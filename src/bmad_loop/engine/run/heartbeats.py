"""Which consumers are alive, from the one source that decides it: the `leases` table.

Every consumer set (`bmad-loop worker`, or the consumers `run` and `resume` start in-process)
keeps a lease named `consumer:<project>|<host>:<pid>:<queue>|<n>` renewed every third of
`[leases] ttl_s`, exactly as the lane keeps the lane lease; a graceful stop deletes it, a killed
consumer's lapses. Whether a consumer is alive, whether the lane is held, and whether a story's
worker is gone are all `leases.is_live` of such a row, so `status` never shows a consumer as alive
that the lane would take over from, nor the reverse.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass

from sqlalchemy import delete, func, select

from ...db.models import Event, Lease, utcnow
from .. import leases

__all__ = ["CONSUMER_PREFIX", "ConsumerRow", "consumer_lease_name", "queues_of", "consumers",
           "idle_warnings", "idle_after_s", "prune_lapsed", "live_run_view", "workers_alive"]

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

    def to_json(self) -> dict:
        return {"host": self.host, "pid": self.pid, "role": self.role, "queues": self.queues,
                "heartbeat_at": _iso(self.heartbeat_at), "lane": self.lane}


def consumers(session, project_key: str, lane_lease: str, now: dt.datetime | None = None) -> list[ConsumerRow]:
    """Every consumer row of the project, live or lapsed (a graceful stop leaves none)."""
    now = now or utcnow()
    prefix = f"{CONSUMER_PREFIX}{project_key}|"
    lane = leases.holder_of(session, lane_lease, now)
    rows = []
    for row in session.scalars(select(Lease).where(Lease.name.startswith(prefix, autoescape=True))
                               .order_by(Lease.acquired_at)):
        parts = row.owner.split(":")
        role = parts[2] if len(parts) > 2 else "?"
        queues = queues_of(role) if role in ("stories", "integration", "all") else []
        live = leases.is_live(row.owner, row.expires_at, now)
        holds = lane is not None and lane.owner == f"{parts[0]}:{parts[1] if len(parts) > 1 else ''}:lane"
        rows.append(ConsumerRow(
            host=parts[0], pid=int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None,
            role=role, queues=queues, heartbeat_at=row.renewed_at, live=live,
            lane=("holds" if holds else "standby") if "integration" in queues else None))
    return rows


def prune_lapsed(db, project_key: str, now: dt.datetime | None = None) -> None:
    """Forget consumer rows lapsed for over a day (killed consumers'): `status` reads the rest."""
    cutoff = (now or utcnow()) - dt.timedelta(days=1)
    with db.transaction() as s:
        s.execute(delete(Lease).where(Lease.name.startswith(f"{CONSUMER_PREFIX}{project_key}|",
                                                            autoescape=True),
                                      Lease.expires_at < cutoff))


def live_run_view(session, run, now: dt.datetime | None = None) -> dict:
    """What `status` shows of the run's consumers: {"consumers": [...live], "warnings": [...]}."""
    from ...states import RUN_LIVE
    from ..runs import run_policy

    now = now or utcnow()
    lane = leases.lane_lease_name(run.project)
    rows = consumers(session, run.project, lane, now)
    warnings = []
    if run.state in RUN_LIVE:
        alive = leases.holder_of(session, lane, now) is not None
        try:
            ttl = run_policy(run).leases.ttl_s
        except Exception:  # a snapshot that no longer validates: `status` still shows the run
            ttl = 60.0
        warnings = idle_warnings(session, run.id, rows, alive, ttl, now)
    return {"consumers": [r.to_json() for r in rows if r.live], "warnings": warnings}


def workers_alive(session, story_ids: list[int], now: dt.datetime | None = None) -> dict[int, bool]:
    """For working stories: is the worker holding each one's lease alive (`leases.is_live`)?"""
    now = now or utcnow()
    names = {leases.story_lease_name(i): i for i in story_ids}
    alive = dict.fromkeys(story_ids, False)
    if names:
        for row in session.scalars(select(Lease).where(Lease.name.in_(list(names)))):
            alive[names[row.name]] = leases.is_live(row.owner, row.expires_at, now)
    return alive


def idle_after_s(ttl_s: float) -> float:
    """How long a live run may go without a story or lane consumer before `status` warns."""
    return max(30.0, 2 * ttl_s)


def idle_warnings(session, run_id: str, rows: list[ConsumerRow], lane_alive: bool, ttl_s: float,
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


def _iso(value):
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else None
