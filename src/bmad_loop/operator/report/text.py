"""`bmad-loop report` without --html or --json: the report's numbers as a few plain lines."""

from __future__ import annotations

from ...engine.verification.targetcheck import FAILED as CHECK_FAILED
from .svg import format_seconds

__all__ = ["format_report", "sessions_text", "recovered_lines"]


def sessions_text(story: dict) -> str:
    """`3 (1 failed, 1 interrupted)`: an interrupted session (a stop, Ctrl+C) is not a failure."""
    parts = [f"{story['failed_sessions']} failed"]
    if story.get("interrupted_sessions"):
        parts.append(f"{story['interrupted_sessions']} interrupted")
    return f"{story['sessions']} ({', '.join(parts)})"


def format_report(report: dict) -> str:
    run, bound = report["run"], report["bound"]
    lines = [f"run {run['id']} {run['state']} ({run['outcome']}): "
             f"{report['summary']['stories']} stories, N = {run['max_parallel']}",
             f"makespan {format_seconds(report['makespan_s'])} (active "
             f"{format_seconds(report['active_s'])}, paused or stopped "
             f"{format_seconds(report['paused_s'])}), lower bound "
             f"{format_seconds(bound['lower_bound_s'])}"
             + (f" ({bound['ratio']:.2f}× active)" if bound.get("ratio") else "")
             + f" (chain {format_seconds(bound['chain_s'])}: "
             f"{' -> '.join(bound['chain']) or '-'}; work {format_seconds(bound['work_s'])} "
             f"/ {bound['slots']} = {format_seconds(bound['work_per_slot_s'])})"]
    width = max([len(s["key"]) for s in report["stories"]] + [5])
    lines.append(f"  {'STORY':<{width}}  {'STATE':<11} {'WORKER':>8} {'AGENT':>8} {'VERIFY':>8} "
                 f"{'WAITING':>8}  SESSIONS")
    for s in report["stories"]:
        lines.append(f"  {s['key']:<{width}}  {s['state']:<11} {format_seconds(s['work_s']):>8} "
                     f"{format_seconds(s['agent_s']):>8} {format_seconds(s['verify_s']):>8} "
                     f"{format_seconds(s['wait_s']):>8}  {sessions_text(s)}")
    for failure in report["failures"]:
        lines.append(f"  {failure['story']}: {failure['kind']}: {failure['reason']}")
    lines.extend(f"  {line}" for line in recovered_lines(report))
    return "\n".join(lines)


def recovered_lines(report: dict) -> list[str]:
    """What the run got past on its own: each flake, red target check and repair, a line each."""
    lines = [f"flaky: {f['site']} {f['story'] or 'target'}: `{f['command']}` failed, then passed "
             f"on retry {f['retry']} (logs {f['failed_log']}, {f['passed_log']})"
             for f in report.get("flakes", [])]
    lines += [f"target red: `{c['command']}` failed on {c['target_sha'][:12]} itself (log {c['log']})"
              for c in report.get("target_checks", []) if c["state"] == CHECK_FAILED]
    lines += [f"repair {r['number']} of {r['story']} ({r['cause']}): {r['outcome']}"
              + (f": {r['reason']}" if r.get("reason") else "") for r in report.get("repairs", [])]
    return lines
