"""Read models for `status`, `journal` and friends: plain dicts built from the rows."""

from __future__ import annotations

import datetime as dt
from typing import Any, Collection, Iterable

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from ...db.models import Attempt, Candidate, Event, Flake, Run, Story, TargetCheck, utcnow
from ...agents.stallwatch import last_output_at
from ...states import RUN_LIVE, Phase, StoryState
from ..leases import live_run_view, workers_alive
from ..journal import EventKind, event_json, events_after
from ..runrows import stories_of
from ..usage import empty_usage, usage_by_story

__all__ = ["run_status", "run_json", "story_json", "candidate_json", "journal_lines",
           "LEAVES_WORKER", "worker_seconds", "night_notes"]

# A story leaves its worker slot with these (from its `story.phase` on, it was in one).
LEAVES_WORKER = {EventKind.STORY_READY: "ready", EventKind.STORY_ESCALATED: "escalated",
                 EventKind.STORY_INTERRUPTED: "interrupted", EventKind.STORY_RESTACKED: "restacked",
                 EventKind.STORY_RECOVERED: "recovered", EventKind.STORY_SKIPPED: "skipped"}
_NOT_IN_A_WORKER_YET = (StoryState.PENDING, StoryState.QUEUED)


def _iso(value: dt.datetime | None) -> str | None:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else None


def run_json(run: Run, target_now: str | None = None) -> dict[str, Any]:
    recorded = run.head_sha or run.target_sha
    return {
        "id": run.id,
        "state": run.state,
        "target_branch": run.target_branch,
        # As git has it when the reader could ask git; the rows' last advance otherwise.
        "target_sha": target_now or recorded,
        "recorded_target_sha": recorded,
        "start_sha": run.target_sha,
        "max_parallel": run.max_parallel,
        "merge_strategy": run.merge_strategy,
        "isolation": run.isolation,
        "reason": run.reason,
        "created_at": _iso(run.created_at),
        "ended_at": _iso(run.ended_at),
        "host": run.host,
    }


def story_json(story: Story, now: dt.datetime | None = None, usage: dict[str, Any] | None = None,
               settled: list[dict[str, Any]] | None = None, boxed: bool | None = None,
               elapsed: float | None = None) -> dict[str, Any]:
    """`boxed`: whether its latest agent session ran in the OS sandbox (None: no session, or
    recorded before that was known). `elapsed`: its time in a worker (`worker_seconds`)."""
    now = now or utcnow()
    fp = story.footprint or {}
    return {
        "key": story.key,
        "seq": story.seq,
        "epic": story.epic,
        "title": story.title,
        "state": story.state,
        "phase": story.phase,
        "worktree": story.worktree,
        "branch": story.branch,
        "base_sha": story.base_sha,
        "stacked_on": [layer["key"] for layer in story.stacked_on or ()],
        "head_sha": story.head_sha,
        "integrated_sha": story.integrated_sha,
        "session": story.session,
        "log": story.log,
        "attempt": story.dev_attempts,
        "review_cycles": story.review_cycles,
        "footprint": {"files": fp.get("files", []), "shared": fp.get("shared", []),
                      "resources": fp.get("resources", [])},
        "footprint_reason": story.footprint_reason,
        "host": story.host,
        "heartbeat_at": _iso(story.heartbeat_at),
        "started_at": _iso(story.started_at),
        "ended_at": _iso(story.ended_at),
        "last_output_at": _iso(last_output_at(story.log)),  # the session log's mtime
        "elapsed_s": elapsed,
        "reason": story.reason,
        "waiting_for": story.wait_reason,
        "depends_on": list(story.depends_on or []),
        "merge_class": story.merge_class,
        "tier": story.tier,
        "done_checkpoint": story.done_checkpoint,
        "approved": story.approved,
        "signed_off": story.signed_off,
        "port_block": story.port_block,
        # Summed from its attempts, as the agent CLI reported them (None: not reported).
        "usage": usage or empty_usage(),
        # Paths a merge rule settled in its latest candidate ([integration] merge).
        "settled": settled or [],
        "boxed": boxed,
        # Repair sessions in its current budget ([limits] max_repairs), and its flakes.
        "repairs": story.repairs,
        "flakes": 0,
    }


