"""A commit object's bytes exactly as ``git commit-tree`` would write them, where that is certain.

The lane's candidate commit is made right after its tree edit (the board marked done), which
writes its folders through one ``unpack-objects`` (`treeedit`); the commit can go into the same
pack instead of a ``commit-tree`` process of its own (one start fewer per story on the run's
serial path). That is only right if the bytes are the ones git writes, so that composing the
same inputs still gives the same SHA whichever way the commit was made:

    tree <tree>
    parent <each parent>
    author <name> <<email>> <unix time> <+hhmm>
    committer <name> <<email>> <unix time> <+hhmm>

    <message, as given>

`commit_body` answers None wherever git could write something else, and the caller then runs
``commit-tree``: a parent named twice (git drops the repeat), a name or e-mail git would trim
(leading or trailing spaces, dots, commas, colons, semicolons, quotes, backslashes, angle
brackets; ``<``, ``>`` or a newline inside), a date not in the ``@<unix> <+hhmm>`` form
bmad-loop passes (git would parse and reformat it), a text git would re-encode (not UTF-8, or
holding the non-characters git's UTF-8 check rejects), and a repository whose
``i18n.commitEncoding`` is not UTF-8 (git adds an ``encoding`` header: the caller checks that,
`commit_encoding_is_utf8`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["CommitSpec", "commit_body", "commit_encoding_is_utf8"]

# Characters git strips from both ends of a name or an e-mail ("crud"; older gits count the
# dot too, so it is refused here either way), and the ones it drops anywhere inside.
_CRUD = frozenset(b" .,:;<>\"\\'") | frozenset(range(33))
_DROPPED = frozenset(b"\n<>")
_DATE = re.compile(r"@([1-9][0-9]{0,11}) ([+-])([0-9]{2})([0-9]{2})")


@dataclass(frozen=True)
class CommitSpec:
    """What `commit-tree` is given apart from the tree: parents, message and environment
    (``GIT_AUTHOR_*`` and ``GIT_COMMITTER_*``: name, e-mail, date)."""

    parents: Sequence[str]
    message: str
    env: Mapping[str, str]


def commit_body(tree: str, spec: CommitSpec) -> bytes | None:
    """The commit object's content for `tree`, or None when git might write other bytes."""
    if len(set(spec.parents)) != len(spec.parents):
        return None  # git drops a repeated parent (with a warning)
    author = _ident(spec.env, "AUTHOR")
    committer = _ident(spec.env, "COMMITTER")
    if author is None or committer is None:
        return None
    text = "".join([f"tree {tree}\n", *(f"parent {p}\n" for p in spec.parents),
                    f"author {author}\n", f"committer {committer}\n", "\n", spec.message])
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:
        return None  # undecodable bytes carried as surrogates: git would re-encode them
    if any(_non_character(ord(c)) for c in text if ord(c) >= 0xFDD0):
        return None
    return body


def commit_encoding_is_utf8(config_entries) -> bool:
    """No ``encoding`` header: `i18n.commitEncoding` unset or UTF-8 in (scope, origin, key,
    value) entries as `gitconfig_guard` reads them."""
    values = [value for _scope, _origin, key, value in config_entries
              if key == "i18n.commitencoding"]
    return not values or values[-1].strip().lower() in ("utf-8", "utf8")


def _ident(env: Mapping[str, str], who: str) -> str | None:
    name, email = env.get(f"GIT_{who}_NAME"), env.get(f"GIT_{who}_EMAIL")
    date = _DATE.fullmatch(env.get(f"GIT_{who}_DATE") or "")
    if not name or not email or date is None:
        return None
    for part in (name, email):
        raw = part.encode("utf-8", "surrogatepass")
        if raw[0] in _CRUD or raw[-1] in _CRUD or _DROPPED.intersection(raw):
            return None
    seconds, sign, hours, minutes = date.groups()
    if int(hours) > 14 or int(minutes) >= 60 or (sign == "-" and hours == minutes == "00"):
        return None  # git would reject or rewrite the zone
    return f"{name} <{email}> {seconds} {sign}{hours}{minutes}"


def _non_character(codepoint: int) -> bool:
    """What git's UTF-8 check treats as invalid (and re-encodes) though Python encodes it."""
    return 0xFDD0 <= codepoint <= 0xFDEF or (codepoint & 0xFFFE) == 0xFFFE
