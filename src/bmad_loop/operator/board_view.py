"""The live board of `bmad-loop status --watch`: a pure function of (status, previous frame, now).

`render_board` takes the `status --json` dict, the frame it drew last time and the time, and
returns the next frame: a rich renderable plus the signature of every row, so the rows that
changed since the last frame carry a marker. Nothing here reads the database or the clock,
so the board is tested on recorded frames.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..states import (
    STORY_AWAITING_LANE,
    STORY_DONE,
    STORY_IN_FLIGHT,
    STORY_NEEDS_HUMAN,
    RunState,
    StoryState,
)
from .style import (
    composed_on,
    current_candidate,
    elapsed_text,
    format_duration,
    preserved,
    short_sha,
    stack_of,
    state_text,
)

__all__ = ["Frame", "render_board", "lane_queue", "held_back", "MARK"]

MARK = "●"
# An escalated or blocked story holds the lane back only when escalation pauses the run.
_PAUSES_LANE = frozenset({StoryState.ESCALATED, StoryState.BLOCKED})


@dataclass(frozen=True)
class Frame:
    rows: dict = field(default_factory=dict)  # row id -> signature (what "changed" compares)
    changed: frozenset = frozenset()
    renderable: object = None
    stale: tuple = ()  # keys of workers whose heartbeat stopped


def _parse(ts: str | None):
    if not ts:
        return None
    return dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


def _output_age(story: dict, now: dt.datetime) -> Text:
    """How long a working story's session has printed nothing (its log's mtime, see stallwatch)."""
    last = _parse(story.get("last_output_at"))
    if story["state"] != StoryState.WORKING or last is None:
        return Text("-")
    return Text(f"{format_duration(max((now - last).total_seconds(), 0))} ago")


def lane_queue(status: dict, *, escalation_blocks: bool = True) -> list[tuple[dict, str]]:
    """Finished stories waiting for the lane, in plan order, each with what it waits for."""
    stories = sorted(status["stories"], key=lambda s: s["seq"])
    integrating = next((s for s in stories if s["state"] == StoryState.INTEGRATING), None)
    out = []
    for story in stories:
        if story["state"] not in STORY_AWAITING_LANE:
            continue
        if story["state"] == StoryState.INTEGRATING:
            out.append((story, _in_lane(story, status.get("candidates", []))))
            continue
        blocker = None
        for earlier in stories:
            if earlier["seq"] >= story["seq"]:
                break
            if earlier["state"] in STORY_DONE:
                continue
            if earlier["state"] in _PAUSES_LANE and not escalation_blocks:
                continue
            blocker = earlier
            break
        if blocker is None or blocker is integrating:
            why = (f"the lane ({integrating['key']} integrating)" if integrating
                   else "next in line")
        elif blocker["state"] in STORY_NEEDS_HUMAN:
            why = f"{blocker['key']} ({blocker['state']}: needs a human)"
        else:
            why = f"{blocker['key']} ({blocker['state']}" + (
                f", {blocker['phase']})" if blocker.get("phase") and blocker["state"] == StoryState.WORKING
                else ")")
        out.append((story, why))
    return out


def _in_lane(story: dict, candidates: list[dict]) -> str:
    """An integrating story: its candidate's place when the lane verifies several at once."""
    stack = stack_of(candidates)
    mine = next((c for c in stack if c["story"] == story["key"]), None)
    if len(stack) < 2 or mine is None:
        return "in the lane now"
    return f"in the lane now: candidate {mine.get('stack') or 1} of {len(stack)}, {mine['state']} on {composed_on(mine)}"


def held_back(status: dict) -> list[tuple[dict, str]]:
    """Stories that cannot move on their own, and why."""
    out = []
    run_state = status["run"]["state"]
    for story in sorted(status["stories"], key=lambda s: s["seq"]):
        if story["state"] == StoryState.PENDING:
            why = story.get("waiting_for") or "not admitted yet"
            if run_state != RunState.RUNNING:  # nothing is admitted until the run runs again
                why = f"run {run_state}" + (f" (last: {story['waiting_for']})"
                                            if story.get("waiting_for") else "")
            out.append((story, why))
        elif story["state"] in STORY_NEEDS_HUMAN or story["state"] == StoryState.FAILED:
            out.append((story, story.get("reason") or story["state"]))
    return out


