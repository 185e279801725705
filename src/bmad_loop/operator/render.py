"""Plain-text rendering of `status` for people (the JSON form is the contract)."""

from __future__ import annotations

from ..engine.verification.targetcheck import FAILED as CHECK_FAILED
from .style import current_candidate, elapsed_text, key_width, preserved, short_sha, story_note
from ..engine.verification.record import continue_lines
from ..states import RUN_LIVE, STORY_IN_FLIGHT, StoryState

__all__ = ["render_status"]


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
