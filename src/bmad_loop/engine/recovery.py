"""Finding orphaned story work and handing it back to the queue — a bounded number of times.

A `working` story is orphaned when its worker can no longer finish it: its lease expired
(no heartbeat for `[leases] ttl_s`), or its owner was a process on this host that is gone
(kill -9, OOM). Recovery marks the attempts that were running as `interrupted` (they do not
count against the dev-attempt budget), ends every process the worker's steps left behind on
this host, puts the story back to `queued` and sends it again. The normal claim takes it from
there; recovery never runs work itself.

Leftovers. Every agent session and verify command carries `BMAD_LOOP_RUN_ID`,
`BMAD_LOOP_STORY_KEY`, a session token and `BMAD_LOOP_OWNER` (the bmad-loop process that
started it, see `adapter.py`). Recovering a story SIGKILLs every process on this host that names
the run and the story and was started by a bmad-loop process of this host, with its process
group, session and token carriers, and waits for them to be gone: an agent (also one that left
its group) or a verify command and its grandchildren never outlive their step into the retry.
Each call also sweeps (at most every `SWEEP_EVERY_S`) the run's processes whose owner on this
host is dead, whatever step started them.

Poison. A story whose worker keeps dying or stalling (an agent that kills, stops or starves
bmad-loop) would be recovered forever. Recoveries are counted per story — the `story.recovered`
events since its budget was last reset (`story.retry`, `story.human_fix` on resume) — and the
recovery that would exceed `[limits] max_recoveries` escalates the story instead, with a
reason saying so.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .. import proctree
from ..agents.process import OWNER_VAR, SESSION_TOKEN_VAR, parse_owner
from ..db.models import Attempt, Candidate, Event, Lease, Run, Story, utcnow
from ..hostid import host_name
from ..states import AttemptState, StoryState
from . import leases
from .journal import EventKind, record
from .runrows import run_policy
from ..caches import CACHES
from ..db.database import Database

__all__ = ["find_orphans", "recover_orphans", "recoveries_so_far", "end_story_processes",
           "sweep_dead_owners", "SWEEP_EVERY_S"]

SWEEP_EVERY_S = 30.0
RESET_KINDS = (EventKind.STORY_RETRY, EventKind.STORY_HUMAN_FIX)  # a fresh budget, recoveries included

_swept: dict[str, float] = {}
_swept_lock = threading.Lock()
CACHES.register("engine.recovery_sweeps", _swept.clear, bound="one per run",
               holds="run id -> when this process last swept its orphans (a sweep at most so often)")


def find_orphans(session: Session, run_id: str, ttl_s: float,
                 now: dt.datetime | None = None) -> list[Story]:
    now = now or utcnow()
    grace = dt.timedelta(seconds=ttl_s)
    orphans = []
    for story in session.scalars(select(Story).where(Story.run_id == run_id, Story.state == StoryState.WORKING)):
        lease = session.get(Lease, leases.story_lease_name(story.id))
        if lease is not None:
            if not leases.is_live(lease.owner, lease.expires_at, now):
                orphans.append(story)
        else:
            beat = story.heartbeat_at or story.started_at
            if beat is None or now - beat > grace:
                orphans.append(story)
    return orphans


class StorySender(Protocol):
    """What recovery needs of the queue: to send a story to the story workers again."""

    def enqueue_story(self, run_id: str, story_id: int) -> None: ...


def recover_orphans(db: Database, tasks: StorySender, run_id: str, ttl_s: float, now: dt.datetime | None = None,
                    *,
                    any_working: bool = True, spawned: bool = True) -> list[str]:
    """Re-queue (or, past `max_recoveries`, escalate) the run's orphaned stories; their keys.
    `any_working=False`: the caller's rows, just read, hold no working story, so none can be
    orphaned (one that starts later has a fresh lease); only the periodic sweep runs.
    `spawned=False`: no process was ever started for the run (`ever_spawned`), so the sweep
    for processes of dead owners is skipped and counted as done."""
    recovered: list[int] = []
    keys: list[str] = []
    if not any_working:
        _sweep_now_and_then(run_id)
        return keys
    with db.read() as s:  # the common answer, none, without taking the write lock
        suspects = find_orphans(s, run_id, ttl_s, now)
    if not suspects:
        _sweep_now_and_then(run_id, needed=spawned)
        return keys
    with db.transaction() as s:
        orphans = find_orphans(s, run_id, ttl_s, now)  # again, under the write lock
        limit = _max_recoveries(s, run_id) if orphans else 0
        for story in orphans:
            running = list(s.scalars(select(Attempt).where(Attempt.story_id == story.id,
                                                           Attempt.state == AttemptState.RUNNING)))
            for attempt in running:
                _end_leftover_agent(attempt, run_id, story.key)
                attempt.state, attempt.counted, attempt.ended_at = AttemptState.INTERRUPTED, False, utcnow()
            killed = end_story_processes(run_id, story.key)
            lease = s.get(Lease, leases.story_lease_name(story.id))
            if lease is not None:
                s.delete(lease)
            so_far = recoveries_so_far(s, run_id, story.key)
            interrupted = [a.id for a in running]
            if so_far >= limit:
                _escalate(s, run_id, story, so_far, limit, interrupted, killed)
                keys.append(story.key)
                continue
            story.state, story.heartbeat_at = StoryState.QUEUED, None
            record(s, run_id, EventKind.STORY_RECOVERED, story.key, phase=story.phase,
                   interrupted_attempts=interrupted, recovery=so_far + 1, max_recoveries=limit,
                   **({"killed": killed} if killed else {}))
            recovered.append(story.id)
            keys.append(story.key)
    _sweep_now_and_then(run_id, needed=spawned)  # before any story is sent again
    for story_id in recovered:
        tasks.enqueue_story(run_id, story_id)
    return keys


def recoveries_so_far(session: Session, run_id: str, key: str) -> int:
    """`story.recovered` events of this story since its budget was last reset by resume."""
    reset = session.scalar(select(func.max(Event.seq)).where(
        Event.run_id == run_id, Event.story == key, Event.kind.in_(RESET_KINDS))) or 0
    return session.scalar(select(func.count()).select_from(Event).where(
        Event.run_id == run_id, Event.story == key, Event.kind == EventKind.STORY_RECOVERED,
        Event.seq > reset)) or 0


def end_story_processes(run_id: str, key: str) -> list[int]:
    """SIGKILL what this host's bmad-loop processes started for this story (agents, verify
    commands, their trees) and wait for it to be gone; the pids."""
    here = host_name()

    def ours(env: Mapping[str, str]) -> bool:
        owner = parse_owner(env.get(OWNER_VAR))
        return (env.get("BMAD_LOOP_RUN_ID") == run_id and env.get("BMAD_LOOP_STORY_KEY") == key
                and owner is not None and owner[0] == here)

    return proctree.kill_marked(ours, token_var=SESSION_TOKEN_VAR)


def sweep_dead_owners(run_id: str) -> list[int]:
    """SIGKILL the run's processes whose bmad-loop owner on this host is dead (e.g. the
    candidate verify of a lane killed mid-way); the pids."""
    here = host_name()
    verdicts: dict[str, bool] = {}

    def orphaned(env: Mapping[str, str]) -> bool:
        if env.get("BMAD_LOOP_RUN_ID") != run_id or OWNER_VAR not in env:
            return False
        value = env[OWNER_VAR]
        if value not in verdicts:
            owner = parse_owner(value)
            verdicts[value] = (owner is not None and owner[0] == here
                               and not proctree.is_running(owner[1], owner[2]))
        return verdicts[value]

    return proctree.kill_marked(orphaned, token_var=SESSION_TOKEN_VAR)


def _sweep_now_and_then(run_id: str, *, needed: bool = True) -> None:
    """`needed` False: nothing of the run was ever started (no attempt, no candidate), so no
    process can carry its id yet; this counts as a sweep (the next is due in SWEEP_EVERY_S)."""
    now = time.monotonic()
    with _swept_lock:
        if now - _swept.get(run_id, -SWEEP_EVERY_S) < SWEEP_EVERY_S:
            return
        _swept[run_id] = now
    if needed:
        sweep_dead_owners(run_id)


def ever_spawned(session: Session, run_id: str) -> bool:
    """Did any process ever start for the run? Agents and story verify commands follow an
    attempt row, a candidate's verify commands its candidate row."""
    return (session.scalar(select(Attempt.id).where(Attempt.run_id == run_id).limit(1)) is not None
            or session.scalar(select(Candidate.id).where(Candidate.run_id == run_id).limit(1))
            is not None)


