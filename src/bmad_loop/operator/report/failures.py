"""Every escalation and failure of a run, with its reason and its log.

From the journal: a session that did not succeed (`attempt.finished`), a failed verify in the
story's worktree or in a candidate, a conflict, a failed create, a story escalated, failed or
blocked. A log written on this host (the row's host is this one, or no host is recorded, and
the file is there) is read for its last lines; a log on another host is only named, with its
host. Links are made relative to the report's folder by the renderer.
"""

from __future__ import annotations

from pathlib import Path

from ...hostid import host_name
from ...states import AttemptState
from ..story_logs import failing_log, log_tail
from ...engine.journal import EventKind

__all__ = ["failures", "FAILURE_TAIL_LINES"]

FAILURE_TAIL_LINES = 30  # of every failing log; the report keeps it whole in the log folder
_STORY_ENDS = {EventKind.STORY_ESCALATED: "escalated",
               EventKind.STORY_BLOCKED: "blocked", EventKind.CREATE_FAILED: "create failed",
               EventKind.CANDIDATE_VERIFY_FAILED: "candidate verify failed",
               EventKind.CANDIDATE_CONFLICT: "candidate conflict", EventKind.VERIFY_FAILED: "verify failed"}


def _reason(kind: str, data: dict) -> str:
    if data.get("reason"):
        return str(data["reason"])
    if kind == EventKind.ATTEMPT_FINISHED:
        return f"{data.get('phase')} session {data.get('state')} (exit code {data.get('exit_code')})"
    if kind == EventKind.VERIFY_FAILED:
        return f"{data.get('command') or 'verify'}: exit code {data.get('exit_code')}" + (
            " (timed out)" if data.get("timed_out") else "")
    return kind


def _log_of(kind: str, data: dict, story: dict | None, log_dir: Path | None) -> Path | None:
    if data.get("log"):
        return Path(data["log"])
    if kind == EventKind.ATTEMPT_FINISHED and log_dir is not None:
        return log_dir / f"{data.get('phase')}-{data.get('attempt')}.log"
    if kind.startswith("candidate.") and log_dir is not None and data.get("attempt"):
        return log_dir / f"verify-candidate-{data['attempt']}.log"
    if kind in (EventKind.STORY_ESCALATED,) and story is not None:
        return failing_log(story)
    return None


def _entry(event: dict, at: float, story: dict | None, log_dir: Path | None, here: str) -> dict:
    kind, data = event["kind"], event["data"] or {}
    log = _log_of(kind, data, story, log_dir)
    host = (story or {}).get("host")
    local = log is not None and (host in (None, "", here)) and log.is_file()
    return {"story": event["story"], "kind": _STORY_ENDS.get(kind, "session failed"),
            "at": at, "reason": _reason(kind, data), "log": str(log) if log else None,
            "log_dir": str(log.parent) if log else None, "host": host or here, "local": local,
            "tail": log_tail(log, FAILURE_TAIL_LINES) if local and log is not None else None}


def failures(events: list[dict], times: list[float], stories: dict[str, dict],
             log_dirs: dict[str, Path]) -> list[dict]:
    """The failures in journal order (`times`: each event's seconds from the origin)."""
    here = host_name()
    out = []
    for event, at in zip(events, times):
        kind = event["kind"]
        failed_session = (kind == EventKind.ATTEMPT_FINISHED
                          and (event["data"] or {}).get("state") not in (AttemptState.SUCCEEDED, AttemptState.INTERRUPTED, None))
        if kind in _STORY_ENDS or failed_session:
            key = event["story"]
            out.append(_entry(event, at, stories.get(key), log_dirs.get(key), here))
    return out
