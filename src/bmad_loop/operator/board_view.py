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

__all__ = ["Frame", "render_board", "lane_queue", "held_back", "MARK"]

MARK = "●"
IN_FLIGHT = ("queued", "working")
IN_LANE = ("ready", "integrating")
DONE = ("integrated", "skipped", "failed")
NEEDS_HUMAN = ("escalated", "blocked", "held")
ACTIVE_CANDIDATE = ("composing", "verifying", "verified", "advancing")
PRESERVED_CANDIDATE = ("conflict", "verify-failed", "abandoned")


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


def _sha(value) -> str:
    return (value or "")[:10] or "-"


def _secs(value) -> str:
    if value is None:
        return "-"
    value = float(value)
    if value < 60:
        return f"{value:.0f}s"
    minutes, seconds = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def lane_queue(status: dict, *, escalation_blocks: bool = True) -> list[tuple[dict, str]]:
    """Finished stories waiting for the lane, in plan order, each with what it waits for."""
    stories = sorted(status["stories"], key=lambda s: s["seq"])
    integrating = next((s for s in stories if s["state"] == "integrating"), None)
    out = []
    for story in stories:
        if story["state"] not in IN_LANE:
            continue
        if story["state"] == "integrating":
            out.append((story, "in the lane now"))
            continue
        blocker = None
        for earlier in stories:
            if earlier["seq"] >= story["seq"]:
                break
            if earlier["state"] in DONE:
                continue
            if earlier["state"] in ("escalated", "blocked") and not escalation_blocks:
                continue
            blocker = earlier
            break
        if blocker is None or blocker is integrating:
            why = (f"the lane ({integrating['key']} integrating)" if integrating
                   else "next in line")
        elif blocker["state"] in NEEDS_HUMAN:
            why = f"{blocker['key']} ({blocker['state']}: needs a human)"
        else:
            why = f"{blocker['key']} ({blocker['state']}" + (
                f", {blocker['phase']})" if blocker.get("phase") and blocker["state"] == "working"
                else ")")
        out.append((story, why))
    return out


def held_back(status: dict) -> list[tuple[dict, str]]:
    """Stories that cannot move on their own, and why."""
    out = []
    run_state = status["run"]["state"]
    for story in sorted(status["stories"], key=lambda s: s["seq"]):
        if story["state"] == "pending":
            why = story.get("waiting_for") or "not admitted yet"
            if run_state != "running":  # nothing is admitted until the run runs again
                why = f"run {run_state}" + (f" (last: {story['waiting_for']})"
                                            if story.get("waiting_for") else "")
            out.append((story, why))
        elif story["state"] in NEEDS_HUMAN or story["state"] == "failed":
            out.append((story, story.get("reason") or story["state"]))
    return out


