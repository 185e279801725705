"""CI summaries of a run: a JSON report and a JUnit XML file, both from the `status` dict.

One JUnit test case per story: `integrated` passes, `skipped` is skipped, `escalated`,
`blocked`, `held` and `failed` fail with their reason (the body ends with the last lines of the
story's newest log); the suite's time is wall time, not a sum; a story the run never finished
(pending, queued, working, ready, integrating: the run paused or stopped first) is skipped
with a message saying where it stood. `bmad-loop run --ci --report FILE --junit FILE` writes them.
A run with nothing to do writes both too (`NOTHING_TO_DO`: no run, zero test cases), so a CI step
that publishes them always finds them.
"""

from __future__ import annotations

import datetime as dt
import json
import xml.etree.ElementTree as ET
from pathlib import Path

from ...fileio import write_atomic
from ...states import STORY_PARKED, StoryState
from ..story_logs import failing_log, log_tail

__all__ = ["summary", "write_json_report", "write_junit", "junit_tree", "wall_time", "FAILING",
           "PASSING", "nothing_to_do", "usage_total"]

PASSING = frozenset({StoryState.INTEGRATED})
SKIPPED = frozenset({StoryState.SKIPPED})
FAILING = STORY_PARKED  # escalated, blocked, held, failed
REPORT_FORMAT = 1


def nothing_to_do(reason: str) -> dict:
    """The status a report is written from when the selection matched no story: no run."""
    return {"run": None, "stories": [], "candidates": [], "reason": reason}


def summary(status: dict) -> dict:
    """How many stories passed, failed and were skipped, and how many are in each state."""
    stories = status["stories"]
    counts: dict[str, int] = {}
    for story in stories:
        counts[story["state"]] = counts.get(story["state"], 0) + 1
    return {
        "stories": len(stories),
        "passed": sum(1 for s in stories if s["state"] in PASSING),
        "failed": sum(1 for s in stories if s["state"] in FAILING),
        "skipped": sum(1 for s in stories if s["state"] not in PASSING | FAILING),
        "by_state": counts,
    }


def usage_total(stories: list[dict]) -> dict:
    """Each usage field summed over the stories that report it; None when none does."""
    names = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost_usd")
    total: dict[str, float | int | None] = {}
    for name in names:
        values = [s["usage"][name] for s in stories if (s.get("usage") or {}).get(name) is not None]
        total[name] = (round(sum(values), 6) if name == "cost_usd" else sum(values)) if values else None
    return total


def write_json_report(status: dict, path: str | Path, *, exit_code: int | None = None) -> Path:
    """The whole status (run, stories, candidates) plus a summary and the exit code."""
    report = {
        "format": REPORT_FORMAT,
        "run": status["run"],
        "exit_code": exit_code,
        "summary": summary(status),
        "usage": usage_total(status["stories"]),  # the agent CLIs' own reports, summed
        "stories": status["stories"],
        "candidates": status.get("candidates", []),
    }
    if status["run"] is None:
        report["reason"] = status.get("reason")
    return write_atomic(Path(path), json.dumps(report, indent=2, sort_keys=True) + "\n")