def _table(title: str, columns: tuple[str, ...], no_wrap: tuple[str, ...] = ("", "#")) -> Table:
    table = Table(title=title, title_justify="left", expand=True, show_edge=False, pad_edge=False)
    for name in columns:
        table.add_column(name, no_wrap=name in no_wrap)
    return table


class _Marks:
    """Each row's signature this frame, and whether it changed since `previous`."""

    def __init__(self, previous: Frame | None):
        self.previous = previous
        self.rows: dict[str, tuple] = {}

    def changed(self, row_id: str, signature: tuple) -> bool:
        self.rows[row_id] = signature
        return self.previous is not None and self.previous.rows.get(row_id) != signature

    def mark(self, flag: bool) -> Text:
        return Text(MARK, style="bold yellow") if flag else Text(" ")

    def story_table(self, title: str, last: str, prefix: str, entries, empty: str) -> Table:
        """A table of (story, why) rows, marked where they changed since the last frame."""
        table = _table(title, ("", "#", "story", "state", last))
        for story, why in entries:
            flag = self.changed(f"{prefix}:{story['key']}", (story["state"], why))
            table.add_row(self.mark(flag), str(story["seq"]), story["key"], state_text(story["state"]), why)
        if not table.row_count:
            table.add_row("", "", Text(empty, style="dim"), "", "")
        return table


def render_board(status: dict, previous: Frame | None, now: dt.datetime, *,
                 stale_after_s: float = 60.0, escalation_blocks: bool = True) -> Frame:
    stories = sorted(status["stories"], key=lambda s: s["seq"])
    candidates = status.get("candidates", [])
    marks = _Marks(previous)
    header = _run_header(status["run"], stories, marks, now)
    workers, stale = _workers(stories, marks, now, stale_after_s)
    queue = marks.story_table("finished, waiting for the lane (plan order)", "waits for", "queue",
                              lane_queue(status, escalation_blocks=escalation_blocks),
                              "nothing waiting")
    held = marks.story_table("held back", "why", "held", held_back(status), "nothing held back")
    parts = [Panel(header, title="bmad-loop", title_align="left"), workers, Text(""),
             _lane_line(candidates, marks), queue, Text(""), held]
    kept = _preserved(candidates, marks)
    if kept is not None:
        parts += [Text(""), kept]
    summary = _landed_summary(stories)
    if summary is not None:
        parts.append(summary)
    marked = frozenset(k for k, v in marks.rows.items()
                       if previous is not None and previous.rows.get(k) != v)
    return Frame(rows=marks.rows, changed=marked, renderable=Group(*parts), stale=tuple(stale))


def _run_header(run: dict, stories: list, marks: _Marks, now: dt.datetime) -> Text:
    counts: dict[str, int] = {}
    for story in stories:
        counts[story["state"]] = counts.get(story["state"], 0) + 1
    run_changed = marks.changed("run", (run["state"], run.get("reason"), run.get("target_sha")))
    header = Text()
    header.append(MARK + " " if run_changed else "  ", style="bold yellow")
    header.append(f"run {run['id']}  ", style="bold")
    header.append(state_text(run["state"]))
    header.append(f"   target {run['target_branch']} @ {short_sha(run.get('target_sha'))}"
                  f"   strategy {run.get('merge_strategy') or '-'}"
                  f"   max_parallel {run.get('max_parallel')}")
    header.append("\n  " + f"{len(stories)} stories: " + ", ".join(
        f"{n} {state}" for state, n in counts.items()))
    if run.get("reason"):
        header.append(f"\n  {run['reason']}", style="italic")
    header.append(f"\n  updated {now.astimezone(dt.timezone.utc):%H:%M:%S} UTC", style="dim")
    return header


