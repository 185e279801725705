"""The run report's geometry: where each bar, mark and tick of the timeline goes, in pixels.

No HTML here: the layout turns the report's data (seconds from the origin) into boxes the
renderer draws as SVG. One pixel scale for the whole page (`Scale`), so a bar's width is its
duration times `px_per_s` everywhere: the story rows, the lane and the slot chart line up.
From `EPIC_GROUP_AT` stories on, the story rows are grouped by epic (one block per epic, each
with a summary bar), so a long sprint stays readable and the page small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ...states import CandidateState
from ..style import format_duration

__all__ = ["Scale", "Box", "Block", "TimelineLayout", "layout_report", "EPIC_GROUP_AT", "ticks",
           "gaps_within", "GAP_W"]

EPIC_GROUP_AT = 300  # stories; from here on the timeline groups rows by epic
LABEL_W = 220  # the story keys' column
CHART_W = 1100  # the time axis
ROW_H = 18
ROW_GAP = 4
LANE_ROW_H = 14
SLOTS_H = 64
MIN_BAR_W = 0.75  # a bar shorter than this is drawn this wide (still visible)
GAP_W = 12  # a paused or stopped span, whatever its length


@dataclass(frozen=True)
class Scale:
    """Seconds from the origin to pixels. The run's paused and stopped spans (`gaps`: sorted,
    apart, inside the span) are collapsed to `GAP_W` pixels each, so the work fills the width:
    a 36-minute stop no longer crams the night into a sliver. Between gaps a bar's width is
    its duration times `px_per_s` everywhere."""

    span_s: float
    gaps: tuple[tuple[float, float], ...] = ()

    @property
    def active_s(self) -> float:
        return max(0.0, self.span_s - sum(b - a for a, b in self.gaps))

    @property
    def px_per_s(self) -> float:
        room = CHART_W - GAP_W * len(self.gaps)
        return room / self.active_s if self.active_s > 0 else 0.0

    def x(self, t: float) -> float:
        t = max(0.0, t)
        active, gap_px = t, 0.0
        for a, b in self.gaps:
            if t <= a:
                break
            inside = min(t, b) - a
            active -= inside
            gap_px += GAP_W * inside / (b - a)
        return LABEL_W + active * self.px_per_s + gap_px

    def wall(self, active: float) -> float:
        """The time (from the origin) at `active` seconds of active time."""
        t = active
        for a, b in self.gaps:
            if a < t or (a == t and active > 0):
                t += b - a
        return t

    def width(self, start: float, end: float) -> float:
        return max(MIN_BAR_W, self.x(end) - self.x(start))

    @property
    def decimals(self) -> int:
        """Enough decimals of a second for a hundredth of a pixel, no more (the page's size)."""
        return min(6, max(0, math.ceil(math.log10(max(self.px_per_s, 1e-9) * 100))))

    def seconds(self, t: float) -> str:
        return f"{t:.{self.decimals}f}"

    def ticks(self) -> list[tuple[float, float]]:
        """(time from the origin, active seconds) of each tick: round numbers of active time."""
        return [(self.wall(a), a) for a in ticks(self.active_s)]


def gaps_within(pauses: Iterable[Sequence[float]],
                span_s: float) -> tuple[tuple[float, float], ...]:
    """The paused and stopped spans clipped to the report's span, sorted, merged."""
    out: list[list[float]] = []
    for a, b in sorted((max(0.0, a), min(span_s, b)) for a, b in pauses):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


@dataclass(frozen=True)
class Box:
    """One thing to draw: a bar (`w` > 0) or a mark (`w` == 0), with what it stands for."""

    x: float
    y: float
    w: float
    h: float
    kind: str  # a phase, wait, lane-wait, integrating, compose, verify, advance, or a mark's kind
    title: str
    data: dict[str, str] = field(default_factory=dict)  # data-* attributes (story, start, end ...)


@dataclass
class Block:
    """A group of rows drawn as one SVG: all stories, one epic's, or the lane."""

    name: str
    height: float
    labels: list[tuple[float, str, str]] = field(default_factory=list)  # (y, text, title)
    boxes: list[Box] = field(default_factory=list)
    summary: Box | None = None  # an epic's span, when grouped


@dataclass
class TimelineLayout:
    """Everything the timeline draws, placed: the story blocks, the lane, the slot chart."""

    scale: Scale
    blocks: list[Block]
    lane: Block
    slot_points: list[tuple[float, float]]  # the occupancy's step path, in pixels
    slot_n_y: float  # y of the N line in the slot chart
    grouped: bool
    pauses: list[tuple[float, float, float]]  # x ranges of the collapsed gaps, and their seconds


def ticks(span_s: float) -> list[float]:
    """Round seconds for the time axis: about eight of them, at 1, 2 or 5 × a power of ten
    (or minutes and hours for long nights)."""
    if span_s <= 0:
        return [0.0]
    raw = span_s / 8
    steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800]
    if raw < 1:
        power = 10 ** math.floor(math.log10(raw))
        step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    else:
        step = next((s for s in steps if s >= raw), 3600 * math.ceil(raw / 3600))
    return [i * step for i in range(int(span_s / step) + 1)]


