"""Status edits of a parsed board that know the board they make, without parsing it again.

The lane marks one story done (and sometimes its epic) in the target's board at every
integration, and reads that board back after it. A full parse of a 300-story board costs
milliseconds; a story's line is found from the line number its entry already has. The edit
takes this quick way only when the line is the plain ``key: value`` it expects (the value as
the parser read it, unquoted, after the key at the line's start); anything else (quotes, a flow
mapping, a value that is not where the entry says) goes through `board.set_status`, which reads
the YAML itself. Either way the text is the same; the quick way also knows the new Board
(`remember_board`), so the next `parse_board` of that text is free.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from .board import Board, parse_board, remember_board, set_status
from .board_status import is_known, read_status

__all__ = ["set_statuses"]

# A plain scalar cannot begin with one of these (YAML's indicators); such a value is left to
# the parser.
_NOT_PLAIN_START = set("-?:,[]{}#&*!|>'\"%@`")
_OTHER_BREAKS = ("\x85", "\u2028", "\u2029")


def set_statuses(text: str, board: Board, changes: dict[str, str],
                 source: Path | str) -> tuple[str, Board]:
    """`text` (which `board` is the parse of) with each key's status token replaced, and the
    board of the result. Keys not on the board are left alone."""
    path = Path(source)
    for key, status in changes.items():
        entry = board.entry(key)
        if entry is None:
            continue
        edited = _quick_edit(text, entry, status)
        if edited is None:
            text = set_status(text, key, status, path)
            board = parse_board(text, path)
            continue
        text, written = edited
        new = read_status(written).status
        board = replace(board, entries=tuple(
            replace(e, status=new, written=written, known=is_known(e.kind, new)) if e is entry
            else e for e in board.entries))
        remember_board(text, path, board)
    return text, board


def _quick_edit(text: str, entry, status: str) -> tuple[str, str] | None:
    """(new text, new value) when the entry's line is a plain `key: value`; else None."""
    written = entry.written
    if not written or written[0] in _NOT_PLAIN_START or written != written.strip():
        return None
    if any(c in text for c in _OTHER_BREAKS) or "\r" in text.replace("\r\n", ""):
        return None  # line breaks YAML counts and a split on "\n" would not
    lines = text.split("\n")
    if not 1 <= entry.line <= len(lines):
        return None
    line = lines[entry.line - 1]
    m = re.match(r"[ \t]*" + re.escape(entry.key) + r"[ \t]*:[ \t]+", line)
    if m is None:
        return None
    end = m.end() + len(written)
    rest = line[end:]
    if line[m.end():end] != written or rest.strip() and not re.match(r"[ \t]+#", rest):
        return None
    reading = read_status(written)
    value = written[:reading.start] + status + written[reading.end:]
    lines[entry.line - 1] = line[:m.end()] + value + rest
    return "\n".join(lines), value
