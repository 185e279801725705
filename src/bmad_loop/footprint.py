"""Story metadata, footprints, and the conservative overlap of footprint globs.

A footprint says which paths a story may change:

    footprint:
      files: ["src/auth/**", "tests/test_auth.py"]   # exclusive: overlap serialises
      shared: ["src/app/__init__.py"]                # overlap with other `shared` is allowed
      resources: ["database"]                        # named tokens, counted elsewhere

It comes from the story file's YAML front matter (`footprint:` there), or from a fenced ```yaml
block under a `## Footprint` heading (holding either `footprint:` or the three lists directly),
or from a policy override. A footprint that is missing, empty (all lists empty), invalid, or given
twice is *exclusive*: it conflicts with every other story. `Footprint.reason` says why.

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
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import yaml

__all__ = [
    "Footprint",
    "StoryMeta",
    "parse_story_text",
    "footprint_from_mapping",
    "pattern_problem",
    "globs_may_overlap",
    "path_matches",
    "footprints_conflict",
]

_FOOTPRINT_KEYS = ("files", "shared", "resources")
_MERGE_CLASSES = ("self", "operator")


@dataclass(frozen=True)
class Footprint:
    """What a story may touch. `reason` is None for a declared, valid footprint."""

    files: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    reason: str | None = None  # None | "missing" | "empty" | "invalid: <why>"

    @property
    def exclusive(self) -> bool:
        """An exclusive footprint conflicts with every other footprint."""
        return self.reason is not None

    def to_dict(self) -> dict[str, list[str]]:
        return {
            "files": list(self.files),
            "shared": list(self.shared),
            "resources": list(self.resources),
        }

    def with_files(self, *paths: str) -> Footprint:
        """A copy with `paths` added to `files` (those not already there); `reason` is kept."""
        files = list(self.files)
        for p in paths:
            if p not in files:
                files.append(p)
        return Footprint(tuple(files), self.shared, self.resources, self.reason)


@dataclass(frozen=True)
class StoryMeta:
    """What a story file says about itself. `errors` are non-footprint metadata problems."""

    title: str | None
    footprint: Footprint
    depends_on: tuple[str, ...]
    merge_class: str | None
    tier: str | None
    done_checkpoint: bool
    errors: tuple[str, ...]


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
    pass


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


# --- footprint sources ---


def _string_list(data: Mapping, key: str) -> tuple[str, ...]:
    value = data.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _BadPattern(f"'{key}' must be a list of strings")
    for item in value:
        if not isinstance(item, str):
            raise _BadPattern(f"'{key}' must be a list of strings, got {item!r}")
    return tuple(value)


def footprint_from_mapping(data: object) -> Footprint:
    """Validate a `{files, shared, resources}` mapping (a story's footprint or a policy override)."""
    if data is None:
        return Footprint(reason="empty")
    if not isinstance(data, Mapping):
        return Footprint(reason="invalid: footprint must be a mapping of files, shared, resources")
    unknown = [str(k) for k in data if k not in _FOOTPRINT_KEYS]
    if unknown:
        return Footprint(reason=f"invalid: unknown key {', '.join(map(repr, unknown))}")
    try:
        files = _string_list(data, "files")
        shared = _string_list(data, "shared")
        resources = _string_list(data, "resources")
    except _BadPattern as exc:
        return Footprint(reason=f"invalid: {exc}")
    for pattern in files + shared:
        problem = pattern_problem(pattern)
        if problem is not None:
            return Footprint(reason=f"invalid: {problem}")
    for name in resources:
        if not name.strip() or name != name.strip():
            return Footprint(reason=f"invalid: bad resource name {name!r}")
    if not (files or shared or resources):
        return Footprint(reason="empty")
    return Footprint(files=files, shared=shared, resources=resources)


_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)")
_HEADING_RE = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _split_front_matter(text: str) -> tuple[str | None, list[str], list[str]]:
    """(front matter text or None, body lines, errors)."""
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].rstrip() != "---":
        return None, lines, []
    for i in range(1, len(lines)):
        if lines[i].rstrip() in ("---", "..."):
            return "\n".join(lines[1:i]), lines[i + 1 :], []
    return None, lines, ["front matter has no closing '---' line"]


