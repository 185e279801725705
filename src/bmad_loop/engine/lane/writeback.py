"""What the lane writes back into the candidate when a story integrates, the BMAD way.

One tree edit, folded into the candidate (the merge or squash commit; for `ff` one lane commit
`bmad-loop: mark <key> done`), so the target never shows a story integrated but not marked:

- the board (v6 `sprint-status.yaml`): the story's line becomes `done`; its epic's line
  `epic-<id>` becomes `in-progress` when the epic is still `backlog` (or the legacy
  `contexted`), and `done` once no story of the epic on the board is unfinished;
- the story's own file (`stories.story_path`): its status value becomes `done` in the case style
  it was written in (`Approved` → `Done`), by `story_files.set_story_status`.

A story is *finished* when its board status is `done` or one that says the work will never be
done (`FINISHED_WITHOUT_WORK`: `wont-do`, `cancelled`, `obsolete`...). Everything else —
including `blocked`, `on-hold`, `deferred` and `optional` — is work still to come, and keeps the
epic open. Only status tokens change: comments, quoting, order and line endings of both files
survive byte for byte. A board or story file the candidate does not track, a story file with
no status, or a value already `done` is left as it is, so recomposing after a crash edits
nothing twice. BMAD v4 runs have no board: only the story file changes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from ...bmad.board import DONE, Board, BoardEntry, parse_board, set_status, set_statuses
from ...git.trees.compose import blob_at, blobs_at
from ...git.trees.edit import replace_blobs
from ...errors import ConfigError
from ...bmad.story_files import set_story_status
from ...git.runner import Git

__all__ = ["FINISHED_WITHOUT_WORK", "LaneTreeEdit", "board_done_keys", "lane_tree_edit",
           "mark_done_on_board", "mark_story_file_done"]

IN_PROGRESS = "in-progress"
# Epic statuses the first integrated story moves on (`contexted` is BMAD's legacy name for an
# epic being worked on; bmad-loop writes the current name).
EPIC_NOT_STARTED = ("backlog", "contexted")
# Board statuses of stories nobody will work on: they do not keep an epic open.
# Compared by their letters only, as the start of the written value: `wont-do`, `won't do`,
# `Wont Do`, `cancelled ❌ (by PO)` all say so.
FINISHED_WITHOUT_WORK = ("wont-do", "wont-fix", "cancelled", "canceled", "dropped", "obsolete",
                         "superseded", "descoped", "duplicate", "removed", "skipped")
_LETTERS = tuple(re.sub(r"[^a-z]", "", w) for w in FINISHED_WITHOUT_WORK)


def _finished(entry: BoardEntry) -> bool:
    """Done (the board's canonical reading: `done ✅ (merged)` is done), or never to be done."""
    if entry.status == DONE:
        return True
    letters = re.sub(r"[^a-z]", "", (entry.written or entry.status).lower())
    return letters.startswith(_LETTERS)


def mark_done_on_board(text: str, key: str, epic: str | None,
                       source: str = "sprint-status.yaml") -> str:
    """The board text with `key` done and its epic's line moved on; unchanged when there is
    nothing to change (the key is not on the board, or every value already says so). The board
    is parsed once; the edits know the board they make (`board.set_statuses`)."""
    try:
        board = parse_board(text, Path(source))
    except ConfigError:  # a board the parser refuses: edit the story's line as before, no epic
        return set_status(text, key, DONE, source)
    entry = board.entry(key)
    if entry is None:
        return text
    if entry.status != DONE:
        text, board = set_statuses(text, board, {key: DONE}, source)
    if epic is None:
        return text
    return _move_epic(text, board, str(epic), source)


def _move_epic(text: str, board: Board, epic: str, source: str) -> str:
    epic_entry = board.entry(f"epic-{epic}")
    if epic_entry is None:
        return text
    current = epic_entry.status
    stories = [e for e in board.entries if e.kind in ("story", "extra") and e.epic == epic]
    if stories and all(_finished(e) for e in stories):
        wanted = DONE
    elif current in EPIC_NOT_STARTED:
        wanted = IN_PROGRESS
    else:
        return text
    if current == wanted:
        return text
    return set_statuses(text, board, {epic_entry.key: wanted}, source)[0]


def mark_story_file_done(text: str) -> str:
    """The story file's text with its status `done`; unchanged when it states no status."""
    return set_story_status(text, DONE)


def _edited(current: bytes | None, change: Callable[[str], str]) -> bytes | None:
    """The file's new content, or None to leave it (not tracked in the candidate, not text)."""
    if current is None:
        return None
    try:
        text = current.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return change(text).encode("utf-8")


def lane_tree_edit(git: Git, *, key: str, epic: str | None, board_rel: str | None,
                   story_path: str | None) -> "LaneTreeEdit | None":
    """The candidate's tree edit for integrating story `key` (tree sha -> tree sha), or None
    when the run has neither a board nor a story file to write."""
    if not board_rel and not story_path:
        return None
    changes = {}
    if board_rel:
        changes[board_rel] = lambda text: mark_done_on_board(text, key, epic, board_rel)
    if story_path and story_path != board_rel:
        changes[story_path] = mark_story_file_done
    return LaneTreeEdit(git, changes)


class LaneTreeEdit:
    """Called with a tree, the tree with the board (and story file) marked done."""

    def __init__(self, git: Git, changes: dict[str, Callable[[str], str]]):
        self.git, self.changes = git, changes

    def __call__(self, tree: str) -> str:
        # One read and one write for both files (blobs_at, then one pack).
        current = blobs_at(self.git, tree, list(self.changes))
        updated = {path: _edited(current[path], change)
                   for path, change in self.changes.items()}
        edits = {p: new for p, new in updated.items() if new is not None and new != current[p]}
        return replace_blobs(self.git, tree, edits)


def board_done_keys(git: Git, sha: str, board_rel: str) -> frozenset[str]:
    """The keys the board at `sha` marks `done` (extra keys too); none when the board is
    missing or broken there (the lane's own edit will say so)."""
    blob = blob_at(git, sha, board_rel)
    if blob is None:
        return frozenset()
    try:
        board = parse_board(blob.decode("utf-8"), Path(board_rel))
    except Exception:
        return frozenset()
    return frozenset(e.key for e in board.entries if e.status == DONE)
