"""What `run` and `resume` print as they drive a run: a line per journal event (quieter where
one change comes as many events), and what each Ctrl+C does.

The progress lines:
- `story.waiting` comes once per story whenever what holds stories back changes (nine at once
  on a twenty-story board): the lines of one read of the journal are printed as one line per
  reason, listing the stories.
- A story the create phase has not written yet has no footprint, and the plan journals
  `footprint.exclusive reason=missing` for it, which reads like an error: those are printed as
  one "not created yet" line. Once its file is written (`story.created`), its footprint
  events print as they are.
Only the console changes: the journal keeps every event as it was recorded.

Ctrl+C: an agent session may take an hour to finish, so the first press says what the stop
waits for, what a second press does, and the command that continues the run later, instead of
a bare `run.stopping`. The text is the same on a terminal and in a CI log (plain lines, no
colour).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import click
from sqlalchemy import select

from ..db.models import Attempt, Run, Story, utcnow
from ..operator.style import short_value
from ..states import RUN_SETTLED, STORY_AWAITING_LANE, AttemptState, StoryState
from ..engine.journal import EventKind

if TYPE_CHECKING:
    from ..engine.project import Project

__all__ = ["ProgressPrinter", "JournalLine", "interrupt_notice", "resume_command"]


class JournalLine(Protocol):
    """What the printer reads of a journal event: an `Event` row, or a plain row of its columns
    (`engine.journal.event_rows_after`)."""

    ts: dt.datetime
    kind: str
    story: str | None
    data: dict[str, Any] | None


_DETAIL_KEYS = ("phase", "attempt", "state", "reason", "new", "sha", "paths", "command",
                "exit_code", "plan", "strategy", "candidate_sha")


class ProgressPrinter:
    """Called with each journal event in order; `flush` after each read of the journal prints
    what it held back. `not_created`: the run's stories the create phase has still to write."""

    def __init__(self, ci: bool = False, echo: Callable[..., None] = click.echo) -> None:
        self.color = False if ci else None
        self.echo = echo
        self.not_created: set[str] = set()
        self.waiting: dict[str, str] = {}  # story -> its newest wait reason, in arrival order
        self.uncreated: list[str] = []
        self.held_ts = ""
        # story key -> the lines that say where its kept output is and how to go on (or []).
        self.evidence: Callable[[str], list[str]] = lambda _key: []

    def __call__(self, event: JournalLine) -> None:
        data = event.data or {}
        ts = event.ts.strftime("%H:%M:%S")
        if event.kind == EventKind.STORY_WAITING and event.story:
            self.waiting.pop(event.story, None)
            self.waiting[event.story] = str(data.get("reason") or "")
            self.held_ts = ts
            return
        if event.kind == EventKind.FOOTPRINT_EXCLUSIVE and data.get("reason") == "missing" \
                and event.story in self.not_created:
            self.uncreated.append(event.story)
            self.held_ts = ts
            return
        if event.kind == EventKind.STORY_CREATED:
            self.not_created.discard(event.story)
        self.flush()
        story = f" {event.story}" if event.story else ""
        detail = " ".join(f"{k}={short_value(v)}" for k, v in data.items() if k in _DETAIL_KEYS)
        self.echo(f"{ts} {event.kind}{story} {detail}".rstrip(), color=self.color)
        if event.kind == EventKind.STORY_ESCALATED and event.story:
            for line in self.evidence(event.story):
                self.echo(f"         {line}", color=self.color)

    def flush(self) -> None:
        """The held-back lines: one per wait reason (its stories listed), one for the stories
        not created yet."""
        if self.uncreated:
            self.echo(f"{self.held_ts} not created yet: {', '.join(self.uncreated)} (the create "
                      "phase writes each story file, with its footprint)", color=self.color)
        by_reason: dict[str, list[str]] = {}
        for key, reason in self.waiting.items():
            by_reason.setdefault(reason, []).append(key)
        for reason, keys in by_reason.items():
            self.echo(f"{self.held_ts} story.waiting {', '.join(keys)}"
                      + (f" reason={reason}" if reason else ""), color=self.color)
        self.waiting, self.uncreated = {}, []


# ---------------------------------------------------------------------------- Ctrl+C
def resume_command(project: Project, run_id: str) -> str:
    """`bmad-loop resume RUN`, with `--project` when this folder is not in the project."""
    from ..policy.load import find_project_root

    here = find_project_root(Path.cwd())
    same = here.resolve() == project.home  # resolved when the Project was made
    return f"bmad-loop resume {run_id}" + ("" if same else f" --project {project.home}")


def interrupt_notice(project: Project, run_id: str, presses: int) -> str:
    """The lines for the `presses`-th Ctrl+C (1: graceful stop, 2: stop now, more: reminder)."""
    resume = f"`{resume_command(project, run_id)}` continues the run later."
    if presses == 1:
        running = _running(project, run_id)
        if not running:
            return f"Ctrl+C: stopping run {run_id}: nothing is running, it stops now.\n{resume}"
        listed = "\n".join(f"  {line}" for line in running)
        return (f"Ctrl+C: stopping run {run_id}: no new story starts; waiting for what is "
                f"running to finish (an agent session may take long):\n{listed}\n"
                "Press Ctrl+C again to stop now (agent sessions are ended; their attempts "
                f"are not counted).\n{resume}")
    if presses == 2:
        return (f"Ctrl+C again: stopping run {run_id} now: ending the agent sessions and "
                f"verifications (their attempts are not counted).\n{resume}")
    return f"Ctrl+C: already stopping now; waiting for the sessions to end. {resume}"


def _running(project: Project, run_id: str) -> list[str]:
    """One line per story a worker or the lane holds: its phase, session and how long."""
    now = utcnow()
    with project.db.read() as s:
        if s.get_one(Run, run_id).state in RUN_SETTLED:
            return []  # stopped at once: nothing was working
        # A story queued but not claimed goes back in line: nothing to wait for.
        stories = list(s.scalars(select(Story).where(
            Story.run_id == run_id, Story.state.in_(STORY_AWAITING_LANE | {StoryState.WORKING}))
            .order_by(Story.seq)))
        sessions = {a.story_id: a for a in s.scalars(select(Attempt).where(
            Attempt.run_id == run_id, Attempt.state == AttemptState.RUNNING))}
    lines = []
    for story in stories:
        attempt = sessions.get(story.id)
        if attempt is not None:
            where = f" on {attempt.host}" if attempt.host else ""
            lines.append(f"{story.key}: {attempt.phase} session, attempt {attempt.number}{where}, "
                         f"running for {_took(now - attempt.started_at)}")
        elif story.state in STORY_AWAITING_LANE:
            lines.append(f"{story.key}: {story.state}, the lane integrates it or hands it back")
        else:
            lines.append(f"{story.key}: {story.state} ({story.phase or 'not started'})")
    return lines


def _took(delta: dt.timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
