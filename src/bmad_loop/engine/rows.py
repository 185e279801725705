"""Small row helpers shared by the lane and the workers: loading and guarded transitions.

Guarded transitions are conditional UPDATEs (`… WHERE id = :id AND state IN (:expected)`):
the rowcount says whether this caller won, so duplicate queue messages are harmless.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ..db.models import Run, Story
from ..policy import Policy, policy_from_dict

__all__ = ["transition_story", "transition_run", "run_policy", "stories_of"]


def transition_story(session: Session, story_id: int, expected, **values) -> bool:
    expected = (expected,) if isinstance(expected, str) else tuple(expected)
    result = session.execute(
        update(Story).where(Story.id == story_id, Story.state.in_(expected)).values(**values)
    )
    return result.rowcount == 1


def transition_run(session: Session, run_id: str, expected, **values) -> bool:
    expected = (expected,) if isinstance(expected, str) else tuple(expected)
    result = session.execute(
        update(Run).where(Run.id == run_id, Run.state.in_(expected)).values(**values)
    )
    return result.rowcount == 1


def run_policy(run: Run) -> Policy:
    """The policy snapshot taken at enqueue: a resumed run keeps its settings."""
    return policy_from_dict(run.policy, source=f"run {run.id} policy snapshot", env={})


def stories_of(session: Session, run_id: str) -> list[Story]:
    return list(session.scalars(select(Story).where(Story.run_id == run_id).order_by(Story.seq)))


def path_inside(path, root: Path) -> str | None:
    """`path` relative to `root` (POSIX form), None when it lies outside."""
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return None


def board_rel(run: Run, root: Path) -> str | None:
    """The board's path inside the repository (runs made before `board_rel` existed: derived)."""
    return run.board_rel or path_inside(run.board_path, root)
