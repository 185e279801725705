"""What a story step decides: a phase's `Outcome`, or `Escalate` to hand the story to a human.

(What an integration leaves behind is the lane's `Aftermath`, engine/lane/aftermath.py.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..states import Phase

__all__ = ["Outcome", "Escalate"]


class Escalate(Exception):
    """End this story's work as escalated, with a reason and evidence (and the session, if any)."""

    def __init__(self, reason: str, *, result=None, **evidence):
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence
        self.result = result


@dataclass
class Outcome:
    """What a phase decided; the worker writes all of it in one transaction.

    `next_phase` is where the walk goes next; `ready` ends it with the story committed;
    `pending` ends it with the story back in line for admission (its file was just created);
    `escalate` ends it with the story escalated."""

    next_phase: Phase | None = None
    ready: bool = False
    pending: bool = False
    escalate: str | None = None
    evidence: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)  # increments: dev_attempts, review_cycles
    feedback: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)  # plain column values
    events: list = field(default_factory=list)  # (kind, data)
    session: object = None  # a SessionResult whose attempt row this closes
    flakes: tuple = ()  # verify.Flaky of the story's own verify: rows and `verify.flaky` events