def settled_by_story(session: Session, run_id: str) -> dict[str | None, list[dict[str, Any]]]:
    """story key -> [{path, rule}] from the journal's `candidate.settled`, latest attempt only."""
    rows = session.execute(select(Event.story, Event.data).where(
        Event.run_id == run_id, Event.kind == EventKind.CANDIDATE_SETTLED).order_by(Event.seq))
    latest: dict[str | None, tuple[int, list[dict[str, Any]]]] = {}
    for story, data in rows:
        attempt = data.get("attempt", 0)
        kept = latest.get(story)
        if kept is None or attempt > kept[0]:
            kept = latest[story] = (attempt, [])
        if attempt == kept[0]:
            kept[1].append({"path": data.get("path"), "rule": data.get("rule")})
    return {story: entries for story, (_attempt, entries) in latest.items()}


def candidate_json(candidate: Candidate, story_key: str,
                   on: dict[str, Any] | None = None) -> dict[str, Any]:
    """`on`: the candidate it was composed on ({story, attempt}); None: on the target."""
    return {
        "story": story_key,
        "attempt": candidate.attempt,
        "stack": candidate.stack or 1,
        "on": on,
        "strategy": candidate.strategy,
        "state": candidate.state,
        "ref": candidate.ref,
        "worktree": candidate.worktree,
        "target_sha": candidate.target_sha,
        "branch_sha": candidate.branch_sha,
        "candidate_sha": candidate.candidate_sha,
        "evidence": candidate.evidence,
        "reason": candidate.reason,
        "verify_s": candidate.verify_s,
    }


_WORKER_EVENTS = (select(Event.story, Event.kind, Event.ts)
                  .where(Event.run_id == bindparam("run_id"), Event.story.is_not(None),
                         Event.kind.in_((EventKind.STORY_PHASE, *LEAVES_WORKER)))
                  .order_by(Event.seq))


def worker_seconds(session: Session, run_id: str, stories: Iterable[Story],
                   now: dt.datetime) -> dict[str, float | None]:
    """Story key -> its time in a worker slot, from the journal: each `story.phase` after it
    left one opens a span, leaving (`LEAVES_WORKER`) closes it; a working story's open span
    runs to `now`. Paused, stopped and waiting time never counts. None for a story back in line
    (pending or queued: an interrupted one too, until it runs again) or never in a worker."""
    opened: dict[str | None, dt.datetime] = {}
    total: dict[str | None, float] = {}
    for key, kind, ts in session.execute(_WORKER_EVENTS, {"run_id": run_id}):
        if kind == EventKind.STORY_PHASE:
            opened.setdefault(key, ts)
        elif key in opened:
            total[key] = total.get(key, 0.0) + (ts - opened.pop(key)).total_seconds()
    out: dict[str, float | None] = {}
    for story in stories:
        if story.state in _NOT_IN_A_WORKER_YET:
            out[story.key] = None
            continue
        seconds = total.get(story.key)
        if story.state == StoryState.WORKING and story.key in opened:
            seconds = (seconds or 0.0) + max(0.0, (now - opened[story.key]).total_seconds())
        out[story.key] = round(seconds, 1) if seconds is not None else None
    return out