def render_board(status: dict, previous: Frame | None, now: dt.datetime, *,
                 stale_after_s: float = 60.0, escalation_blocks: bool = True) -> Frame:
    run = status["run"]
    stories = sorted(status["stories"], key=lambda s: s["seq"])
    candidates = status.get("candidates", [])
    rows: dict[str, tuple] = {}

    def changed(row_id: str, signature: tuple) -> bool:
        rows[row_id] = signature
        return previous is not None and previous.rows.get(row_id) != signature

    def mark(flag: bool) -> Text:
        return Text(MARK, style="bold yellow") if flag else Text(" ")

    # ------------------------------------------------------------------ the run
    counts: dict[str, int] = {}
    for story in stories:
        counts[story["state"]] = counts.get(story["state"], 0) + 1
    run_changed = changed("run", (run["state"], run.get("reason"), run.get("target_sha")))
    header = Text()
    header.append(MARK + " " if run_changed else "  ", style="bold yellow")
    header.append(f"run {run['id']}  ", style="bold")
    header.append(run["state"], style=_state_style(run["state"]))
    header.append(f"   target {run['target_branch']} @ {_sha(run.get('target_sha'))}"
                  f"   strategy {run.get('merge_strategy') or '-'}"
                  f"   max_parallel {run.get('max_parallel')}")
    header.append("\n  " + f"{len(stories)} stories: " + ", ".join(
        f"{n} {state}" for state, n in counts.items()))
    if run.get("reason"):
        header.append(f"\n  {run['reason']}", style="italic")
    header.append(f"\n  updated {now.astimezone(dt.timezone.utc):%H:%M:%S} UTC", style="dim")

    # ------------------------------------------------------------------ workers
    workers = Table(title="workers in flight", title_justify="left", expand=True,
                    show_edge=False, pad_edge=False)
    for name in ("", "story", "state", "host", "phase", "elapsed", "base", "session", "heartbeat"):
        workers.add_column(name, no_wrap=name in ("", "base", "elapsed"))
    stale = []
    for story in stories:
        if story["state"] not in IN_FLIGHT:
            continue
        beat = _parse(story.get("heartbeat_at"))
        age = (now - beat).total_seconds() if beat else None
        is_stale = story["state"] == "working" and age is not None and age > stale_after_s
        if is_stale:
            stale.append(story["key"])
            beat_text = Text(f"STALE {_secs(age)} ago", style="bold red")
        elif age is not None:
            beat_text = Text(f"{_secs(max(age, 0))} ago")
        else:
            beat_text = Text("-")
        flag = changed(f"worker:{story['key']}", (story["state"], story.get("phase"),
                                                   story.get("session"), story.get("base_sha"),
                                                   is_stale))
        workers.add_row(mark(flag), story["key"], Text(story["state"], style=_state_style(story["state"])),
                        story.get("host") or "-", story.get("phase") or "-", _secs(story.get("elapsed_s")),
                        _sha(story.get("base_sha")), story.get("session") or "-", beat_text)
    if not workers.row_count:
        workers.add_row("", Text("no worker in flight", style="dim"), "", "", "", "", "", "", "")

    # ------------------------------------------------------------------ the lane
    active = [c for c in candidates if c["state"] in ACTIVE_CANDIDATE]
    current = active[-1] if active else None
    lane_changed = changed("lane", (current["story"], current["attempt"], current["state"])
                           if current else ("idle",))
    lane_line = Text()
    lane_line.append(MARK + " " if lane_changed else "  ", style="bold yellow")
    if current:
        lane_line.append(f"lane: {current['story']} candidate #{current['attempt']} ", style="bold")
        lane_line.append(current["state"], style=_state_style(current["state"]))
        lane_line.append(f"  ({current.get('strategy') or '-'} on {_sha(current.get('target_sha'))}"
                         f" -> {_sha(current.get('candidate_sha'))})")
    else:
        lane_line.append("lane: idle", style="bold")
    queue = Table(title="finished, waiting for the lane (plan order)", title_justify="left",
                  expand=True, show_edge=False, pad_edge=False)
    for name in ("", "#", "story", "state", "waits for"):
        queue.add_column(name, no_wrap=name in ("", "#"))
    for story, why in lane_queue(status, escalation_blocks=escalation_blocks):
        flag = changed(f"queue:{story['key']}", (story["state"], why))
        queue.add_row(mark(flag), str(story["seq"]), story["key"],
                      Text(story["state"], style=_state_style(story["state"])), why)
    if not queue.row_count:
        queue.add_row("", "", Text("nothing waiting", style="dim"), "", "")

    # ------------------------------------------------------------------ held back
    held = Table(title="held back", title_justify="left", expand=True, show_edge=False,
                 pad_edge=False)
    for name in ("", "#", "story", "state", "why"):
        held.add_column(name, no_wrap=name in ("", "#"))
    for story, why in held_back(status):
        flag = changed(f"held:{story['key']}", (story["state"], why))
        held.add_row(mark(flag), str(story["seq"]), story["key"],
                     Text(story["state"], style=_state_style(story["state"])), why)
    if not held.row_count:
        held.add_row("", "", Text("nothing held back", style="dim"), "", "")

    parts = [Panel(header, title="bmad-loop", title_align="left"), workers, Text(""), lane_line,
             queue, Text(""), held]

    preserved = [c for c in candidates if c["state"] in PRESERVED_CANDIDATE]
    if preserved:
        kept = Table(title="preserved candidates", title_justify="left", expand=True,
                     show_edge=False, pad_edge=False)
        for name in ("", "story", "#", "state", "evidence"):
            kept.add_column(name, no_wrap=name in ("", "#"))
        for cand in preserved:
            flag = changed(f"cand:{cand['story']}#{cand['attempt']}",
                           (cand["state"], cand.get("evidence")))
            kept.add_row(mark(flag), cand["story"], str(cand["attempt"]),
                         Text(cand["state"], style="red"), cand.get("evidence") or cand.get("ref") or "-")
        parts += [Text(""), kept]

    landed = [s["key"] for s in stories if s["state"] == "integrated"]
    skipped = [s["key"] for s in stories if s["state"] == "skipped"]
    if landed or skipped:
        summary = Text("\n")
        if landed:
            summary.append("landed: ", style="bold green")
            summary.append(", ".join(landed))
        if skipped:
            summary.append("   skipped: ", style="bold")
            summary.append(", ".join(skipped))
        parts.append(summary)

    marked = frozenset(k for k, v in rows.items()
                       if previous is not None and previous.rows.get(k) != v)
    return Frame(rows=rows, changed=marked, renderable=Group(*parts), stale=tuple(stale))


def _state_style(state: str) -> str:
    if state in ("integrated", "completed", "advanced", "verified"):
        return "green"
    if state in ("escalated", "failed", "blocked", "conflict", "verify-failed", "stale"):
        return "bold red"
    if state in ("held", "paused", "pausing", "stopping", "stopped"):
        return "yellow"
    if state in ("working", "integrating", "running", "composing", "verifying", "advancing"):
        return "cyan"
    return ""
