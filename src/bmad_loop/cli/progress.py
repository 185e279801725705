"""The plain progress lines `run` and `resume` print: one line per journal event, but quieter
where one change comes as many events.

- `story.waiting` comes once per story whenever what holds stories back changes (nine at once
  on a twenty-story board): the lines of one read of the journal are printed as one line per
  reason, listing the stories.
- A story the create phase has not written yet has no footprint, and the plan journals
  `footprint.exclusive reason=missing` for it, which reads like an error: those are printed as
  one "not created yet" line. Once its file is written (`story.created`), its footprint
  events print as they are.

Only the console changes: the journal keeps every event as it was recorded.
"""

from __future__ import annotations

from typing import Callable

import click

from ..operator.style import short_value

__all__ = ["ProgressPrinter"]

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

    def __call__(self, event) -> None:
        data = event.data or {}
        ts = event.ts.strftime("%H:%M:%S")
        if event.kind == "story.waiting" and event.story:
            self.waiting.pop(event.story, None)
            self.waiting[event.story] = str(data.get("reason") or "")
            self.held_ts = ts
            return
        if event.kind == "footprint.exclusive" and data.get("reason") == "missing" \
                and event.story in self.not_created:
            self.uncreated.append(event.story)
            self.held_ts = ts
            return
        if event.kind == "story.created":
            self.not_created.discard(event.story)
        self.flush()
        story = f" {event.story}" if event.story else ""
        detail = " ".join(f"{k}={short_value(v)}" for k, v in data.items() if k in _DETAIL_KEYS)
        self.echo(f"{ts} {event.kind}{story} {detail}".rstrip(), color=self.color)
        if event.kind == "story.escalated" and event.story:
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
