"""The status vocabulary of the sprint board, and how a status is read as people write it.

BMAD boards are edited by people and by agents, so a status is not always the bare token:
`Done`, `done  `, `done ✅ (merged)`, `In Progress`, `ready_for_dev`. The reading rule
(`read_status`):

1. Take the leading phrase of the value: words of letters and digits joined by `-`, `_` or
   spaces (`done ✅ (merged)` → `done`; `In Progress (since Monday)` → `In Progress`).
2. Lower-case it and join its words with `-` (`in-progress`). The longest run of its leading
   words that is a status bmad-loop knows is the status (`ready for dev now` → `ready-for-dev`).
3. Otherwise the status is the first word, hyphens kept (`wont-do`, `on-hold`): a status
   bmad-loop does not know. Such an entry is never run and `validate` lists it as a warning.

An inline YAML comment (`backlog # later`) is not part of the value at all. `read_status` also
says where the status sits inside the value, so the lane rewrites only that part and keeps any
decoration.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = [
    "ACTIONABLE",
    "STORY_STATUSES",
    "EPIC_STATUSES",
    "EPIC_STARTED",
    "RETRO_STATUSES",
    "RETRO_ITEM_STATUSES",
    "KNOWN_BY_KIND",
    "DONE",
    "StatusReading",
    "read_status",
    "is_known",
]

DONE = "done"
# Story statuses in their order. `drafted` is what older boards call `ready-for-dev`.
STORY_STATUSES = ("backlog", "drafted", "ready-for-dev", "in-progress", "review", DONE)
ACTIONABLE = ("backlog", "ready-for-dev", "drafted")
# `contexted` is what older v6 boards call an epic whose technical context was written: it has
# started, like `in-progress`.
EPIC_STATUSES = ("backlog", "contexted", "in-progress", DONE)
EPIC_STARTED = ("in-progress", "contexted")
# `optional` until held; older boards say `completed` for a held one.
RETRO_STATUSES = ("optional", "completed", DONE)
# Retrospective action items: `open` in BMAD's own vocabulary, or a story status.
RETRO_ITEM_STATUSES = ("open",) + STORY_STATUSES

KNOWN_BY_KIND = {
    "story": STORY_STATUSES,
    "extra": STORY_STATUSES,
    "epic": EPIC_STATUSES,
    "retrospective": RETRO_STATUSES,
    "retro-item": RETRO_ITEM_STATUSES,
}
_ALL_KNOWN = frozenset(s for statuses in KNOWN_BY_KIND.values() for s in statuses)

_PHRASE_RE = re.compile(r"[A-Za-z0-9]+(?:[ _-]+[A-Za-z0-9]+)*")
_WORD_RE = re.compile(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*")
_SEPARATORS_RE = re.compile(r"[ _-]+")


class StatusReading(NamedTuple):
    """`status`: the canonical token; `start`/`end`: where it is written inside the value."""

    status: str
    start: int
    end: int


def read_status(value: str) -> StatusReading:
    """The canonical status of a board value as written (see the module's rule)."""
    lead = len(value) - len(value.lstrip())
    phrase = _PHRASE_RE.match(value, lead)
    if phrase is None:  # nothing word-like: the whole value is an (unknown) status
        text = value.strip()
        return StatusReading(text.lower(), lead, lead + len(text))
    # word boundaries inside the phrase, longest run of leading words first
    ends = [m.start() for m in _SEPARATORS_RE.finditer(value, phrase.start(), phrase.end())]
    for end in sorted(ends + [phrase.end()], reverse=True):
        token = _SEPARATORS_RE.sub("-", value[lead:end]).lower()
        if token in _ALL_KNOWN:
            return StatusReading(token, lead, end)
    word = _WORD_RE.match(value, lead)
    return StatusReading(word.group().lower(), lead, word.end())


def is_known(kind: str, status: str) -> bool:
    """Does bmad-loop know `status` for an entry of this kind?"""
    return status in KNOWN_BY_KIND.get(kind, ())
