"""Finding orphaned story work and handing it back to the queue.

A `working` story is orphaned when its worker can no longer finish it: its lease expired
(no heartbeat for `[leases] ttl_s`), or its owner was a process on this host that is gone
(kill -9, OOM). Recovery marks the attempts that were running as `interrupted` (they do not
count against the dev-attempt budget), ends any agent process the dead worker left behind on
this host, puts the story back to `queued` and sends it again. The normal claim takes it from
there; recovery never runs work itself.
"""

from __future__ import annotations

import datetime as dt
import signal

from sqlalchemy import select

from .. import proctree
from ..db.models import Attempt, Lease, Story, utcnow
from ..hostid import host_name
from ..states import AttemptState, StoryState
from . import leases
from .journal import record

__all__ = ["find_orphans", "recover_orphans"]


def find_orphans(session, run_id: str, ttl_s: float, now: dt.datetime | None = None) -> list[Story]:
    now = now or utcnow()
    grace = dt.timedelta(seconds=ttl_s)
    orphans = []
    for story in session.scalars(select(Story).where(Story.run_id == run_id, Story.state == StoryState.WORKING)):
        lease = session.get(Lease, leases.story_lease_name(story.id))
        if lease is not None:
            if lease.expires_at <= now or leases.pid_alive(lease.owner) is False:
                orphans.append(story)
        else:
            beat = story.heartbeat_at or story.started_at
            if beat is None or now - beat > grace:
                orphans.append(story)
    return orphans


def recover_orphans(db, tasks, run_id: str, ttl_s: float, now: dt.datetime | None = None) -> list[str]:
    recovered: list[int] = []
    keys = []
    with db.transaction() as s:
        for story in find_orphans(s, run_id, ttl_s, now):
            running = list(s.scalars(select(Attempt).where(Attempt.story_id == story.id,
                                                           Attempt.state == AttemptState.RUNNING)))
            for attempt in running:
                _end_leftover_agent(attempt, run_id, story.key)
                attempt.state, attempt.counted, attempt.ended_at = AttemptState.INTERRUPTED, False, utcnow()
            lease = s.get(Lease, leases.story_lease_name(story.id))
            if lease is not None:
                s.delete(lease)
            story.state, story.heartbeat_at = StoryState.QUEUED, None
            record(s, run_id, "story.recovered", story.key, phase=story.phase,
                   interrupted_attempts=[a.id for a in running])
            recovered.append(story.id)
            keys.append(story.key)
    for story_id in recovered:
        tasks.enqueue_story(run_id, story_id)
    return keys


def _end_leftover_agent(attempt: Attempt, run_id: str, key: str) -> None:
    """The dead worker's agent may still run (it has its own process group): end it."""
    if not attempt.pid or attempt.host != host_name():
        return
    environ = proctree.environ_of(attempt.pid)
    if environ is None:
        return
    if environ.get("BMAD_LOOP_RUN_ID") != run_id or environ.get("BMAD_LOOP_STORY_KEY") != key:
        return  # the pid was reused by something else
    proctree.signal_group(attempt.pid, signal.SIGKILL)
