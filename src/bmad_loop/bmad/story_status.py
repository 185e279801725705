"""A story file's own status: find it, and rewrite only its value.

BMAD story files say where they stand in one of these forms (every one seen in BMAD's templates
and in projects that use them):

- YAML front matter: a top-level `status:` (or `Status:`) key, plain or quoted;
- a status line in the file's head: `Status: ready-for-dev` (v6 create-story), `Status : x`,
  `**Status:** x`, `**Status**: x`, `- Status: x`, `## Status: Draft` (v4 brownfield);
- a status section (v4 `story-tmpl.yaml`): a `## Status` heading, the value on the next
  non-blank line (`Draft`, `Approved`, `InProgress`, `Review`, `Done`, `Ready for Review`...).

Front matter wins when it has the key. Otherwise only the file's *head* is searched: from the top
to the first heading (level 2 or deeper) that is not the status heading itself, outside fenced
code and HTML comments — so a `Status:` line in the Dev Notes is never taken for the story's.

The value is the rest of its line without trailing spaces, an HTML comment, a YAML `# comment`,
quotes or Markdown emphasis around it. `set_story_status` replaces exactly that span, so line
endings (CRLF), a BOM, decorations around the value and every other line survive untouched; it
never inserts a status where the file has none (the text comes back unchanged).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["StoryStatus", "read_story_status", "set_story_status", "styled_like"]


@dataclass(frozen=True)
class StoryStatus:
    """The status value as written, and its span `text[start:end]` in the file's text."""

    value: str
    start: int
    end: int
    form: str  # "front-matter" | "line" | "section"


_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING_RE = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+|$)(.*)$")
# `Status: x`, `**Status:** x`, `**Status**: x`, `- Status : x`, `## Status: x`, `Status:` alone.
_LINE_RE = re.compile(
    r"^ {0,3}(?:#{1,6}[ \t]+)?(?:[-*+][ \t]+)?(?:\*\*|__|\*|_)?status(?:\*\*|__|\*|_)?[ \t]*:"
    r"(?:\*\*|__|\*|_)?[ \t]*",
    re.IGNORECASE,
)
_SECTION_RE = re.compile(r"^ {0,3}#{1,6}[ \t]+(?:\*\*|__)?status(?:\*\*|__)?[ \t]*:?[ \t]*#*[ \t]*$",
                         re.IGNORECASE)
_FRONT_KEY_RE = re.compile(r"^status[ \t]*:[ \t]*", re.IGNORECASE)
_MARKS = ("**", "__", "*", "_", "`")


def _lines(text: str, start: int = 0):
    """(offset of the line, the line without its end-of-line characters), from `start`."""
    # Only "\n" ends a line here (str.splitlines would also split on form feeds and the
    # like, which a Markdown file may hold inside a line).
    for m in re.finditer(r"[^\n]*\n|[^\n]+$", text[start:]):
        yield start + m.start(), m.group(0).rstrip("\r\n")


def _trim(text: str, start: int, end: int, *, yaml_comment: bool = False) -> tuple[int, int]:
    """Narrow [start, end) to the value: no spaces, trailing HTML or YAML comment, emphasis."""
    segment = text[start:end]
    comment = segment.find("<!--")
    if comment >= 0:
        end = start + comment
    if yaml_comment:
        hash_at = re.search(r"(^|[ \t])#", text[start:end])
        if hash_at is not None:
            end = start + hash_at.start()
    while start < end and text[start] in " \t":
        start += 1
    while end > start and text[end - 1] in " \t":
        end -= 1
    for mark in _MARKS:  # `**Done**`, `` `done` ``: the marks stay, the value is inside
        n = len(mark)
        if end - start > 2 * n and text.startswith(mark, start) and text.endswith(mark, 0, end):
            start, end = start + n, end - n
            break
    return start, end


def _unquote(text: str, start: int, end: int) -> tuple[int, int]:
    if end - start >= 2 and text[start] == text[end - 1] and text[start] in "'\"":
        return start + 1, end - 1
    return start, end


def _front_matter(text: str) -> tuple[int, int] | None:
    """Offsets of the front matter's body (between the `---` lines), or None when there is none."""
    lines = list(_lines(text))
    if not lines or lines[0][1].lstrip("\ufeff").rstrip() != "---":
        return None
    for offset, line in lines[1:]:
        if line.rstrip() in ("---", "..."):
            return lines[1][0] if len(lines) > 1 else offset, offset
    return None


def _in_front_matter(text: str, body: tuple[int, int]) -> StoryStatus | None:
    for offset, line in _lines(text[: body[1]], body[0]):
        m = _FRONT_KEY_RE.match(line)
        if m is None:
            continue
        start, end = _trim(text, offset + m.end(), offset + len(line), yaml_comment=True)
        start, end = _unquote(text, start, end)
        if end > start:
            return StoryStatus(text[start:end], start, end, "front-matter")
        return None
    return None


def _in_head(text: str, start: int) -> StoryStatus | None:
    fence = None
    in_comment = False
    section = False
    for offset, line in _lines(text, start):
        if fence is not None:
            if line.lstrip().startswith(fence):
                fence = None
            continue
        if in_comment:
            in_comment = "-->" not in line
            continue
        if line.lstrip().startswith("<!--"):
            in_comment = "-->" not in line
            continue
        m = _FENCE_RE.match(line)
        if m is not None:
            fence = m.group(1)[0] * 3
            continue
        if section:
            if not line.strip():
                continue
            if _HEADING_RE.match(line):
                return None  # an empty status section
            first = offset + len(line) - len(line.lstrip())
            bullet = re.match(r"[-*+][ \t]+", line.lstrip())
            if bullet:
                first += bullet.end()
            s, e = _trim(text, first, offset + len(line))
            return StoryStatus(text[s:e], s, e, "section") if e > s else None
        if _SECTION_RE.match(line):
            section = True
            continue
        m = _LINE_RE.match(line)
        if m is not None and line[m.end():].strip():
            s, e = _trim(text, offset + m.end(), offset + len(line))
            if e > s:
                return StoryStatus(text[s:e], s, e, "line")
        heading = _HEADING_RE.match(line)
        if heading is not None and len(heading.group(1)) >= 2:
            return None  # past the head: a `Status:` further down is not the story's
    return None


def read_story_status(text: str) -> StoryStatus | None:
    """The story's status as written in `text`, or None when the file states none."""
    front = _front_matter(text)
    if front is not None:
        found = _in_front_matter(text, front)
        if found is not None:
            return found
        body = text.find("\n", front[1])
        return _in_head(text, body + 1) if body >= 0 else None
    return _in_head(text, 0)


def styled_like(old: str, value: str) -> str:
    """`value` in the case style of `old`: `ready-for-dev` → `done`, `Approved` → `Done`,
    `Ready for Review` → `Done`, `DONE` stays upper."""
    letters = [c for c in old if c.isalpha()]
    if not letters:
        return value
    if all(c.isupper() for c in letters) and len(letters) > 1:
        return value.upper()
    if letters[0].isupper():
        return re.sub(r"[A-Za-z]+", lambda m: m.group(0).capitalize(), value.lower())
    return value.lower()


def set_story_status(text: str, value: str) -> str:
    """`text` with its status value replaced by `value` (in the old value's case style); the text
    unchanged when it states no status, or already says so."""
    found = read_story_status(text)
    if found is None:
        return text
    new = styled_like(found.value, value)
    if new == found.value:
        return text
    return text[: found.start] + new + text[found.end:]
