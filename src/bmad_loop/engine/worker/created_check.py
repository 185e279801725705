"""A story file the create phase wrote, checked as planning checks a committed one.

Planning refuses a committed story file whose metadata is wrong (story_files.load_stories for
the file itself, selection.check_dependencies for its `depends_on`): not a list of story keys,
an unknown story, itself, a story later in the plan, a cycle, or unfinished work the run will
not do. A created file gets the same checks with the same one-line message, against the run's
plan (its rows in plan order, their dependencies as resolved) and the board as the story's
worktree has it. A problem fails the create attempt; the `depends_on` that passes is stored
resolved to full keys, as planning stores a committed file's.
"""

from __future__ import annotations

from pathlib import Path

from ...bmad.board import parse_board
from ...errors import ConfigError
from ...bmad.footprint import Footprint
from ...bmad.selection import StorySpec, check_dependencies, resolve_dependencies
from ..runs import stories_of

__all__ = ["check_created"]


def check_created(ctx, story, meta, written: Path) -> tuple[tuple[str, ...], str | None]:
    """(the file's `depends_on` resolved to full keys, or the problem in one line naming
    `written` and the story)."""
    if meta.errors:
        return (), f"{written}: {'; '.join(meta.errors)}"
    with ctx.db.read() as s:
        rows = [(r.key, r.epic, list(r.depends_on or ())) for r in stories_of(s, ctx.run_id)]
    board = _board_statuses(ctx, Path(story.worktree))
    planned = {key for key, _, _ in rows}

    def spec(key, epic, deps, position, status="ready-for-dev", where=None):
        return StorySpec(key=key, epic=epic, status=status, title=key, story_file=where,
                         story_path=None, footprint=Footprint(), depends_on=tuple(deps),
                         merge_class=None, tier=None, done_checkpoint=False, position=position)

    created = spec(story.key, story.epic, meta.depends_on, 0, where=written)
    plan = [created if key == story.key else spec(key, epic, deps, 0)
            for key, epic, deps in rows]
    others = [spec(key, epic, (), i, status) for i, (key, epic, status) in enumerate(board)
              if key not in planned]
    try:
        resolved = resolve_dependencies(plan + others, [created])[0].depends_on
        check_dependencies(plan + others, plan)
    except ConfigError as exc:
        return (), str(exc)
    return resolved, None


def _board_statuses(ctx, worktree: Path) -> list[tuple[str, str, str]]:
    """(key, epic, status) of every story on the board in the story's worktree."""
    if not ctx.board_rel:
        return []
    path = worktree / ctx.board_rel
    try:
        board = parse_board(path.read_text(encoding="utf-8"), Path(ctx.board_rel))
    except (OSError, UnicodeDecodeError, ConfigError):
        return []  # the lane's own board edit reports a broken board
    return [(e.key, e.epic or "", e.status) for e in board.stories()]
