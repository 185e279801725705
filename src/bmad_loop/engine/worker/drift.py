"""Footprint drift: the paths a story's commit changed that its footprint does not cover."""

from __future__ import annotations

from ...bmad.footprint import tree_directories
from ..workspace.base import matches_any

__all__ = ["footprint_drift"]


def footprint_drift(git, story, changed: list[str], board_rel: str | None, settled=None) -> list[str]:
    """`changed` paths outside `story`'s declared footprint (the board, which the lane writes,
    and the paths a merge rule settles, `settled`, aside). An exclusive footprint conflicts with
    everything already: it never drifts."""
    if story.footprint_reason:
        return []
    declared = list(story.footprint.get("files", [])) + list(story.footprint.get("shared", []))
    ignored = [board_rel] if board_rel else []
    # Read the footprint as admission did: a literal path covers a folder only if the story's
    # base has that folder (`newdir` is a file, `newdir/` a folder). Knowing no folder at all
    # covers least, so a path covered that way is covered in any tree: the base's folders are
    # listed (one git process) only for the paths left.
    unsure = [p for p in changed if p not in ignored and not matches_any(p, declared, frozenset())
              and not (settled and settled.covers(p))]
    if not unsure:
        return []
    directories = tree_directories(git, story.base_sha)
    return [p for p in unsure if not matches_any(p, declared, directories)]