def _max_recoveries(session: Session, run_id: str) -> int:
    run = session.get(Run, run_id)
    assert run is not None  # a run's stories are only read with their run
    return run_policy(run).limits.max_recoveries


def _escalate(session: Session, run_id: str, story: Story, so_far: int, limit: int,
              interrupted: list[int], killed: list[int]) -> None:
    reason = (f"recovered {so_far} time(s) already ([limits] max_recoveries = {limit}): its worker "
              "keeps dying or stalling while it runs (an agent that kills, stops or starves "
              "bmad-loop?); escalated instead of recovered again")
    head = _worktree_head(story.worktree)
    story.state, story.reason, story.ended_at, story.heartbeat_at = (
        StoryState.ESCALATED, reason, utcnow(), None)
    story.head_sha = head or story.head_sha
    record(session, run_id, EventKind.STORY_ESCALATED, story.key, reason=reason, phase=story.phase,
           head_sha=story.head_sha, interrupted_attempts=interrupted,
           recoveries=so_far, max_recoveries=limit, **({"killed": killed} if killed else {}))


def _worktree_head(worktree: str | None) -> str | None:
    """The story's HEAD, so `resume` can tell a human's fix from the agent's last state."""
    if not worktree or not Path(worktree).is_dir():
        return None
    from ..git.runner import Git

    try:
        return Git(Path(worktree)).rev("HEAD", cwd=Path(worktree))
    except Exception:  # a half-made worktree: the row keeps what it had
        return None


def _end_leftover_agent(attempt: Attempt, run_id: str, key: str) -> None:
    """The dead worker's agent may still run (it has its own process group): end the group."""
    if not attempt.pid or attempt.host != host_name():
        return
    environ = proctree.environ_of(attempt.pid)
    if environ is None:
        return
    if environ.get("BMAD_LOOP_RUN_ID") != run_id or environ.get("BMAD_LOOP_STORY_KEY") != key:
        return  # the pid was reused by something else
    proctree.signal_group(attempt.pid, 9)
