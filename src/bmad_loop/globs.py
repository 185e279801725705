"""The one glob engine: gitignore-style patterns, their validation, path matching and overlap.

Footprints, footprint drift and the lane-owned files all match paths here, so they agree.

Glob semantics (gitignore rules, from the repository root)
---------------------------------------------------------

- A pattern without a slash, ignoring a trailing one, matches at any depth:
  `README.md` matches `README.md` and `src/README.md` (it means `**/README.md`).
- A leading `/` anchors at the root: `/README.md` matches `README.md` only.
  A slash in the middle anchors too: `src/*.py` matches `src/a.py`, never `lib/src/a.py`.
- A trailing `/` means a directory: `docs/` matches everything under any `docs` folder.
- A pattern that matches a directory covers everything under it: `src/*` matches `src/a/b.py`,
  and `*.py` matches `x.py/notes.md` (a folder named `x.py`).
- `*` and `?` stay inside one path segment, `[...]` is a character class (`[!...]` or `[^...]`
  negated, `a-z` ranges, `[:alpha:]`-style classes); `**` as a whole segment spans any number
  of segments (`a/**/b` matches `a/b` and `a/x/y/b`). Any other `**` is a plain `*`.
- Not supported, and so *invalid*: `!` negation, backslashes (no escapes; use `/`), absolute
  paths, `.` and `..` components, empty components, unclosed `[`.

Which directories exist decides what a literal covers. Without that knowledge
(`directories=None`) every matched path may be a directory, so `src/greet.py` is taken to cover
`src/greet.py/CHANGELOG.md` and meets the bare name `CHANGELOG.md`. Given the directories of the
target tree (`directories=frozenset(...)`), a pattern covers what lies under a path it matches
only when it ends with `/` (or `/**`, which says so itself) or that path is one of those
directories; otherwise what it matches is a file. A directory the story will create must be
written `newdir/`.

Overlap is conservative: `globs_may_overlap(a, b)` is False only when no path, tracked or new, can
match both. Patterns are compared segment by segment with a memoised walk over `**`; two wildcard
segments are called disjoint only when their literal prefixes (before the first wildcard) or their
literal suffixes (after the last one) are incompatible, otherwise they are assumed to overlap:

    src/auth/**  vs src/**             overlap
    src/a/*.py   vs src/b/*.py         disjoint (a != b)
    /*.py        vs /*.md              disjoint (suffixes .py and .md)
    *.py         vs *.md               overlap  (x.py/notes.md matches both)
    **/test_*.py vs tests/test_auth.py overlap
    /README.md   vs src/README.md      disjoint
    /a*b         vs /a*c               disjoint (suffixes b and c)
    a*b          vs a*c                overlap  (a1b/a2c matches both)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from .caches import CACHES

__all__ = ["pattern_problem", "globs_may_overlap", "is_literal", "literal_prefix_length",
           "path_matches"]


# --- pattern validation ---

_POSIX_CLASSES = {
    "alnum": "a-zA-Z0-9",
    "alpha": "a-zA-Z",
    "blank": " \\t",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "\\x21-\\x7e",
    "lower": "a-z",
    "print": "\\x20-\\x7e",
    "punct": "".join("\\" + c for c in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    "space": " \\t\\n\\r\\f\\v",
    "upper": "A-Z",
    "xdigit": "0-9A-Fa-f",
}


class _BadPattern(ValueError):
    """A glob segment that cannot be parsed (e.g. an unclosed `[`)."""


def _parse_class(seg: str, i: int) -> tuple[str, int]:
    """Parse the class starting at `seg[i] == "["` (git's wildmatch); return (regex, next index)."""
    j = i + 1
    negated = False
    if j < len(seg) and seg[j] in "!^":
        negated = True
        j += 1
    parts: list[str] = []
    first = True
    prev: str | None = None  # the last single character, a possible range start
    while True:
        if j >= len(seg):
            raise _BadPattern("unclosed '['")
        ch = seg[j]
        if ch == "]" and not first:
            j += 1
            break
        first = False
        if ch == "-" and prev is not None and j + 1 < len(seg) and seg[j + 1] != "]":
            hi = seg[j + 1]
            parts.pop()  # the range replaces its start character
            if prev <= hi:
                parts.append(re.escape(prev) + "-" + re.escape(hi))
            prev = None
            j += 2
            continue
        if ch == "[" and j + 1 < len(seg) and seg[j + 1] == ":":
            close = seg.find("]", j + 2)
            if close == -1:
                raise _BadPattern("unclosed '['")
            if close - 1 >= j + 2 and seg[close - 1] == ":":
                name = seg[j + 2 : close - 1]
                if name not in _POSIX_CLASSES:
                    raise _BadPattern(f"unknown character class '[:{name}:]'")
                parts.append(_POSIX_CLASSES[name])
                prev = None
                j = close + 1
                continue
            # no ":]": a plain '[' inside the class
        parts.append(re.escape(ch))
        prev = ch
        j += 1
    body = "".join(parts)
    if not body:
        return ("[^/]" if negated else "(?!)"), j
    return (f"[^/{body}]" if negated else f"[{body}]"), j


@lru_cache(maxsize=4096)
def _segment_tokens(seg: str) -> tuple[tuple[str, str], ...]:
    """Tokens of one segment: ("lit", char) | ("star", "") | ("any", "") | ("class", regex)."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(seg):
        ch = seg[i]
        if ch == "*":
            if not (tokens and tokens[-1][0] == "star"):
                tokens.append(("star", ""))
            i += 1
        elif ch == "?":
            tokens.append(("any", ""))
            i += 1
        elif ch == "[":
            regex, i = _parse_class(seg, i)
            tokens.append(("class", regex))
        else:
            tokens.append(("lit", ch))
            i += 1
    return tuple(tokens)


@lru_cache(maxsize=4096)
def _segment_regex(seg: str) -> str:
    out = []
    for kind, value in _segment_tokens(seg):
        if kind == "lit":
            out.append(re.escape(value))
        elif kind == "star":
            out.append("[^/]*")
        elif kind == "any":
            out.append("[^/]")
        else:
            out.append(value)
    return "".join(out)


def pattern_problem(pattern: object) -> str | None:
    """Why `pattern` is not a valid footprint glob, or None."""
    if not isinstance(pattern, str):
        return f"pattern {pattern!r} is not a string"
    if not pattern.strip():
        return "empty pattern"
    if pattern != pattern.strip():
        return f"leading or trailing whitespace in {pattern!r}"
    if pattern.startswith("!"):
        return f"negation is not supported: {pattern!r}"
    if "\\" in pattern:
        return f"backslash in {pattern!r} (use '/')"
    if pattern.startswith("//") or pattern.startswith("~") or re.match(r"^[A-Za-z]:", pattern):
        return f"absolute path {pattern!r}"
    body = pattern[1:] if pattern.startswith("/") else pattern
    body = body[:-1] if body.endswith("/") else body
    if not body:
        return f"empty pattern {pattern!r}"
    for component in body.split("/"):
        if component == "":
            return f"empty path component in {pattern!r}"
        if component in (".", ".."):
            return f"'{component}' component in {pattern!r}"
        try:
            _segment_tokens(component)
        except _BadPattern as exc:
            return f"{exc} in {pattern!r}"
    return None


def is_literal(pattern: str) -> bool:
    """A pattern without wildcards: it names one path (and what lies under it)."""
    return literal_prefix_length(pattern) == len(pattern)


def literal_prefix_length(pattern: str) -> int:
    """How many characters `pattern` has before its first wildcard: of several patterns that
    match one path, the one with the longest literal prefix is the most specific."""
    match = re.search(r"[*?\[]", pattern)
    return len(pattern) if match is None else match.start()


# --- overlap and matching ---


@lru_cache(maxsize=4096)
def _segments(pattern: str, covers_below: bool = True) -> tuple[str, ...]:
    """A pattern as anchored segments, `**` matching any number of them.

    `covers_below`: whatever it matches may be a directory, so it ends with `**`. Else it is
    exact: a trailing `/` (a directory by its own say) or `/**` covers what lies under the
    directory, one segment or more, and not a file of the directory's name."""
    p = pattern[:-1] if pattern.endswith("/") else pattern
    if p.startswith("/"):
        p = p[1:]
        anchored = True
    else:
        anchored = "/" in p
    parts = p.split("/")
    if not anchored:
        parts.insert(0, "**")
    if covers_below:
        parts.append("**")  # a matched directory covers everything under it
    elif pattern.endswith("/"):
        parts += ["*", "**"]
    elif len(parts) > 1 and parts[-1] == "**":
        parts[-1:] = ["*", "**"]
    out: list[str] = []
    for part in parts:
        if part == "**" and out and out[-1] == "**":
            continue
        out.append(part)
    return tuple(out)


def _is_literal(seg: str) -> bool:
    return all(kind == "lit" for kind, _ in _segment_tokens(seg))


def _literal_ends(seg: str) -> tuple[str, str]:
    tokens = _segment_tokens(seg)
    prefix = []
    for kind, value in tokens:
        if kind != "lit":
            break
        prefix.append(value)
    suffix = []
    for kind, value in reversed(tokens):
        if kind != "lit":
            break
        suffix.append(value)
    return "".join(prefix), "".join(reversed(suffix))


@lru_cache(maxsize=16384)
def _segments_may_overlap(a: str, b: str) -> bool:
    """Could one path segment match both segment globs? (Never False when it could.)"""
    if a == b:
        return True
    try:
        literal_a, literal_b = _is_literal(a), _is_literal(b)
    except _BadPattern:
        return True  # not a valid glob: assume the worst
    if literal_a and literal_b:
        return False
    if literal_a:
        return re.fullmatch(_segment_regex(b), a, re.DOTALL) is not None
    if literal_b:
        return re.fullmatch(_segment_regex(a), b, re.DOTALL) is not None
    prefix_a, suffix_a = _literal_ends(a)
    prefix_b, suffix_b = _literal_ends(b)
    if not (prefix_a.startswith(prefix_b) or prefix_b.startswith(prefix_a)):
        return False
    if not (suffix_a.endswith(suffix_b) or suffix_b.endswith(suffix_a)):
        return False
    return True


def globs_may_overlap(a: str, b: str, directories: frozenset[str] | None = None) -> bool:
    """False only when no path can match both gitignore-style globs `a` and `b`.

    `directories`: the directories of the tree the paths are written in (repo-relative, no
    trailing `/`); None means unknown, and every matched path may then be a directory.
    """
    if directories is None:
        return _overlap_any_directory(a, b)
    return _overlap_in_tree(a, b, frozenset(directories))


@lru_cache(maxsize=16384)
def _overlap_any_directory(a: str, b: str) -> bool:
    return _walk(_segments(a), _segments(b))


@lru_cache(maxsize=16384)
def _overlap_in_tree(a: str, b: str, directories: frozenset[str]) -> bool:
    # Knowing the directories only narrows what a pattern covers, so the wider test decides "no".
    if not _overlap_any_directory(a, b):
        return False
    sa, sb = _segments(a, False), _segments(b, False)
    if _walk(sa, sb):
        return True
    # A path under a directory that `a` matches: `b` matches that directory or something in it
    # (when both reach it through directories, the deeper one is matched by the other's subtree).
    if any(_walk(below, sb) for below in _directories_covered(a, directories)):
        return True
    return any(_walk(sa, below) for below in _directories_covered(b, directories))


def _walk(sa: tuple[str, ...], sb: tuple[str, ...]) -> bool:
    """Can one path match both segment lists? A memoised walk over `**`."""
    memo: dict[tuple[int, int], bool] = {}

    def walk(i: int, j: int) -> bool:
        """Can one path match both `sa[i:]` and `sb[j:]`?"""
        if (i, j) in memo:
            return memo[(i, j)]
        if i == len(sa) and j == len(sb):
            result = True
        elif i < len(sa) and sa[i] == "**":
            # `**` matches no segment, or absorbs the next segment of the other pattern
            result = walk(i + 1, j) or (j < len(sb) and walk(i, j + 1))
        elif j < len(sb) and sb[j] == "**":
            result = walk(i, j + 1) or (i < len(sa) and walk(i + 1, j))
        elif i == len(sa) or j == len(sb):
            result = False
        else:
            result = _segments_may_overlap(sa[i], sb[j]) and walk(i + 1, j + 1)
        memo[(i, j)] = result
        return result

    return walk(0, 0)


@lru_cache(maxsize=4096)
def _directories_covered(pattern: str, directories: frozenset[str]) -> tuple[tuple[str, ...], ...]:
    """`d/**` (as segments) for each directory `d` of the tree that `pattern` matches, leaving out
    those under another one. Empty when the pattern covers its matches' subtrees anyway."""
    if pattern.endswith("/") or _segments(pattern, False)[-1] == "**":
        return ()
    matched = set(_directories_matching(pattern, directories))
    outermost = sorted(d for d in matched if not any(up in matched for up in _ancestors(d)))
    return tuple(tuple(_literal_glob(part) for part in d.split("/")) + ("**",) for d in outermost)


def _directories_matching(pattern: str, directories: frozenset[str]) -> Iterable[str]:
    body = pattern[1:] if pattern.startswith("/") else pattern
    try:
        literal = all(_is_literal(part) for part in body.split("/"))
    except _BadPattern:
        return directories  # not a valid glob: assume it matches every directory
    if literal:
        if pattern.startswith("/") or "/" in body:
            return [body] if body in directories else []
        return _directories_by_name(directories).get(body, ())
    regex, _ = _path_regex(pattern)
    return [d for d in directories if regex.fullmatch(d)]


@lru_cache(maxsize=8)
def _directories_by_name(directories: frozenset[str]) -> dict[str, tuple[str, ...]]:
    by_name: dict[str, list[str]] = {}
    for d in directories:
        by_name.setdefault(d.rsplit("/", 1)[-1], []).append(d)
    return {name: tuple(ds) for name, ds in by_name.items()}


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:k]) for k in range(1, len(parts))]


