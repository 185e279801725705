"""A worker's bookkeeping when a story's walk is cut short: the story handed back, the
sessions left marked running closed as interrupted (uncounted)."""

from __future__ import annotations

from sqlalchemy import select

from ...db.models import Attempt, Story, utcnow
from ...states import AttemptState, StoryState
from ..journal import record
from ..transitions import transition_story

__all__ = ["release_after_stop", "interrupt_open_attempts", "close_running_attempts"]


def release_after_stop(db, run_id: str, story_id: int, generation: int, fault: str | None = None) -> None:
    """A stop (or a persistent fault) reached this story: hand it back as pending, its phase
    and worktree kept."""
    with db.transaction() as s:
        story = s.get(Story, story_id)
        if story.claim == generation and transition_story(s, story_id, StoryState.WORKING,
                                                          state=StoryState.PENDING,
                                                          heartbeat_at=None):
            data = {"fault": fault} if fault else {}
            record(s, run_id, "story.interrupted", story.key, phase=story.phase, **data)


def interrupt_open_attempts(claim) -> None:
    """Close this story's sessions still marked running (uncounted): only ours can be, since we
    hold its claim, and a retried step starts a new one."""
    with claim.db.transaction() as s:
        close_running_attempts(s, claim.run_id, claim.own(s))


def close_running_attempts(s, run_id: str, row: Story) -> None:
    for att in s.scalars(select(Attempt).where(Attempt.story_id == row.id,
                                               Attempt.state == AttemptState.RUNNING)):
        att.state, att.counted, att.ended_at = AttemptState.INTERRUPTED, False, utcnow()
        record(s, run_id, "attempt.finished", row.key, phase=att.phase, attempt=att.number,
               state=AttemptState.INTERRUPTED, counted=False, why="retried after a fault")
