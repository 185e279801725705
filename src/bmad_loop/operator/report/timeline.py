"""The run report's timeline, read from the journal: what each story did when, what the lane did
when, and how many worker slots were busy.

Every time is seconds from the report's origin (the run's creation). A story's row is a list of
segments: its phases (`prepare`, `create`, `dev`, `verify`, `review`, `fix`, `commit`) from its
`story.phase` events, the waits before it had a slot (`wait`, with what held it back from
`story.waiting`), the wait for the lane once it was ready (`lane-wait`) and its integration
(`integrating`); marks are points (`integrated`, `escalated`, ...). A segment still open when
the journal ends (a paused, stopped or crashed run) ends at the report's end and says `open`.
The lane is one bar per candidate (compose, verify, then the wait to advance), each bar on the
first sub-row free at its start, so candidates verified at once (a speculative stack) show one
above the other.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import overload

from ...states import CandidateState, Phase
from ...engine.journal import EventKind

__all__ = ["Timeline", "build_timeline", "parse_ts", "PHASES"]

PHASES = tuple(phase.value for phase in Phase if phase is not Phase.INTEGRATE)  # a worker's
# A story leaves its worker slot with these (its open phase ends there).
_LEAVES_WORKER: dict[str, str] = {EventKind.STORY_READY: "ready", EventKind.STORY_ESCALATED: "escalated",
                  EventKind.STORY_INTERRUPTED: "interrupted", EventKind.STORY_RESTACKED: "restacked",
                  EventKind.STORY_RECOVERED: "recovered", EventKind.STORY_SKIPPED: "skipped"}
_MARKS: dict[str, str] = {EventKind.STORY_INTEGRATED: "integrated", EventKind.STORY_ESCALATED: "escalated",
          EventKind.STORY_BLOCKED: "blocked", EventKind.STORY_HELD: "held",
          EventKind.STORY_INTERRUPTED: "interrupted", EventKind.STORY_SKIPPED: "skipped"}
_CANDIDATE_ENDS: dict[str, str] = {
    EventKind.CANDIDATE_VERIFIED: "verified", EventKind.CANDIDATE_VERIFY_FAILED: "verify-failed",
    EventKind.CANDIDATE_CONFLICT: "conflict", EventKind.CANDIDATE_STALE: "stale",
    EventKind.CANDIDATE_ABANDONED: "abandoned"}


@overload
def parse_ts(ts: None) -> None: ...
@overload
def parse_ts(ts: str | dt.datetime) -> dt.datetime: ...
def parse_ts(ts: str | dt.datetime | None) -> dt.datetime | None:
    """An aware UTC datetime from an ISO string (with or without fractions) or a datetime."""
    if ts is None or isinstance(ts, dt.datetime):
        return ts
    text = ts.rstrip("Z")
    value = dt.datetime.fromisoformat(text)
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value


@dataclass
class _StoryTrack:
    segments: list[dict] = field(default_factory=list)
    marks: list[dict] = field(default_factory=list)
    open_kind: str | None = None
    open_at: float = 0.0
    open_note: str | None = None
    waiting: str | None = None  # the newest `story.waiting` reason
    waiting_since: float | None = None  # pending (or back to pending) since

    def close(self, at: float) -> None:
        if self.open_kind is not None:
            segment = {"kind": self.open_kind, "start": self.open_at, "end": max(at, self.open_at)}
            if self.open_note:
                segment["note"] = self.open_note
            self.segments.append(segment)
        self.open_kind, self.open_note = None, None

    def open(self, kind: str, at: float, note: str | None = None) -> None:
        self.close(at)
        self.open_kind, self.open_at, self.open_note = kind, at, note


@dataclass
class Timeline:
    end: float  # seconds from the origin to the report's end
    stories: dict[str, dict]  # key -> {"segments": [...], "marks": [...]}
    lane: list[dict]  # one per candidate: story, attempt, stack, row, compose/verify/advance
    slots: list[list[float]]  # [[t, busy], ...]: worker slots in use from t on
    pauses: list[list[float]]  # [[start, end], ...]: the run paused or stopped
    commits: list[dict]  # what moved the target, in order


class _Builder:
    def __init__(self, origin: dt.datetime, keys):
        self.origin = origin
        self.tracks = {key: _StoryTrack(waiting_since=0.0) for key in keys}
        self.candidates: dict[tuple[str, int | None], dict] = {}
        self.composing: dict[str, float] = {}
        self.busy: set[str] = set()
        self.slots: list[list[float]] = [[0.0, 0]]
        self.pauses: list[list[float]] = []
        self.paused_at: float | None = None
        self.commits: list[dict] = []

    def at(self, event) -> float:
        return (parse_ts(event["ts"]) - self.origin).total_seconds()

    def occupancy(self, t: float, key: str, busy: bool) -> None:
        if busy == (key in self.busy):
            return
        (self.busy.add if busy else self.busy.discard)(key)
        self.slots.append([t, len(self.busy)])

    def story_event(self, t: float, kind: str, key: str, data: dict) -> None:
        track = self.tracks.setdefault(key, _StoryTrack(waiting_since=0.0))
        if kind == EventKind.STORY_WAITING:
            track.waiting = data.get("reason")
            if track.waiting_since is None:
                track.waiting_since = t
        elif kind in (EventKind.STORY_QUEUED, EventKind.STORY_STARTED) and track.waiting_since is not None:
            if t > track.waiting_since:
                track.segments.append({"kind": "wait", "start": track.waiting_since, "end": t,
                                       "note": track.waiting or "pending"})
            track.waiting_since, track.waiting = None, None
        if kind == EventKind.STORY_PHASE:
            track.open(str(data.get("phase")), t)
            self.occupancy(t, key, True)
        elif kind in _LEAVES_WORKER:
            track.close(t)
            self.occupancy(t, key, False)
            if kind == EventKind.STORY_READY:
                track.open("lane-wait", t, "ready, waiting for the lane")
            elif kind in (EventKind.STORY_RESTACKED, EventKind.STORY_RECOVERED, EventKind.STORY_INTERRUPTED):
                track.waiting_since = t
        elif kind == EventKind.STORY_INTEGRATING:
            track.open("integrating", t)
            self.composing[key] = t
        if kind in _MARKS:
            track.close(t)
            track.marks.append({"kind": _MARKS[kind], "at": t,
                                "note": data.get("reason") or data.get("sha")})

    def candidate_event(self, t: float, kind: str, key: str, data: dict) -> None:
        attempt = data.get("attempt")
        if kind == EventKind.CANDIDATE_COMPOSED:
            start = self.composing.pop(key, t)
            self.candidates[(key, attempt)] = {
                "story": key, "attempt": attempt, "stack": data.get("stack"),
                "compose": [start, t], "verify": [t, None], "advance": None, "end": None,
                "outcome": None}
            return
        cand = self.candidates.get((key, attempt))
        if cand is None:
            return
        if kind == EventKind.CANDIDATE_REVERIFYING:
            cand["verify"] = [t, None]
        elif kind in _CANDIDATE_ENDS:
            if cand["verify"][1] is None:
                cand["verify"][1] = t
            cand["outcome"] = _CANDIDATE_ENDS[kind]
            if kind != EventKind.CANDIDATE_VERIFIED:
                cand["end"] = t
        elif kind == EventKind.TARGET_ADVANCED:
            cand["advance"] = t
            cand["end"] = t
            cand["outcome"] = "advanced"
            self.commits.append({"sha": data.get("new"), "old": data.get("old"), "story": key,
                                 "attempt": attempt, "at": t, "kind": "advanced",
                                 "strategy": data.get("strategy")})

    def run_event(self, t: float, kind: str, data: dict) -> None:
        if kind in (EventKind.RUN_PAUSED, EventKind.RUN_STOPPED) and self.paused_at is None:
            self.paused_at = t
        elif kind == EventKind.RUN_RESUMED:
            if self.paused_at is not None:
                self.pauses.append([self.paused_at, t])
                self.paused_at = None
            for track in self.tracks.values():  # waiting again from the resume on
                if track.waiting_since is not None:
                    track.waiting_since = t
        elif kind == EventKind.TARGET_ADOPTED:
            self.commits.append({"sha": data.get("new") or data.get("sha"), "old": data.get("old"),
                                 "story": None, "attempt": None, "at": t, "kind": "adopted",
                                 "strategy": None})

    def finish(self, end: float) -> Timeline:
        stories = {}
        for key, track in self.tracks.items():
            if track.open_kind is not None:
                kind, note = track.open_kind, track.open_note
                track.close(end)
                track.segments[-1]["open"] = True
                track.segments[-1]["kind"], track.segments[-1]["note"] = kind, note or "open"
            if track.waiting_since is not None and track.waiting is not None and end > track.waiting_since:
                track.segments.append({"kind": "wait", "start": track.waiting_since, "end": end,
                                       "note": track.waiting, "open": True})
            stories[key] = {"segments": sorted(track.segments, key=lambda s: s["start"]),
                            "marks": track.marks}
        if self.paused_at is not None:
            self.pauses.append([self.paused_at, end])
        lane = sorted(self.candidates.values(), key=lambda c: c["compose"][0])
        for cand in lane:
            if cand["verify"][1] is None:
                cand["verify"][1] = end
                cand["outcome"] = cand["outcome"] or "open"
            if cand["end"] is None:
                cand["end"] = end if cand["outcome"] in (CandidateState.VERIFIED, "open") else cand["verify"][1]
        _pack_rows(lane)
        return Timeline(end, stories, lane, self.slots, self.pauses, self.commits)


def _pack_rows(lane: list[dict]) -> None:
    """Each candidate on the first lane sub-row free at its start (interval packing)."""
    free_at: list[float] = []
    for cand in lane:
        start = cand["compose"][0]
        row = next((i for i, t in enumerate(free_at) if t <= start), len(free_at))
        if row == len(free_at):
            free_at.append(0.0)
        free_at[row] = cand["end"]
        cand["row"] = row


def build_timeline(events: list[dict], keys, origin: dt.datetime, end: float) -> Timeline:
    """The timeline from the run's journal (`event_json` dicts, in order)."""
    builder = _Builder(origin, keys)
    for event in events:
        t, kind, key, data = builder.at(event), event["kind"], event["story"], event["data"] or {}
        if kind.startswith("candidate.") or kind == EventKind.TARGET_ADVANCED:
            if key:
                builder.candidate_event(t, kind, key, data)
        elif kind.startswith("run.") or kind == EventKind.TARGET_ADOPTED:
            builder.run_event(t, kind, data)
        if key and kind.startswith("story."):
            builder.story_event(t, kind, key, data)
    return builder.finish(end)
