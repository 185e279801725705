"""The stale-premise check: stories someone shipped on the target since the plan was made.

Before the lane queues a story it asks whether the target's board already marks it `done`
(someone integrated it by hand meanwhile); such a story is skipped instead of done twice.
The board is read and parsed again only when the target moved since the last read.
"""

from __future__ import annotations

from pathlib import Path

from ..board import parse_board
from ..compose import blob_at

__all__ = ["done_on_target"]


def done_on_target(memo, integrator, rows: list) -> list:
    """The rows among `rows` whose story the target's board marks done. `memo` (the run's
    `RunMemo`) keeps the done keys of the target commit last read."""
    if not rows or not integrator.board_rel:
        return []
    sha = integrator.target.sha()  # remote mode: refresh the mirror
    if sha is None:
        return []
    known = memo.board_done
    if known is None or known[0] != sha:
        known = memo.board_done = (sha, _board_done_at(integrator, sha))
    return [row for row in rows if row.key in known[1]]


def _board_done_at(integrator, sha: str) -> frozenset[str]:
    blob = blob_at(integrator.git, sha, integrator.board_rel)
    if blob is None:
        return frozenset()
    try:
        board = parse_board(blob.decode("utf-8"), Path(integrator.board_rel))
    except Exception:  # a board someone broke on the target: the lane's own edit will tell
        return frozenset()
    return frozenset(e.key for e in board.entries if e.status == "done")  # extra keys too