def run_status(session: Session, run: Run, target_now: str | None = None) -> dict[str, Any]:
    stories = stories_of(session, run.id)
    keys = {s.id: s.key for s in stories}
    candidates = list(session.scalars(select(Candidate).where(Candidate.run_id == run.id)
                                      .order_by(Candidate.id)))
    by_id = {c.id: c for c in candidates}
    now = utcnow()
    usage = usage_by_story(session, run.id)
    settled = settled_by_story(session, run.id)
    boxed = dict(session.execute(select(Attempt.story_id, Attempt.boxed)
                                 .where(Attempt.run_id == run.id).order_by(Attempt.id)).all())
    elapsed = worker_seconds(session, run.id, stories, now)
    shown = [story_json(s, now, usage.get(s.id), settled.get(s.key), boxed.get(s.id), elapsed[s.key])
             for s in stories]
    if run.state not in RUN_LIVE:
        for story in shown:  # nothing is admitted until it runs again: no stale wait reason
            story["waiting_for"] = None
    working = [s.id for s in stories if s.state == StoryState.WORKING]
    alive = workers_alive(session, working, now)
    for row, story in zip(stories, shown):  # from the story's lease, as recovery decides
        story["alive"] = alive.get(row.id)
    flakes = _flakes(session, run.id)
    for story in shown:
        story["flakes"] = sum(1 for f in flakes if f["story"] == story["key"])
    return {
        "flakes": flakes,
        "target_checks": _target_checks(session, run.id),
        "run": run_json(run, target_now),
        "stories": shown,
        "candidates": [candidate_json(c, keys.get(c.story_id, "?"), _on(c, by_id, keys))
                       for c in candidates],
        **live_run_view(session, run, now),
    }


def _flakes(session: Session, run_id: str) -> list[dict[str, Any]]:
    rows = session.scalars(select(Flake).where(Flake.run_id == run_id).order_by(Flake.id))
    return [{"story": f.story, "site": f.site, "attempt": f.attempt, "command": f.command,
             "tree": f.tree, "retry": f.retry, "failed_log": f.failed_log,
             "passed_log": f.passed_log, "at": _iso(f.at)} for f in rows]


def _target_checks(session: Session, run_id: str) -> list[dict[str, Any]]:
    rows = session.scalars(select(TargetCheck).where(TargetCheck.run_id == run_id)
                           .order_by(TargetCheck.id))
    return [{"target_sha": c.target_sha, "command": c.command, "state": c.state,
             "story": c.story, "log": c.log} for c in rows]


def night_notes(session: Session, run_id: str) -> list[str]:
    """What the run got past without a person, one line each: flaky commands (with their
    counts) and repaired stories (with their repair sessions)."""
    lines: list[str] = []
    counts: dict[str, list[str]] = {}
    for flake in _flakes(session, run_id):
        counts.setdefault(flake["command"], []).append(f"{flake['site']} {flake['story'] or 'target'}")
    for command, where in counts.items():
        lines.append(f"flaky: `{command}` failed then passed on a retry {len(where)}x "
                     f"({', '.join(where)})")
    repaired = session.execute(
        select(Story.key, Story.state).join(Attempt, Attempt.story_id == Story.id)
        .where(Attempt.run_id == run_id, Attempt.phase == Phase.REPAIR, Attempt.counted)
        .order_by(Story.seq)).all()
    sessions: dict[str, tuple[str, int]] = {}
    for key, state in repaired:
        sessions[key] = (state, sessions.get(key, (state, 0))[1] + 1)
    for key, (state, n) in sessions.items():
        lines.append(f"repaired: {key} ({n} repair session{'s' if n != 1 else ''}, now {state})")
    return lines


def _on(candidate: Candidate, by_id: dict[int, Candidate],
        keys: dict[int, str]) -> dict[str, Any] | None:
    below = by_id.get(candidate.on_candidate_id) if candidate.on_candidate_id else None
    if below is None:
        return None
    return {"story": keys.get(below.story_id, "?"), "attempt": below.attempt}


def journal_lines(session: Session, run_id: str, after_seq: int = 0,
                  kinds: Collection[str] = (), story: str | None = None) -> list[dict[str, Any]]:
    return [event_json(e) for e in events_after(session, run_id, after_seq, kinds, story)]
