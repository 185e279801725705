"""The run report's data: everything `report --html` draws and `report --json` prints, read from
the rows (runs, stories, attempts, candidates), the journal and the local log files.

Nothing here needs the run to have ended: a paused, stopped or crashed run is reported as the
rows and the journal leave it. The report ends at the run's end; for a run that has none (in
progress, or crashed without a word) at the newest thing known of it — its last event or the
last heartbeat of its stories and sessions — so a report written the morning after a crash does
not stretch the night to the morning.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from sqlalchemy import select

from ...db.models import Attempt, Run, Story, utcnow
from ...errors import BmadLoopError
from ...engine.runpaths import Layout
from ...engine.runrows import run_policy
from ...engine.run.status import journal_lines, run_status
from ...engine.usage import USAGE_COLUMNS, usage_by_story_phase
from ...states import RUN_SETTLED
from ..history import outcome_of
from .ci_summary import summary, usage_total
from .failures import failures
from .night import active_seconds, in_worker, lower_bound, phase_times, story_times
from .timeline import build_timeline, parse_ts
from ...engine.journal import EventKind

__all__ = ["gather_report", "REPORT_FORMAT"]

REPORT_FORMAT = 1
_VERIFY_KINDS = (EventKind.VERIFY_PASSED, EventKind.VERIFY_FAILED)


def _attempt_rows(session, run_id: str, origin) -> dict[int, list[dict]]:
    """Story id -> its sessions, oldest first (`start`: seconds from `origin`)."""
    out: dict[int, list[dict]] = {}
    query = select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.id)
    for a in session.scalars(query):
        duration = a.duration_s
        if duration is None and a.ended_at is not None and a.started_at is not None:
            duration = (a.ended_at - a.started_at).total_seconds()
        out.setdefault(a.story_id, []).append({
            "phase": a.phase, "number": a.number, "state": a.state, "duration_s": duration,
            "start": (a.started_at - origin).total_seconds() if a.started_at else None,
            "exit_code": a.exit_code, "reason": a.reason, "host": a.host, "log": a.log,
            **{name: getattr(a, name) for name in USAGE_COLUMNS}})
    return out


def _report_end(run: Run, events: list[dict], session) -> dt.datetime:
    if run.ended_at is not None:
        return run.ended_at
    known = [parse_ts(events[-1]["ts"])] if events else [run.created_at]
    beats = session.scalars(select(Story.heartbeat_at).where(Story.run_id == run.id)).all()
    beats += session.scalars(select(Attempt.heartbeat_at).where(Attempt.run_id == run.id)).all()
    known += [b for b in beats if b is not None]
    return max(known)


def _verify_seconds(events: list[dict]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for event in events:
        if event["kind"] in _VERIFY_KINDS and event["story"]:
            out.setdefault(event["story"], []).append(float(event["data"].get("duration_s") or 0))
    return out


def _usage_by_story(usage: dict[tuple[int, str], dict]) -> dict[int, dict[str, dict]]:
    """Story id -> {phase: usage}, only the phases whose sessions reported something."""
    out: dict[int, dict[str, dict]] = {}
    for (story_id, phase), values in usage.items():
        if any(v is not None for v in values.values()):
            out.setdefault(story_id, {})[phase] = values
    return out


def gather_report(session, run: Run, state_dir: Path) -> dict:
    """The report of `run` as one JSON-able dict (see docs/operator.md for its fields)."""
    status = run_status(session, run)
    events = journal_lines(session, run.id)
    origin = run.created_at
    end = _report_end(run, events, session)
    rows = {s.key: s for s in session.scalars(select(Story).where(Story.run_id == run.id))}
    timeline = build_timeline(events, [s["key"] for s in status["stories"]], origin,
                              max(0.0, (end - origin).total_seconds()))
    attempts = _attempt_rows(session, run.id, origin)
    verifies = _verify_seconds(events)
    usage = _usage_by_story(usage_by_story_phase(session, run.id))
    layout = Layout(state_dir, run.id)
    stories = []
    for story in status["stories"]:
        track = timeline.stories.get(story["key"], {"segments": [], "marks": []})
        row = rows[story["key"]]
        mine = attempts.get(row.id, [])
        for attempt in mine:  # its agent time: the part inside the story's worker segments
            attempt["agent_s"] = in_worker(track, attempt["start"], attempt["duration_s"])
        stories.append({**_story_fields(story), **track,
                        **story_times(track, mine, verifies.get(story["key"], [])),
                        "usage_by_phase": usage.get(row.id, {}),
                        "log_dir": str(layout.log(story["key"], "dev", 1).parent)})
    work = {s["key"]: s["work_s"] for s in stories}
    every_attempt = [a for rows_ in attempts.values() for a in rows_]
    times = [(parse_ts(e["ts"]) - origin).total_seconds() for e in events]
    outcome, code = outcome_of(run, list(rows.values()))
    spans = _makespan(stories, timeline.pauses)
    bound = lower_bound(stories, work, run.max_parallel)
    # Active time against the bound: a stop of 36 minutes is nobody's work.
    bound["ratio"] = round(spans["active_s"] / bound["lower_bound_s"], 2) \
        if bound["lower_bound_s"] else None
    return {
        "format": REPORT_FORMAT,
        "run": {**status["run"], "outcome": outcome, "exit_code": code,
                "created_at": _iso(origin), "report_end": _iso(end),
                "silent_s": _silence(run, end)},
        "span_s": round(timeline.end, 3),
        **spans,
        "summary": summary(status),
        "usage": usage_total(status["stories"]),
        "stories": stories,
        "lane": timeline.lane,
        "slots": {"n": run.max_parallel, "steps": timeline.slots},
        "pauses": timeline.pauses,
        "phases": phase_times({s["key"]: s for s in stories}, every_attempt),
        "bound": bound,
        "failures": failures(events, times, {s["key"]: s for s in stories},
                             {s["key"]: Path(s["log_dir"]) for s in stories}),
        "commits": timeline.commits,
        # What the run got past without a person: flaky commands, target checks, repairs.
        "flakes": status.get("flakes", []),
        "target_checks": status.get("target_checks", []),
        "repairs": _repairs(events),
    }


def _repairs(events: list[dict]) -> list[dict]:
    """Each repair that ended: story, number, cause, outcome, reason (from `repair.finished`)."""
    return [{"story": e["story"], "number": e["data"].get("number"), "cause": e["data"].get("cause"),
             "outcome": e["data"].get("outcome"), "reason": e["data"].get("reason")}
            for e in events if e["kind"] == EventKind.REPAIR_FINISHED]


_STORY_KEYS = ("key", "seq", "epic", "title", "state", "phase", "reason", "host", "branch",
               "head_sha", "integrated_sha", "started_at", "ended_at", "attempt", "review_cycles",
               "depends_on", "footprint", "footprint_reason", "usage", "log", "repairs",
               "flakes")


def _story_fields(story: dict) -> dict:
    return {name: story.get(name) for name in _STORY_KEYS}


def _silence(run: Run, end: dt.datetime) -> float | None:
    """Seconds nothing has been heard of a run that has not settled, once that is more than
    max(30 s, 2 × [leases] ttl_s) (a crash, or workers stopped: `status` warns alike); else None."""
    if run.state in RUN_SETTLED:
        return None
    ttl: float
    try:
        ttl = run_policy(run).leases.ttl_s
    except BmadLoopError:  # a snapshot that no longer validates: the default
        ttl = 60.0
    quiet = (utcnow() - end).total_seconds()
    return round(quiet, 1) if quiet > max(30.0, 2 * ttl) else None


def _makespan(stories: list[dict], pauses) -> dict:
    """`makespan_s`: the first story's start (its first phase) to the last story's end (its
    last segment or mark), parallel stories not added up, waits before the first start not
    counted; `active_s`: that span less the time the run was paused or stopped
    (`paused_s`)."""
    starts = [seg["start"] for s in stories for seg in s["segments"] if seg["kind"] != "wait"]
    ends = [seg["end"] for s in stories for seg in s["segments"]]
    ends += [m["at"] for s in stories for m in s["marks"]]
    if not (starts and ends):
        return {"makespan_s": 0.0, "active_s": 0.0, "paused_s": 0.0}
    start, end = min(starts), max(ends)
    active = active_seconds(start, end, pauses)
    return {"makespan_s": round(end - start, 3), "active_s": round(active, 3),
            "paused_s": round(end - start - active, 3)}


def _iso(value) -> str | None:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else None
