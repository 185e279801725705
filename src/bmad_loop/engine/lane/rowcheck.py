"""The lane's first look at each tick: do the rows that say "integrated" agree with git?

Rows are checked against git, not trusted: a story the rows call integrated must have its
commit on the target (an agent may have edited the state database). Only what changed is
looked at: integrations are in plan order, each on top of the last, so the latest one stands
for all; it costs a git call only when it is not where the lane itself last advanced the
target. A row marked integrated without a commit contradicts git whatever the target is.
"""

from __future__ import annotations

from sqlalchemy import bindparam, func, or_, select

from ...db.models import Story
from ...states import StoryState

__all__ = ["integrated_rows", "rows_contradicting_git"]


def _integrated_statement():
    integrated = (Story.run_id == bindparam("run_id"), Story.state == StoryState.INTEGRATED)
    latest_seq = select(func.max(Story.seq)).where(*integrated).scalar_subquery()
    return (select(Story.key, Story.integrated_sha, Story.seq)
            .where(*integrated, or_(Story.integrated_sha.is_(None), Story.seq == latest_seq))
            .order_by(Story.seq))


_INTEGRATED = _integrated_statement()  # built once: the lane reads it every tick


def integrated_rows(session, run_id: str) -> tuple:
    """(the latest integrated story, those integrated without a commit), as (key,
    integrated_sha) rows, in one statement."""
    rows = list(session.connection().execute(_INTEGRATED, {"run_id": run_id}))
    if not rows:
        return None, []
    return rows[-1], [row for row in rows if row.integrated_sha is None]


def rows_contradicting_git(git, target, head_sha: str | None, latest, bad: list) -> list:
    """The stories whose rows contradict git (see the module's docstring). `head_sha`: where
    the lane last advanced the target (the run's row); `target`: the run's target."""
    if latest is None:
        return []
    if not bad and latest.integrated_sha != head_sha:
        target_now = target.sha(fetch=False)
        if target_now and (git.rev(f"{latest.integrated_sha}^{{commit}}") is None
                           or not git.is_ancestor(latest.integrated_sha, target_now)):
            bad = [latest]
    return bad