def _workers(stories: list, marks: _Marks, now: dt.datetime, stale_after_s: float):
    """The table of stories in flight, and the keys of those whose worker looks gone."""
    workers = _table("workers in flight",
                     ("", "story", "state", "host", "phase", "elapsed", "base", "session", "heartbeat",
                      "last output"),
                     no_wrap=("", "base", "elapsed"))
    stale = []
    for story in stories:
        if story["state"] not in STORY_IN_FLIGHT:
            continue
        beat = _parse(story.get("heartbeat_at"))
        age = (now - beat).total_seconds() if beat else None
        # Its lease says its worker is gone (`alive`, leases.is_live), or its beat is old.
        is_stale = story["state"] == StoryState.WORKING and (
            story.get("alive") is False or age is not None and age > stale_after_s)
        if is_stale:
            stale.append(story["key"])
            beat_text = Text(f"STALE {format_duration(age or 0)} ago", style="bold red")
        elif age is not None:
            beat_text = Text(f"{format_duration(max(age, 0))} ago")
        else:
            beat_text = Text("-")
        flag = marks.changed(f"worker:{story['key']}", (story["state"], story.get("phase"),
                                                         story.get("session"), story.get("base_sha"),
                                                         is_stale))
        workers.add_row(marks.mark(flag), story["key"], state_text(story["state"]),
                        story.get("host") or "-", story.get("phase") or "-",
                        elapsed_text(story.get("elapsed_s")), short_sha(story.get("base_sha")),
                        story.get("session") or "-", beat_text, _output_age(story, now))
    if not workers.row_count:
        workers.add_row("", Text("no worker in flight", style="dim"), "", "", "", "", "", "", "", "")
    return workers, stale


def _lane_line(candidates: list, marks: _Marks) -> Text:
    stack = stack_of(candidates)
    if len(stack) > 1:  # speculative candidates: several composed ahead, verified at once
        lane_line = Text()
        signature = tuple((c["story"], c["attempt"], c["state"]) for c in stack)
        lane_line.append(MARK + " " if marks.changed("lane", signature) else "  ", style="bold yellow")
        lane_line.append(f"lane: {len(stack)} candidates, target advances bottom first", style="bold")
        for cand in stack:
            lane_line.append(f"\n    {cand.get('stack') or 1}. {cand['story']} #{cand['attempt']} ")
            lane_line.append(state_text(cand["state"]))
            lane_line.append(f"  on {composed_on(cand)} -> {short_sha(cand.get('candidate_sha'))}")
        return lane_line
    current = current_candidate(candidates)
    lane_changed = marks.changed("lane", (current["story"], current["attempt"], current["state"])
                                 if current else ("idle",))
    lane_line = Text()
    lane_line.append(MARK + " " if lane_changed else "  ", style="bold yellow")
    if current:
        lane_line.append(f"lane: {current['story']} candidate #{current['attempt']} ", style="bold")
        lane_line.append(state_text(current["state"]))
        lane_line.append(f"  ({current.get('strategy') or '-'} on {short_sha(current.get('target_sha'))}"
                         f" -> {short_sha(current.get('candidate_sha'))})")
    else:
        lane_line.append("lane: idle", style="bold")
    return lane_line


def _preserved(candidates: list, marks: _Marks) -> Table | None:
    kept_candidates = preserved(candidates)
    if not kept_candidates:
        return None
    kept = _table("preserved candidates", ("", "story", "#", "state", "evidence"))
    for cand in kept_candidates:
        flag = marks.changed(f"cand:{cand['story']}#{cand['attempt']}",
                             (cand["state"], cand.get("evidence")))
        kept.add_row(marks.mark(flag), cand["story"], str(cand["attempt"]),
                     Text(cand["state"], style="red"), cand.get("evidence") or cand.get("ref") or "-")
    return kept


def _landed_summary(stories: list) -> Text | None:
    landed = [s["key"] for s in stories if s["state"] == StoryState.INTEGRATED]
    skipped = [s["key"] for s in stories if s["state"] == StoryState.SKIPPED]
    if not (landed or skipped):
        return None
    summary = Text("\n")
    if landed:
        summary.append("landed: ", style="bold green")
        summary.append(", ".join(landed))
    if skipped:
        summary.append("   skipped: ", style="bold")
        summary.append(", ".join(skipped))
    return summary
