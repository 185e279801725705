"""A BMAD v4 project's sprint, built from its story files (v4 has no sprint board).

v4 keeps one file per story in its story folder (`devStoryLocation`, default `docs/stories`),
named `E.S.<slug>.md` (v4's own create-next-story writes `E.S.story.md`) or `E.S.md`, each
with a status in a `Status:` line or a `## Status` section (`story_files.read_story_status`).
The board is synthesised from them: one story entry per file, in natural numeric order of
`E.S` (1.2 before 1.10), key = the file name without `.md`, epic = `E`. No `epic-E` entries:
the plan is the file order. v4 statuses map to bmad-loop's vocabulary:

| v4 status                        | bmad-loop status | run?            |
| -------------------------------- | ---------------- | --------------- |
| Draft (or no status at all)      | `draft`          | no: not approved|
| Approved                         | `ready-for-dev`  | yes             |
| InProgress, In Progress          | `in-progress`    | no              |
| Review, Ready for Review         | `review`         | no              |
| Done, Completed                  | `done`           | no              |
| anything else                    | itself, lower-case and hyphenated: unknown, a `validate` warning |
"""

from __future__ import annotations

import re
from pathlib import Path

from .board import Board, BoardEntry, validate_story_key
from ..errors import ConfigError
from ..git.trees.committed import TreeView
from .story_files import read_story_status

__all__ = ["V4_STATUSES", "v4_status", "v4_board", "V4_NAME_RE"]

V4_NAME_RE = re.compile(r"^(\d+)\.(\d+)([a-z])?(?:\.(.+))?\.md$")
# v4 status, lower-cased with spaces, `-` and `_` removed -> bmad-loop status.
V4_STATUSES = {
    "draft": "draft",
    "approved": "ready-for-dev",
    "inprogress": "in-progress",
    "review": "review",
    "readyforreview": "review",
    "done": "done",
    "completed": "done",
}
_KNOWN = frozenset(V4_STATUSES.values())


def v4_status(written: str | None) -> str:
    """The bmad-loop status of a v4 status as written (see the table above)."""
    if not written or not written.strip():
        return "draft"
    words = re.findall(r"[A-Za-z0-9]+", written)
    squashed = "".join(words).lower()
    if squashed in V4_STATUSES:
        return V4_STATUSES[squashed]
    return "-".join(w.lower() for w in words) or "draft"


def _order(name: str) -> tuple[int, int, str, str]:
    m = V4_NAME_RE.match(name)
    assert m is not None  # only names it matched are sorted
    return int(m.group(1)), int(m.group(2)), m.group(3) or "", name


def v4_board(tree: TreeView, folder: str, root: Path) -> Board:
    """The board of a v4 project whose story files are in `folder` (repository-relative) of
    `tree` (the committed target)."""
    names = sorted((n for n in tree.names(folder) if V4_NAME_RE.match(n)), key=_order)
    shown = Path(root) / folder
    if not names:
        raise ConfigError(f"{shown}: a BMAD v4 project, but no story files named E.S.<slug>.md "
                          f"here in {tree.where}; commit them first")
    rels = [f"{folder}/{n}" if folder else n for n in names]
    texts = tree.read_many(rels)
    entries = []
    for name, rel in zip(names, rels):
        m = V4_NAME_RE.match(name)
        assert m is not None  # `names` are those it matches
        key = name[:-len(".md")]
        validate_story_key(key, Path(root) / rel)
        try:
            found = read_story_status(texts[rel].decode("utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"{Path(root) / rel}: story file is not UTF-8 text") from None
        written = found.value if found is not None else ""
        status = v4_status(written)
        entries.append(BoardEntry(key=key, status=status, kind="story", epic=m.group(1), line=0,
                                  written=written, known=status in _KNOWN,
                                  number=int(m.group(2)), split=m.group(3) or "",
                                  slug=m.group(4) or ""))
    return Board(path=shown, entries=tuple(entries), story_location=folder, format="v4")