def junit_tree(status: dict) -> ET.ElementTree[ET.Element]:
    run = status["run"] or {}
    counts = summary(status)
    elapsed = wall_time(status)
    suites = ET.Element("testsuites", name="bmad-loop", tests=str(counts["stories"]),
                        failures=str(counts["failed"]), errors="0",
                        skipped=str(counts["skipped"]), time=f"{elapsed:.3f}")
    name = f"bmad-loop run {run['id']}" if run else f"bmad-loop: {status.get('reason')}"
    suite = ET.SubElement(suites, "testsuite", name=name,
                          tests=str(counts["stories"]), failures=str(counts["failed"]),
                          errors="0", skipped=str(counts["skipped"]), time=f"{elapsed:.3f}",
                          timestamp=run.get("created_at") or "", hostname=run.get("host") or "")
    props = ET.SubElement(suite, "properties")
    for name in ("id", "state", "target_branch", "start_sha", "target_sha", "merge_strategy",
                 "max_parallel", "reason"):
        if run.get(name) is not None:
            ET.SubElement(props, "property", name=f"run.{name}", value=str(run[name]))
    for name, value in usage_total(status["stories"]).items():  # tokens and cost, where the CLIs reported them
        if value is not None:
            ET.SubElement(props, "property", name=f"usage.{name}", value=str(value))
    candidates: dict[str, list[dict]] = {}
    for cand in status.get("candidates", []):
        candidates.setdefault(cand["story"], []).append(cand)
    for story in sorted(status["stories"], key=lambda s: s["seq"]):
        case = ET.SubElement(suite, "testcase", name=story["key"],
                             classname=_classname(story),
                             time=f"{float(story.get('elapsed_s') or 0):.3f}")
        state = story["state"]
        reason = story.get("reason") or state
        if state in FAILING:
            failure = ET.SubElement(case, "failure", type=state, message=f"{state}: {reason}")
            failure.text = _details(story, candidates.get(story["key"], [])) + _failing_tail(story)
        elif state in SKIPPED:
            ET.SubElement(case, "skipped", message=f"skipped: {reason}")
        elif state not in PASSING:
            where = story.get("waiting_for") or story.get("phase") or ""
            ET.SubElement(case, "skipped", message=f"not finished: {state}"
                          + (f" ({where})" if where else "")
                          + f"; run {run['state']}" + (f": {run['reason']}" if run.get("reason") else ""))
        out = ET.SubElement(case, "system-out")
        out.text = _details(story, candidates.get(story["key"], []))
    ET.indent(suites)
    return ET.ElementTree(suites)


def _classname(story: dict) -> str:
    """`bmad-loop.epic-<id>` (epic ids are strings: `epic-1`, `epic-r`, `epic-3-5`), or
    `bmad-loop.no-epic` for a story in no epic."""
    epic = story.get("epic")
    return f"bmad-loop.epic-{epic}" if epic not in (None, "") else "bmad-loop.no-epic"


def write_junit(status: dict, path: str | Path) -> Path:
    tree = junit_tree(status)
    text = ET.tostring(tree.getroot(), encoding="unicode", xml_declaration=False)
    return write_atomic(Path(path), '<?xml version="1.0" encoding="UTF-8"?>\n' + text + "\n")


def wall_time(status: dict) -> float:
    """Seconds from the first story's start to the last one's end (the run's end, or now, for
    stories still open): parallel stories are not added up."""
    starts = [t for t in (_when(s.get("started_at")) for s in status["stories"]) if t is not None]
    if not starts:
        return 0.0
    ends = [t for t in (_when(s.get("ended_at")) for s in status["stories"]) if t is not None]
    if any(s.get("started_at") and not s.get("ended_at") for s in status["stories"]):
        ends.append(_when(status["run"].get("ended_at")) or dt.datetime.now(dt.timezone.utc))
    return max(0.0, (max(ends, default=min(starts)) - min(starts)).total_seconds())


def _when(ts: str | None) -> dt.datetime | None:
    if not ts:
        return None
    return dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


def _failing_tail(story: dict) -> str:
    """The last lines of the story's newest log, for the failure's body."""
    path = failing_log(story)
    tail = log_tail(path) if path is not None else ""
    return f"\n\n--- the end of {path} ---\n{tail}" if tail else ""


def _details(story: dict, candidates: list[dict]) -> str:
    lines = [f"state: {story['state']}" + (f" (phase {story['phase']})" if story.get("phase") else "")]
    for name in ("reason", "branch", "worktree", "base_sha", "head_sha", "integrated_sha",
                 "session", "log"):
        if story.get(name):
            lines.append(f"{name}: {story[name]}")
    lines.append(f"dev attempts: {story.get('attempt', 0)}, review cycles: {story.get('review_cycles', 0)}")
    for cand in candidates:
        lines.append(f"candidate #{cand['attempt']} {cand['state']}"
                     + (f" ref {cand['ref']}" if cand.get("ref") else "")
                     + (f" worktree {cand['worktree']}" if cand.get("worktree") else "")
                     + (f" evidence {cand['evidence']}" if cand.get("evidence") else "")
                     + (f": {cand['reason']}" if cand.get("reason") else ""))
    return "\n".join(lines)
