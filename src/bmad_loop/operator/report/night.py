"""Where the night went: per story and per phase, the time in agents, in verification and
waiting; the makespan against a lower bound for this plan, and the chain that sets it.

A story's *work* is its time in a worker slot (the sum of its phase segments). No schedule of
this plan on N slots can finish sooner than the longer of
- the longest chain: stories that cannot overlap, one after the other, in plan order — a story
  after each story it depends on, and after each earlier story whose footprint conflicts with
  its own (the engine never runs those at once) — weighed by their work;
- the total work ÷ N.
The makespan is the first story's start to the last story's end (the JUnit suite's time).
"""

from __future__ import annotations

from types import SimpleNamespace

from ...engine.lane.admission import ConflictIndex
from ...bmad.footprint import Footprint
from ...states import AttemptState
from .timeline import PHASES

__all__ = ["story_times", "phase_times", "lower_bound", "in_worker", "active_seconds"]

_WAITS = ("wait", "lane-wait")
# A session that did not fail: it succeeded, runs still, or was interrupted (not counted).
_NOT_FAILED = (AttemptState.SUCCEEDED, AttemptState.RUNNING, AttemptState.INTERRUPTED)


def _seconds(segments, kinds) -> float:
    return sum(s["end"] - s["start"] for s in segments if s["kind"] in kinds)


def in_worker(track: dict, start: float | None, duration: float | None) -> float:
    """The part of a session (from `start`, seconds from the origin, lasting `duration`) that
    lies in the story's worker segments: a session's row may say it lasted past the worker
    (ended only when a crash or a stop was recovered), its agent time never does."""
    if start is None or not duration:
        return 0.0
    end = start + duration
    return sum(max(0.0, min(end, s["end"]) - max(start, s["start"]))
               for s in track["segments"] if s["kind"] in PHASES)


def story_times(track: dict, attempts: list[dict], verifies: list[float]) -> dict:
    """One story's totals: wall in a worker (`work_s`), agent sessions (within it), verify
    runs, waiting. An interrupted session (a stop, Ctrl+C) is counted apart, not failed."""
    segments = track["segments"]
    return {
        "work_s": round(_seconds(segments, PHASES), 3),
        "agent_s": round(sum(a["agent_s"] for a in attempts), 3),
        "verify_s": round(sum(verifies), 3),
        "wait_s": round(_seconds(segments, _WAITS), 3),
        "integrating_s": round(_seconds(segments, ("integrating",)), 3),
        "sessions": len(attempts),
        "failed_sessions": sum(1 for a in attempts if a["state"] not in _NOT_FAILED),
        "interrupted_sessions": sum(1 for a in attempts if a["state"] == AttemptState.INTERRUPTED),
    }


def phase_times(tracks: dict[str, dict], attempts: list[dict]) -> dict[str, dict]:
    """Per phase over all stories: its wall time, agent time and how many stories went there."""
    out = {phase: {"wall_s": 0.0, "agent_s": 0.0, "stories": 0} for phase in PHASES}
    for track in tracks.values():
        seen = set()
        for segment in track["segments"]:
            if segment["kind"] in out:
                out[segment["kind"]]["wall_s"] += segment["end"] - segment["start"]
                seen.add(segment["kind"])
        for phase in seen:
            out[phase]["stories"] += 1
    for attempt in attempts:
        if attempt["phase"] in out:
            out[attempt["phase"]]["agent_s"] += attempt["agent_s"]
    return {phase: {k: round(v, 3) for k, v in row.items()} for phase, row in out.items()
            if row["stories"] or row["agent_s"]}


def _footprint(story: dict) -> Footprint:
    fp = story.get("footprint") or {}
    return Footprint(tuple(fp.get("files") or ()), tuple(fp.get("shared") or ()),
                     tuple(fp.get("resources") or ()), story.get("footprint_reason"))


def _before(stories: list[dict]) -> dict[str, set[str]]:
    """Story key -> the earlier stories it cannot overlap with (dependencies, conflicts), the
    conflicts from admission's own index; an exclusive footprint conflicts with every story."""
    known = {s["key"] for s in stories}
    rows = [SimpleNamespace(key=s["key"], seq=s["seq"], footprint=_footprint(s)) for s in stories]
    index = ConflictIndex()
    index.update(rows)
    out, walls = {}, []
    for position, (story, row) in enumerate(zip(stories, rows)):
        earlier = {dep for dep in story.get("depends_on") or () if dep in known}
        if row.footprint.exclusive:
            earlier |= {r.key for r in rows[:position]}
            walls.append(row.key)
        else:
            earlier |= set(index.earlier_conflicts(row.key)) | set(walls)
        earlier.discard(story["key"])
        out[story["key"]] = earlier
    return out


def lower_bound(stories: list[dict], work: dict[str, float], slots: int) -> dict:
    """The bound and its chain (`stories` in plan order; `work`: key -> seconds)."""
    ordered = sorted(stories, key=lambda s: s["seq"])
    before = _before(ordered)
    best: dict[str, tuple[float, str | None]] = {}  # key -> (chain length ending here, prev)
    for story in ordered:
        key = story["key"]
        prev = max(((best[k][0], k) for k in before[key] if k in best), default=(0.0, None))
        best[key] = (prev[0] + work.get(key, 0.0), prev[1])
    chain: list[str] = []
    key = max(best, key=lambda k: best[k][0]) if best else None
    chain_s = best[key][0] if key else 0.0
    while key is not None:
        chain.append(key)
        key = best[key][1]
    total = sum(work.values())
    share = total / max(1, slots)
    return {"chain": chain[::-1], "chain_s": round(chain_s, 3), "work_s": round(total, 3),
            "slots": slots, "work_per_slot_s": round(share, 3),
            "lower_bound_s": round(max(chain_s, share), 3),
            "bound_by": "chain" if chain_s >= share else "work ÷ N"}


def active_seconds(start: float, end: float, pauses) -> float:
    """Seconds of [start, end] outside the paused and stopped spans: the time the run was
    running (or pausing: its running stories finish then), the work's own time."""
    paused = sum(max(0.0, min(end, b) - max(start, a)) for a, b in pauses)
    return max(0.0, end - start - paused)