def _literal_glob(name: str) -> str:
    """A glob segment that matches exactly the file name `name` (wildcard characters bracketed)."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in name)


@lru_cache(maxsize=4096)
def _path_regex(pattern: str) -> tuple[re.Pattern, bool]:
    dir_only = pattern.endswith("/")
    p = pattern[:-1] if dir_only else pattern
    if p.startswith("/"):
        p, anchored = p[1:], True
    else:
        anchored = "/" in p
    segs = p.split("/")
    out = [] if anchored else ["(?:.*/)?"]
    for k, seg in enumerate(segs):
        last = k == len(segs) - 1
        if seg == "**":
            out.append(".*" if last else "(?:.*/)?")
        else:
            out.append(_segment_regex(seg) + ("" if last else "/"))
    return re.compile("".join(out), re.DOTALL), dir_only


def path_matches(pattern: str, path: str, directories: frozenset[str] | None = None) -> bool:
    """Does the gitignore-style `pattern` cover the file at repo-relative posix `path`?

    True when the pattern matches the path or one of its parent directories (a trailing `/` in
    the pattern matches directories only). The exact matcher, e.g. for footprint drift.
    With `directories` (a tree's directories), a parent counts only if it is one of them, or
    the pattern ends with `/`: the reference for `globs_may_overlap(..., directories)`.
    """
    regex, dir_only = _path_regex(pattern)
    parts = path.strip("/").split("/")
    for k in range(1, len(parts) + 1):
        if dir_only and k == len(parts):
            break
        prefix = "/".join(parts[:k])
        if directories is not None and not dir_only and k < len(parts) and prefix not in directories:
            continue
        if regex.fullmatch(prefix):
            return True
    return False


_COMPILED = (_segment_tokens, _segment_regex, _segments, _segments_may_overlap,
             _overlap_any_directory, _overlap_in_tree, _directories_covered, _directories_by_name,
             _path_regex)


def _clear_compiled() -> None:
    for f in _COMPILED:
        f.cache_clear()


CACHES.register("globs.compiled", _clear_compiled,
                bound="4,096 to 16,384 answers per function (LRU)",
                holds="a glob (and the folders asked about) -> its compiled form or answer")
