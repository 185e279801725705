"""Every log one story left, in the order it was written, and the tail of the one that failed.

`attach RUN STORY --all` prints a story's whole history the morning after: each agent session
(create, dev, review, fix) and each verify run, of the story's worktree and of its candidates,
under a header naming the phase, the attempt and when it started. The order comes from the
journal: a session's `attempt.started`, a verify's `verify.passed`/`verify.failed`, a
candidate's `candidate.verified`/`verify_failed` (a verify's start time is its log's first
header line, else the event's time less its duration).
A log the journal does not mention (a run from before these events) follows, oldest first.

`failing_log` and `log_tail` are the JUnit report's: the newest log of a failed story, and its
last lines, so the failure's body says what went wrong without opening the artifact.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..agents.adapter import read_tail
from ..engine.journal import EventKind, event_json, events_after

__all__ = ["StoryLog", "story_logs", "print_story_logs", "failing_log", "log_tail", "TAIL_LINES"]

TAIL_LINES = 60  # what a JUnit failure body carries of the failing log
_TAIL_BYTES = 64 * 1024
_VERIFY_EVENTS = (EventKind.VERIFY_PASSED, EventKind.VERIFY_FAILED)
_CANDIDATE_EVENTS = (EventKind.CANDIDATE_VERIFIED, EventKind.CANDIDATE_VERIFY_FAILED)
_HEADER = re.compile(r"=== bmad-loop .*? started (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


@dataclass(frozen=True)
class StoryLog:
    phase: str  # create | dev | review | fix | verify | candidate verify
    attempt: str  # "2" for a session; "dev 1, review 0" or "candidate 1" for a verify
    started_at: str | None  # ISO-8601 UTC, None when unknown
    path: Path

    def header(self) -> str:
        when = self.started_at or "start unknown"
        return f"==> {self.phase} attempt {self.attempt}, started {when}: {self.path} <=="


def story_logs(session, run_id: str, story_key: str, log_dir: Path) -> list[StoryLog]:
    """The story's logs in the order they were started (see the module's docstring)."""
    found: list[StoryLog] = []
    seen: set[Path] = set()

    def add(log: StoryLog) -> None:
        if log.path not in seen and log.path.is_file():
            seen.add(log.path)
            found.append(log)

    kinds = (EventKind.ATTEMPT_STARTED, *_VERIFY_EVENTS, *_CANDIDATE_EVENTS)
    for line in (event_json(e) for e in events_after(session, run_id, 0, kinds, story_key)):
        data = line["data"]
        if line["kind"] == EventKind.ATTEMPT_STARTED and data.get("log"):
            add(StoryLog(str(data.get("phase")), str(data.get("attempt")), _second(line["ts"]),
                         Path(data["log"])))
        elif line["kind"] in _VERIFY_EVENTS and data.get("log"):
            path = Path(data["log"])
            add(StoryLog("verify", _verify_label(path),
                         _header_time(path) or _minus(line["ts"], data.get("duration_s")), path))
        elif line["kind"] in _CANDIDATE_EVENTS:
            path = log_dir / f"verify-candidate-{data.get('attempt')}.log"
            add(StoryLog("candidate verify", str(data.get("attempt")),
                         _header_time(path) or _minus(line["ts"], data.get("duration_s")), path))
    rest = sorted((p for p in log_dir.glob("*.log") if p not in seen), key=_mtime)
    for path in rest:
        phase, _, attempt = path.stem.partition("-")
        add(StoryLog(phase, attempt or "?", _header_time(path), path))
    return found


def print_story_logs(logs: list[StoryLog], write: Callable[[str], None], story_key: str) -> None:
    """Each log under its header, whole, in order."""
    if not logs:
        write(f"{story_key}: no session or verify log yet\n")
        return
    for index, log in enumerate(logs):
        write(("\n" if index else "") + log.header() + "\n")
        try:
            with open(log.path, "rb") as handle:
                while chunk := handle.read(64 * 1024):
                    write(chunk.decode("utf-8", "replace"))
        except OSError as exc:
            write(f"(unreadable: {exc.strerror})\n")


def failing_log(story: dict) -> Path | None:
    """The newest log of the story's log folder (its last session or verify), if any."""
    if not story.get("log"):
        return None
    folder = Path(story["log"]).parent
    logs = [p for p in folder.glob("*.log") if p.is_file()] if folder.is_dir() else []
    return max(logs, key=_mtime) if logs else None


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of `path` (only its last bytes are read)."""
    text = read_tail(path, max_bytes=_TAIL_BYTES)
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


# ------------------------------------------------------------------------------ helpers
def _verify_label(path: Path) -> str:
    """`verify-2-1.log` -> "dev 2, review 1" (the worker labels its verify logs that way)."""
    label = path.stem.removeprefix("verify-")
    dev, _, review = label.partition("-")
    return f"dev {dev}, review {review}" if dev.isdigit() and review.isdigit() else label


def _second(ts: str) -> str:
    return ts.split(".", 1)[0] + "Z" if "." in ts else ts


def _minus(ts: str, seconds) -> str | None:
    try:
        at = dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ") - dt.timedelta(seconds=float(seconds or 0))
    except (TypeError, ValueError):
        return None
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _header_time(path: Path) -> str | None:
    """The time in the first `=== bmad-loop … started <time>: … ===` line of a log."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            first = handle.readline()
    except OSError:
        return None
    found = _HEADER.match(first)
    return found.group(1) if found else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
