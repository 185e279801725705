"""Remote mode, on a story host: this host's worktrees of the stories that landed, removed.

The lane runs in another clone there and cannot reach them; the story host sweeps its own
after each story task.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from ...db.models import Run, Story
from ...git.worktrees import delete_branch, remove_worktree
from ...states import StoryState
from ..runrows import run_policy

__all__ = ["sweep_landed"]


def sweep_landed(project, run_id: str) -> list[str]:
    """Remote mode, on a story host: remove this host's worktrees of the run's stories that
    landed (the lane, in another clone, cannot). Returns the paths removed."""
    state = project.state_dir.resolve()
    removed = []
    with project.db.transaction() as s:
        run = s.get(Run, run_id)
        policy = run_policy(run)
        rows = [(st.worktree, st.branch) for st in s.scalars(select(Story).where(
            Story.run_id == run_id, Story.state.in_((StoryState.INTEGRATED, StoryState.SKIPPED)),
            Story.host == project.host, Story.worktree.is_not(None)))]
    git = project.git(policy)
    for worktree, branch in rows:
        path = Path(worktree)
        if not path.is_dir() or not _under(path.resolve(), state):
            continue
        remove_worktree(git, path)
        removed.append(str(path))
        if policy.scm.delete_branch and branch:
            delete_branch(git, branch)
    return removed


def _under(path: Path, base: Path) -> bool:
    try:
        path.relative_to(base.resolve())
        return True
    except ValueError:
        return False
