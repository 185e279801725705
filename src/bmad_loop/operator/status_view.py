"""`bmad-loop status` for a person: the plain text, the live board of `--watch`, and the TUI's
lane panel, all drawn from the `status --json` dict (the JSON form is the contract).

`render_board` takes the status dict, the frame it drew last time and the time, and returns the
next frame: a rich renderable plus the signature of every row, so the rows that changed since
the last frame carry a marker. It reads neither the database nor the clock, so the board is
tested on recorded frames; `BoardWatch` does the reading (through a read-only `Reader`) and
hands each frame to a rich `Live` display until the run settles.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..engine.verification.targetcheck import FAILED as CHECK_FAILED
from ..engine.verification.record import continue_lines
from ..states import (
    RUN_LIVE,
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
    key_width,
    preserved,
    short_sha,
    stack_of,
    state_text,
    story_note,
)

if TYPE_CHECKING:
    from ..engine.project import Project

__all__ = ["render_status", "Frame", "render_board", "lane_queue", "held_back", "MARK",
           "lane_text", "BoardWatch"]


# ---------------------------------------------------------------------------- plain text
def _consumer_lines(data: dict) -> list[str]:
    """The live consumers (from their heartbeats) and what is missing for a live run."""
    lines = [f"warning: {w}" for w in data.get("warnings", [])]
    live = data.get("consumers", [])
    if not live and data["run"]["state"] not in RUN_LIVE:
        return lines  # a settled run: nobody is expected to be working on it
    lines.append("consumers:" + ("" if live else " none alive"))
    for c in live:
        lane = f" lane={c['lane']}" if c.get("lane") else ""
        lines.append(f"  {c['host']} pid {c['pid']} {c['role']} queues={','.join(c['queues'])}"
                     f"{lane} heartbeat {c['heartbeat_at']}")
    return lines


def _repair_lines(data: dict) -> list[str]:
    """Flakes, target checks that failed, and stories that needed repairs."""
    lines = []
    flakes = data.get("flakes") or []
    if flakes:
        lines.append(f"flakes: {len(flakes)} (failed, then passed on a retry of the same tree)")
        for f in flakes:
            lines.append(f"  {f['site']:<9} {f['story'] or '-':<36} `{f['command']}` "
                         f"failed log {f['failed_log']}")
    for check in data.get("target_checks") or []:
        if check["state"] == CHECK_FAILED:
            lines.append(f"target red: `{check['command']}` fails on "
                         f"{short_sha(check['target_sha'], '')} itself (log {check['log']})")
    repaired = [s for s in data["stories"] if s.get("repairs")]
    if repaired:
        lines.append("repairs: " + ", ".join(f"{s['key']} ({s['repairs']})" for s in repaired))
    return lines


def render_status(data: dict) -> str:
    """`bmad-loop status` without --json or --watch: the run, its workers, the lane, every story."""
    run = data["run"]
    lines = [
        f"run {run['id']}  {run['state']}  target {run['target_branch']} @ {short_sha(run['target_sha'], '')}"
        f"  max_parallel={run['max_parallel']}  strategy={run['merge_strategy']}",
    ]
    if run.get("reason"):
        lines.append(f"  reason: {run['reason']}")
    lines.extend(_consumer_lines(data))
    workers = [s for s in data["stories"] if s["state"] in STORY_IN_FLIGHT]
    width = key_width(data["stories"])
    if workers:
        lines.append("workers:")
        for s in workers:
            lines.append(f"  {s['key']:<{width}} {s['state']:<8} phase={s['phase'] or '-':<8} "
                         f"host={s.get('host') or '-'} base={short_sha(s['base_sha'], '')} "
                         f"elapsed={elapsed_text(s.get('elapsed_s'))} session={s['session'] or '-'}")
            if s.get("worktree") or s.get("branch"):
                lines.append(f"  {'':<{width}} worktree={s.get('worktree') or '-'} branch={s.get('branch') or '-'}")
    current = current_candidate(data["candidates"])
    waiting = [s["key"] for s in data["stories"] if s["state"] == StoryState.READY]
    lines.append("lane: " + (f"{current['story']} candidate {current['attempt']} {current['state']}"
                             if current else "idle")
                 + (f"; waiting: {', '.join(waiting)}" if waiting else ""))
    lines.append("stories:")
    for s in data["stories"]:
        lines.append(f"  {s['seq']:>3} {s['key']:<{width}} {s['state']:<11} {story_note(s)}".rstrip())
    for s in data["stories"]:
        if s.get("evidence_ref"):
            lines.extend("  " + line for line in continue_lines(
                data["run"]["id"], s["key"], s["evidence_ref"], s.get("worktree")))
    lines.extend(_repair_lines(data))
    kept = preserved(data["candidates"])
    if kept:
        lines.append("preserved candidates:")
        for c in kept:
            lines.append(f"  {c['story']} #{c['attempt']} {c['state']} ref={c['ref'] or '-'} "
                         f"worktree={c['worktree'] or '-'} evidence={c['evidence'] or '-'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the live board
MARK = "●"
# An escalated or blocked story holds the lane back only when escalation pauses the run.
_PAUSES_LANE = frozenset({StoryState.ESCALATED, StoryState.BLOCKED})


@dataclass(frozen=True)
class Frame:
    """One drawing of the board, and what the next one compares against."""

    renderable: RenderableType
    rows: dict[str, tuple] = field(default_factory=dict)  # row id -> signature
    changed: frozenset[str] = frozenset()  # the row ids whose signature changed
    stale: tuple[str, ...] = ()  # keys of workers whose heartbeat stopped


def _parse(ts: str | None) -> dt.datetime | None:
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

    def __init__(self, previous: Frame | None) -> None:
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
    parts: list[RenderableType] = [Panel(header, title="bmad-loop", title_align="left"), workers, Text(""),
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


def _run_header(run: dict, stories: list[dict], marks: _Marks, now: dt.datetime) -> Text:
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


def _workers(stories: list[dict], marks: _Marks, now: dt.datetime,
             stale_after_s: float) -> tuple[Table, list[str]]:
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


def _lane_line(candidates: list[dict], marks: _Marks) -> Text:
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


def _preserved(candidates: list[dict], marks: _Marks) -> Table | None:
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


def _landed_summary(stories: list[dict]) -> Text | None:
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


# ---------------------------------------------------------------------------- the TUI's lane panel
def lane_text(status: dict, root: Path | None = None) -> Text:
    """The TUI's lane panel: current candidate, the queue in plan order, candidates with evidence."""
    text = Text()
    candidates = status.get("candidates", [])
    current = current_candidate(candidates)
    stack = stack_of(candidates)
    if len(stack) > 1:  # speculative candidates, verified at once; the bottom lands first
        text.append(f"now: {len(stack)} candidates\n", style="bold")
        for cand in stack:
            text.append(f"  {cand.get('stack') or 1}. {cand['story']} #{cand['attempt']} ")
            text.append(state_text(cand["state"]))
            text.append(f" on {composed_on(cand)}\n")
    elif current:
        text.append(f"now: {current['story']} candidate #{current['attempt']} ", style="bold")
        text.append(state_text(current["state"]))
        text.append("\n")
    else:
        text.append("now: idle\n", style="bold")

    def listing(label: str, items: list[str]) -> None:
        if items:
            text.append(label, style="bold")
            text.append("; ".join(items) + "\n")

    listing("waiting (plan order): ", [f"{s['key']} waits for {why}" for s, why in lane_queue(status)])
    listing("held back: ", [f"{s['key']} ({s['state']}): {why}" for s, why in held_back(status)])
    for cand in candidates:
        text.append(f"#{cand['attempt']} {cand['story']} ", style="bold")
        text.append(state_text(cand["state"]))
        text.append(f" {cand.get('strategy') or ''} {short_sha(cand.get('target_sha'), '')}"
                    f" -> {short_sha(cand.get('candidate_sha'))}")
        if cand.get("verify_s") is not None:
            text.append(f" verify {cand['verify_s']}s")
        if cand.get("evidence"):
            text.append(f"\n   evidence {cand['evidence']}: {_evidence_summary(cand['evidence'])}")
        elif cand.get("reason"):
            text.append(f": {cand['reason']}")
        text.append("\n")
    if not candidates:
        text.append("no candidates yet\n", style="dim")
    text.rstrip()
    return text


