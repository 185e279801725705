"""What `run` and `resume` print when Ctrl+C is pressed: what the stop waits for, what a
second Ctrl+C does, and the command that continues the run later.

An agent session may take an hour to finish; the first Ctrl+C must say so instead of a bare
`run.stopping`. The text is the same on a terminal and in a CI log (plain lines, no colour).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from ..db.models import Attempt, Run, Story, utcnow
from ..states import RUN_SETTLED, STORY_AWAITING_LANE, AttemptState, StoryState

__all__ = ["interrupt_notice", "resume_command"]


def resume_command(project, run_id: str) -> str:
    """`bmad-loop resume RUN`, with `--project` when this folder is not in the project."""
    from ..policy.load import find_project_root

    here = find_project_root(Path.cwd())
    same = here.resolve() == Path(project.home).resolve()
    return f"bmad-loop resume {run_id}" + ("" if same else f" --project {project.home}")


def interrupt_notice(project, run_id: str, presses: int) -> str:
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


def _running(project, run_id: str) -> list[str]:
    """One line per story a worker or the lane holds: its phase, session and how long."""
    now = utcnow()
    with project.db.read() as s:
        if s.get(Run, run_id).state in RUN_SETTLED:
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


def _took(delta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