def _scan_body(lines: list[str]) -> tuple[str | None, list[str | None], int]:
    """(first `# ` heading, yaml blocks under `## Footprint`, number of `## Footprint` headings).

    A yaml block is its text, or None when the heading has no yaml block under it.
    """
    title = None
    blocks: list[str | None] = []
    headings = 0
    in_footprint = False
    found_block = False
    fence: str | None = None
    fence_is_yaml = False
    block: list[str] = []
    for line in lines:
        if fence is not None:
            stripped = line.strip()
            if stripped.startswith(fence[0] * len(fence)) and set(stripped) == {fence[0]}:
                if fence_is_yaml:
                    blocks.append("\n".join(block))
                fence = None
            elif fence_is_yaml:
                block.append(line)
            continue
        m = _FENCE_RE.match(line)
        if m:
            fence = m.group(1)
            fence_is_yaml = in_footprint and m.group(2).lower() in ("yaml", "yml")
            if fence_is_yaml:
                found_block = True
            block = []
            continue
        h = _HEADING_RE.match(line)
        if h:
            level = len(h.group(1))
            if level == 1 and title is None:
                title = h.group(2)
            if level <= 2:
                if in_footprint and not found_block:
                    blocks.append(None)
                in_footprint = level == 2 and h.group(2).lower() == "footprint"
                found_block = False
                if in_footprint:
                    headings += 1
    if fence is not None and fence_is_yaml:
        blocks.append(None)  # an unclosed block is no block
    if in_footprint and not found_block:
        blocks.append(None)
    return title, blocks, headings


def _footprint_from_block(block: str | None) -> Footprint:
    if block is None:
        return Footprint(reason="invalid: ## Footprint heading without a fenced yaml block")
    try:
        data = yaml.safe_load(block)
    except yaml.YAMLError:
        return Footprint(reason="invalid: ## Footprint block is not valid YAML")
    if isinstance(data, Mapping) and "footprint" in data:
        if len(data) > 1:
            others = ", ".join(repr(str(k)) for k in data if k != "footprint")
            return Footprint(reason=f"invalid: unknown key {others} beside 'footprint'")
        data = data["footprint"]
    return footprint_from_mapping(data)


_STORY_PREFIX_RE = re.compile(r"^Story\s+[^\s:]+\s*:\s*", re.IGNORECASE)