def _evidence_summary(path: str) -> str:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return "(unreadable)"
    parts = [str(data.get("kind", "?"))]
    for key in ("command", "exit_code", "conflicts", "paths"):
        if data.get(key) not in (None, [], ""):
            value = data[key]
            parts.append(f"{key}={','.join(value) if isinstance(value, list) else value}")
    return " ".join(parts)


# ---------------------------------------------------------------------------- status --watch
class BoardWatch:
    """The run `run_ref` names (newest by default), watched with the limits of its own policy."""

    def __init__(self, project: Project, run_ref: str | None) -> None:
        from ..engine.run.control import find_run
        from ..engine.runrows import run_policy
        from .readonly import Reader

        self.reader = Reader(project)
        with self.reader.session() as s:
            run = find_run(s, project, run_ref)
            self.run_id: str = run.id
            policy = run_policy(run)
        self.stale_after = float(policy.leases.ttl_s)
        self.escalation_blocks = policy.parallel.on_escalation == "pause"

    def show(self, interval: float, stop: threading.Event) -> None:
        """Draw a frame every `interval` seconds until the run settles or `stop` is set."""
        from rich.console import Console
        from rich.live import Live

        from ..db.models import Run, utcnow
        from ..engine.run.status import run_status
        from ..states import RUN_SETTLED

        previous = None
        with Live(console=Console(), refresh_per_second=4, auto_refresh=False,
                  redirect_stdout=False, redirect_stderr=False) as live:
            while True:
                with self.reader.session() as s:
                    row = s.get_one(Run, self.run_id)
                    data = run_status(s, row)
                    settled = row.state in RUN_SETTLED
                frame = render_board(data, previous, utcnow(), stale_after_s=self.stale_after,
                                     escalation_blocks=self.escalation_blocks)
                live.update(frame.renderable, refresh=True)
                previous = frame
                if settled or stop.wait(interval):
                    return

    def close(self) -> None:
        self.reader.close()
