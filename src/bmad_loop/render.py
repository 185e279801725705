"""Plain-text rendering of `status` for people (the JSON form is the contract)."""

from __future__ import annotations

__all__ = ["render_status"]

IN_FLIGHT = ("queued", "working")


def render_status(data: dict) -> str:
    run = data["run"]
    lines = [
        f"run {run['id']}  {run['state']}  target {run['target_branch']} @ {(run['target_sha'] or '')[:10]}"
        f"  max_parallel={run['max_parallel']}  strategy={run['merge_strategy']}",
    ]
    if run.get("reason"):
        lines.append(f"  reason: {run['reason']}")
    workers = [s for s in data["stories"] if s["state"] in IN_FLIGHT]
    if workers:
        lines.append("workers:")
        for s in workers:
            lines.append(f"  {s['key']:<36} {s['state']:<8} phase={s['phase'] or '-':<8} "
                         f"host={s.get('host') or '-'} base={(s['base_sha'] or '')[:10]} "
                         f"elapsed={s['elapsed_s'] or 0}s session={s['session'] or '-'}")
            if s.get("worktree") or s.get("branch"):
                lines.append(f"  {'':<36} worktree={s.get('worktree') or '-'} branch={s.get('branch') or '-'}")
    active = [c for c in data["candidates"] if c["state"] in ("composing", "verifying", "verified", "advancing")]
    waiting = [s["key"] for s in data["stories"] if s["state"] == "ready"]
    lines.append("lane: " + (f"{active[-1]['story']} candidate {active[-1]['attempt']} {active[-1]['state']}"
                             if active else "idle")
                 + (f"; waiting: {', '.join(waiting)}" if waiting else ""))
    lines.append("stories:")
    for s in data["stories"]:
        note = s.get("reason") or s.get("waiting_for") or ""
        lines.append(f"  {s['seq']:>3} {s['key']:<36} {s['state']:<11} {note}".rstrip())
    kept = [c for c in data["candidates"] if c["state"] in ("conflict", "verify-failed", "abandoned")]
    if kept:
        lines.append("preserved candidates:")
        for c in kept:
            lines.append(f"  {c['story']} #{c['attempt']} {c['state']} ref={c['ref'] or '-'} "
                         f"worktree={c['worktree'] or '-'} evidence={c['evidence'] or '-'}")
    return "\n".join(lines)