def _segment_box(scale: Scale, y: float, key: str, segment: dict) -> Box:
    start, end = segment["start"], segment["end"]
    note = segment.get("note")
    title = f"{segment['kind']} {format_duration(end - start)}" + (f" ({note})" if note else "")
    data = {"story": key, "start": scale.seconds(start), "end": scale.seconds(end)}
    if segment.get("open"):
        data["open"] = "1"
    return Box(scale.x(start), y, scale.width(start, end), ROW_H, segment["kind"], title, data)


def _story_rows(scale: Scale, stories: list[dict], name: str) -> Block:
    block = Block(name, len(stories) * (ROW_H + ROW_GAP) + ROW_GAP)
    for index, story in enumerate(stories):
        y = ROW_GAP + index * (ROW_H + ROW_GAP)
        block.labels.append((y + ROW_H - 5, story["key"], f"{story['key']}: {story['state']}"))
        for segment in story["segments"]:
            block.boxes.append(_segment_box(scale, y, story["key"], segment))
        for mark in story["marks"]:
            block.boxes.append(Box(scale.x(mark["at"]), y, 0, ROW_H, mark["kind"],
                                   f"{story['key']} {mark['kind']}"
                                   + (f": {mark['note']}" if mark.get("note") else ""),
                                   {"story": story["key"], "at": f"{mark['at']:.3f}"}))
    return block


def _epic_blocks(scale: Scale, stories: list[dict]) -> list[Block]:
    epics: dict[str, list[dict]] = {}
    for story in stories:
        epics.setdefault(str(story.get("epic") or "-"), []).append(story)
    blocks = []
    for epic, members in epics.items():
        block = _story_rows(scale, members, f"epic {epic}")
        spans = [(s["start"], s["end"]) for m in members for s in m["segments"] if s["kind"] != "wait"]
        if spans:
            start, end = min(a for a, _ in spans), max(b for _, b in spans)
            block.summary = Box(scale.x(start), 0, scale.width(start, end), ROW_H, "epic",
                                f"epic {epic}: {len(members)} stories, {format_duration(end - start)}",
                                {"epic": epic, "start": f"{start:.3f}", "end": f"{end:.3f}"})
        blocks.append(block)
    return blocks


def _lane_block(scale: Scale, lane: list[dict]) -> Block:
    rows = max((c["row"] for c in lane), default=-1) + 1
    block = Block("lane", max(1, rows) * (LANE_ROW_H + 2) + 2)
    for row in range(max(1, rows)):
        block.labels.append((2 + row * (LANE_ROW_H + 2) + LANE_ROW_H - 3,
                             "lane" if row == 0 else f"lane, {row + 1} at once",
                             "candidates verifying at once sit one above the other"))
    for cand in lane:
        y = 2 + cand["row"] * (LANE_ROW_H + 2)
        who = f"{cand['story']} #{cand['attempt']} (stack {cand['stack']})"
        failed = cand["outcome"] == CandidateState.VERIFY_FAILED
        parts = [("compose", *cand["compose"]), ("verify-failed" if failed else "verify", *cand["verify"])]
        if cand["end"] is not None and cand["end"] > cand["verify"][1]:
            parts.append(("advance", cand["verify"][1], cand["end"]))
        for kind, start, end in parts:
            block.boxes.append(Box(scale.x(start), y, scale.width(start, end), LANE_ROW_H, kind,
                                   f"{who} {kind}: {format_duration(end - start)}, {cand['outcome']}",
                                   {"story": cand["story"], "attempt": str(cand["attempt"]),
                                    "stack": str(cand["stack"]), "row": str(cand["row"]),
                                    "start": scale.seconds(start), "end": scale.seconds(end)}))
        if cand["advance"] is not None:
            block.boxes.append(Box(scale.x(cand["advance"]), y, 0, LANE_ROW_H, "advanced",
                                   f"{who} advanced the target", {"story": cand["story"]}))
    return block


def _slot_points(scale: Scale, steps: list[list[float]], n: int,
                 end: float) -> tuple[list[tuple[float, float]], float]:
    top = max([n, *(busy for _, busy in steps)], default=1) or 1
    y = lambda busy: SLOTS_H - 2 - (SLOTS_H - 6) * busy / top  # noqa: E731
    points, busy = [(scale.x(0), y(0))], 0.0
    for t, now_busy in steps:
        points += [(scale.x(t), y(busy)), (scale.x(t), y(now_busy))]
        busy = now_busy
    points.append((scale.x(end), y(busy)))
    return points, y(n)


def layout_report(report: dict) -> TimelineLayout:
    span = report["span_s"] or 1.0
    scale = Scale(span, gaps_within(report["pauses"], span))
    stories = report["stories"]
    grouped = len(stories) >= EPIC_GROUP_AT
    blocks = _epic_blocks(scale, stories) if grouped else [_story_rows(scale, stories, "stories")]
    points, n_y = _slot_points(scale, report["slots"]["steps"], report["slots"]["n"],
                               report["span_s"])
    pauses = [(scale.x(a), scale.x(b), b - a) for a, b in scale.gaps]
    return TimelineLayout(scale, blocks, _lane_block(scale, report["lane"]), points, n_y, grouped, pauses)
