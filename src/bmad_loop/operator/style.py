"""How the operator surfaces show things: a state's colour, a duration, a short sha, the lane's
current candidate. One place for the live board, the TUI, `history` and plain `status`, so the
surfaces cannot drift apart.
"""

from __future__ import annotations

import math

from rich.text import Text

from ..fileio import shown
from ..states import CANDIDATE_ENDED, CandidateState, RunState, StoryState

__all__ = ["CANDIDATE_ACTIVE", "CANDIDATE_PRESERVED", "stack_of", "composed_on", "state_style", "state_text",
           "format_duration", "short_sha", "short_value", "current_candidate", "preserved",
           "story_note", "elapsed_text", "key_width", "NO_TIME"]

NO_TIME = "—"  # a story with no time in a worker (not started, or back in line)

# The lane is busy with a candidate in one of these states.
CANDIDATE_ACTIVE = frozenset(CandidateState) - CANDIDATE_ENDED
# Ended candidates whose ref, worktree and evidence are kept for a person to look at.
CANDIDATE_PRESERVED = frozenset({CandidateState.CONFLICT, CandidateState.VERIFY_FAILED,
                                 CandidateState.ABANDONED})

# Run, story and candidate states share one palette (StrEnum members equal their strings).
_PALETTE = (
    ("green", frozenset({StoryState.INTEGRATED, RunState.COMPLETED, CandidateState.ADVANCED,
                         CandidateState.VERIFIED})),
    ("bold red", frozenset({StoryState.ESCALATED, StoryState.FAILED, StoryState.BLOCKED,
                            CandidateState.CONFLICT, CandidateState.VERIFY_FAILED,
                            CandidateState.STALE})),
    ("yellow", frozenset({StoryState.HELD, RunState.PAUSED, RunState.PAUSING, RunState.STOPPING,
                          RunState.STOPPED})),
    ("cyan", frozenset({StoryState.WORKING, StoryState.INTEGRATING, RunState.RUNNING,
                        CandidateState.COMPOSING, CandidateState.VERIFYING,
                        CandidateState.ADVANCING})),
)


def state_style(state: str) -> str:
    """The rich style of a run, story or candidate state ("" for the quiet ones)."""
    for style, states in _PALETTE:
        if state in states:
            return style
    return ""


def state_text(state: str) -> Text:
    return Text(state, style=state_style(state))


def format_duration(seconds) -> str:
    """`-`, `42s`, `3m07s`, `2h05m`: whole seconds, half up (`0.5s` is `1s`, `59.5s` is
    `1m00s`), the same in every terminal table and in the HTML report."""
    if seconds is None:
        return "-"
    whole = math.floor(float(seconds) + 0.5)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def elapsed_text(seconds) -> str:
    """A story's time in a worker: `NO_TIME` when it has none yet."""
    return NO_TIME if seconds is None else format_duration(seconds)


def key_width(stories, least: int = 10) -> int:
    """The width of a story-key column that holds every key whole (tables stay aligned)."""
    return max([least, *(len(s["key"] if isinstance(s, dict) else s.key) for s in stories)])


def short_sha(value, empty: str = "-") -> str:
    """The first ten characters of a sha, or `empty` when there is none."""
    return (value or "")[:10] or empty


def short_value(value):
    """A value of an event's data as one short word: a full sha cut to ten, a list joined."""
    if isinstance(value, str) and len(value) == 40 and all(c in "0123456789abcdef" for c in value):
        return value[:10]
    if isinstance(value, list):
        return shown(",".join(str(v) for v in value))
    return shown(value) if isinstance(value, str) else value


def current_candidate(candidates: list[dict]) -> dict | None:
    """The candidate the lane is working on (the newest active one), if any."""
    active = [c for c in candidates if c["state"] in CANDIDATE_ACTIVE]
    return active[-1] if active else None


def stack_of(candidates: list[dict]) -> list[dict]:
    """The candidates the lane is working on, bottom first (speculative: several at once)."""
    return sorted((c for c in candidates if c["state"] in CANDIDATE_ACTIVE),
                  key=lambda c: c.get("stack") or 1)


def composed_on(cand: dict) -> str:
    """What a candidate was composed on, in words."""
    on = cand.get("on")
    if on:
        return f"{on['story']} #{on['attempt']}"
    return f"target {short_sha(cand.get('target_sha'))}"


def preserved(candidates: list[dict]) -> list[dict]:
    return [c for c in candidates if c["state"] in CANDIDATE_PRESERVED]


def story_note(story: dict) -> str:
    """Why a story stands where it does: its reason, else what it waits for; and the repairs
    and flakes it needed (status, the live board, the TUI)."""
    note = story.get("reason") or story.get("waiting_for") or ""
    extra = [f"{story[name]} {label}" for name, label in (("repairs", "repair(s)"),
                                                         ("flakes", "flake(s)"))
             if story.get(name)]
    return "; ".join([note] + extra if note else extra)