def parse_story_text(text: str) -> StoryMeta:
    """Read a story file's title, footprint and scheduling metadata. Never raises on bad input."""
    front_text, body, errors = _split_front_matter(text)
    front: Mapping = {}
    front_invalid = None
    if front_text is not None:
        try:
            loaded = yaml.safe_load(front_text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 2})" if mark is not None else ""
            errors.append(f"front matter is not valid YAML{where}")
            front_invalid = "invalid: front matter is not valid YAML"
        else:
            if isinstance(loaded, Mapping):
                front = loaded
            elif loaded is not None:
                errors.append("front matter is not a mapping")
                front_invalid = "invalid: front matter is not a mapping"
    elif errors:
        front_invalid = "invalid: " + errors[0]
    heading, blocks, headings = _scan_body(body)

    # footprint
    if front_invalid is not None:
        footprint = Footprint(reason=front_invalid)
    elif "footprint" in front and (headings or blocks):
        footprint = Footprint(reason="invalid: footprint given twice (front matter and ## Footprint block)")
    elif "footprint" in front:
        footprint = footprint_from_mapping(front["footprint"])
    elif headings > 1 or len(blocks) > 1:
        footprint = Footprint(reason="invalid: footprint given twice (two ## Footprint blocks)")
    elif blocks:
        footprint = _footprint_from_block(blocks[0])
    else:
        footprint = Footprint(reason="missing")

    # the rest of the metadata
    title = None
    raw_title = front.get("title")
    if raw_title is not None:
        if isinstance(raw_title, str) and raw_title.strip():
            title = raw_title.strip()
        else:
            errors.append("'title' must be a non-empty string")
    if title is None and heading:
        title = _STORY_PREFIX_RE.sub("", heading).strip() or None

    depends_on: tuple[str, ...] = ()
    raw = front.get("depends_on")
    if raw is not None:
        if isinstance(raw, list) and all(isinstance(k, str) and k.strip() for k in raw):
            depends_on = tuple(k.strip() for k in raw)
        else:
            errors.append("'depends_on' must be a list of story keys")

    merge_class = front.get("merge_class")
    if merge_class is not None and merge_class not in _MERGE_CLASSES:
        errors.append(f"'merge_class' must be one of {', '.join(_MERGE_CLASSES)}, got {merge_class!r}")
        merge_class = None

    tier = front.get("tier")
    if tier is not None and not (isinstance(tier, str) and tier.strip()):
        errors.append(f"'tier' must be a non-empty string, got {tier!r}")
        tier = None

    done_checkpoint = front.get("done_checkpoint", False)
    if done_checkpoint is None:
        done_checkpoint = False
    if not isinstance(done_checkpoint, bool):
        errors.append(f"'done_checkpoint' must be true or false, got {done_checkpoint!r}")
        done_checkpoint = False

    return StoryMeta(
        title=title,
        footprint=footprint,
        depends_on=depends_on,
        merge_class=merge_class,
        tier=tier,
        done_checkpoint=done_checkpoint,
        errors=tuple(errors),
    )


# --- overlap ---


@lru_cache(maxsize=4096)
def _segments(pattern: str) -> tuple[str, ...]:
    """A pattern as anchored segments, `**` matching any number of them; ends with `**`."""
    p = pattern[:-1] if pattern.endswith("/") else pattern
    if p.startswith("/"):
        p = p[1:]
        anchored = True
    else:
        anchored = "/" in p
    parts = p.split("/")
    if not anchored:
        parts.insert(0, "**")
    parts.append("**")  # a matched directory covers everything under it
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


@lru_cache(maxsize=16384)
def globs_may_overlap(a: str, b: str) -> bool:
    """False only when no path can match both gitignore-style globs `a` and `b`."""
    sa, sb = _segments(a), _segments(b)
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


def path_matches(pattern: str, path: str) -> bool:
    """Does the gitignore-style `pattern` cover the file at repo-relative posix `path`?

    True when the pattern matches the path or one of its parent directories (a trailing `/` in
    the pattern matches directories only). The exact matcher, e.g. for footprint drift.
    """
    regex, dir_only = _path_regex(pattern)
    parts = path.strip("/").split("/")
    for k in range(1, len(parts) + 1):
        if dir_only and k == len(parts):
            break
        if regex.fullmatch("/".join(parts[:k])):
            return True
    return False


def footprints_conflict(a: Footprint, b: Footprint) -> str | None:
    """None if stories with footprints `a` and `b` may run in parallel, else a short reason.

    `files` conflict with the other's `files` and `shared`; `shared` never conflicts with
    `shared`; an exclusive footprint conflicts with everything. Resources are not conflicts
    (they are capacities, counted by the scheduler).
    """
    if a.exclusive:
        return f"exclusive footprint ({a.reason})"
    if b.exclusive:
        return f"exclusive footprint ({b.reason})"
    for pa in a.files:
        for pb in b.files + b.shared:
            if globs_may_overlap(pa, pb):
                return f"{pa} overlaps {pb}"
    for pb in b.files:
        for pa in a.shared:
            if globs_may_overlap(pb, pa):
                return f"{pb} overlaps {pa}"
    return None
