"""Story files: which folder holds them, which file is a story's, what it says about itself,
and its own status, rewritten in place.

**The story folder** (one per project), the first that applies:

1. the policy's `[stories] story_dir` (it must be inside the repository: planning refuses one
   outside);
2. the board's `story_location`. Relative, or absolute inside the repository (`{project-root}`
   substituted), it is used as it is. Absolute elsewhere, a Windows path
   (`C:\\Users\\x\\proj\\docs\\stories`), outside the repository, or the template's own
   `{story_location}`: the longest path suffix of it that is a folder of the committed target
   (`docs/stories`), with a warning; when no suffix is, a warning, and the steps below apply;
3. the story folder a BMAD config names (`dev_story_location`, `story_location`; older
   installs) or, for a v4 project, its `devStoryLocation`;
4. the board's own folder.

**A story's file** in that folder `F`, for a key `K` of epic `E` and number `S` (`1-12a-x`:
E `1`, S `12a`), every one of these names is looked for, in this order:

1. `F/K.md`                       BMAD v6
2. `F/stories/K.md`
3. `F/stories/epic-E/K.md`, `F/epic-E/K.md`
4. `F/spec-K.md`
5. `F/story-E.S.md`
6. `F/E.S.md`, then `F/E.S.<anything>.md` (v4-style names)

Exactly one match is the story's file; two are an error naming both (keep one). None: the story
has no file yet, and `StorySpec.story_path` is `F/K.md`, where the create phase writes it.
Keys outside the story grammar (extras) look only for names 1, 2 and 4.

Everything is read from a tree (`committed.CommittedTree`: the committed target), never from
the working copy, so the plan is what the agents will see; `uncommitted_plan_files` names the
working-copy changes that would make them differ.

**Metadata** (`parse_story_text`): title, status, footprint, depends_on, merge_class, tier,
done_checkpoint. A story file says these about itself in its YAML front matter; the footprint
may instead sit in a fenced ```yaml block under a `## Footprint` heading (holding either
`footprint:` or the three lists directly). A footprint given in both places, or twice, is
invalid (exclusive). Front-matter keys are read whatever their case and separator (`Title`,
`Depends_On`, `depends-on`, `Depends On` are `title`, `depends_on`); where two spellings of one
key are given, the lower-case one wins. `depends_on` is a list of keys or one string
(comma-separated); an annotation in parentheses is dropped (`"5-4-slug (done)"` is
`5-4-slug`). Short keys (`5-4`, `5.4`) are resolved against the board later
(`selection.resolve_dependency`). `parse_story_text` never raises on bad input: problems end up
in `StoryMeta.errors` or in the footprint's `reason`.

**The story's own status** (`read_story_status`, `set_story_status`), in one of the forms seen
in BMAD's templates and in projects that use them:

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

import os
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..errors import ConfigError
from ..git.trees.committed import FolderTree, TreeView, uncommitted
from .board import Board, BoardEntry
from .footprint import Footprint, footprint_from_mapping
from .locations import BoardSource, config_story_folder, repo_relative
from .selection import StorySpec

if TYPE_CHECKING:
    from ..git.runner import Git

__all__ = ["StoryFolder", "story_folder", "story_file_matches", "find_story_file",
           "load_stories", "uncommitted_plan_files", "resolve_location",
           "StoryMeta", "parse_story_text",
           "StoryStatus", "read_story_status", "set_story_status", "styled_like"]


# --- metadata: what a story file says about itself ---

_MERGE_CLASSES = ("self", "operator")


@dataclass(frozen=True)
class StoryMeta:
    """What a story file says about itself. `errors` are non-footprint metadata problems."""

    title: str | None
    status: str | None  # the front matter's `status`, as written (a `Status:` body line is not read here)
    footprint: Footprint
    depends_on: tuple[str, ...]
    merge_class: str | None
    tier: str | None
    done_checkpoint: bool
    errors: tuple[str, ...]


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
_KEY_SEPARATORS_RE = re.compile(r"[\s-]+")
_ANNOTATION_RE = re.compile(r"\s*\([^()]*\)\s*$")


def _normalised_keys(front: Mapping[Any, Any]) -> dict[str, Any]:
    """Front matter with its keys lower-cased and `-`/spaces made `_`; a key already written that
    way wins over another spelling of it."""
    out: dict[str, Any] = {}
    for key, value in front.items():
        if not isinstance(key, str):
            continue
        name = _KEY_SEPARATORS_RE.sub("_", key.strip()).lower()
        if name not in out or key == name:
            out[name] = value
    return out


def _dependency_list(raw: object) -> tuple[tuple[str, ...], str | None]:
    """(keys, error) of a `depends_on` value: a list of keys, or one comma-separated string."""
    if isinstance(raw, str):
        raw = raw.split(",")
    if not isinstance(raw, list):
        return (), "'depends_on' must be a list of story keys"
    keys = []
    for item in raw:
        # a float is a short key YAML read as a number (`5.4`); a whole number names no story
        if not isinstance(item, (str, float)):
            return (), "'depends_on' must be a list of story keys"
        key = _ANNOTATION_RE.sub("", str(item)).strip()  # `5-4-slug (done)`
        if not key:
            if isinstance(raw, list) and isinstance(item, str) and item.strip():
                return (), f"'depends_on' entry {item!r} names no story"
            continue
        keys.append(key)
    return tuple(dict.fromkeys(keys)), None


def parse_story_text(text: str) -> StoryMeta:
    """Read a story file's title, footprint and scheduling metadata. Never raises on bad input."""
    front_text, body, errors = _split_front_matter(text)
    front, front_invalid = _front_matter(front_text, errors)
    heading, blocks, headings = _scan_body(body)
    return StoryMeta(
        title=_title(front, heading, errors),
        status=_status(front),
        footprint=_footprint(front, front_invalid, blocks, headings),
        depends_on=_depends_on(front, errors),
        merge_class=_merge_class(front, errors),
        tier=_tier(front, errors),
        done_checkpoint=_done_checkpoint(front, errors),
        errors=tuple(errors),
    )


def _front_matter(front_text: str | None, errors: list[str]) -> tuple[Mapping, str | None]:
    """The front matter as a mapping with normalised keys, and why it is invalid (None: it is
    not). `errors` is what `_split_front_matter` found; what the YAML says is added to it."""
    if front_text is None:
        return {}, ("invalid: " + errors[0]) if errors else None
    try:
        loaded = yaml.safe_load(front_text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 2})" if mark is not None else ""
        errors.append(f"front matter is not valid YAML{where}")
        return {}, "invalid: front matter is not valid YAML"
    if isinstance(loaded, Mapping):
        return _normalised_keys(loaded), None
    if loaded is not None:
        errors.append("front matter is not a mapping")
        return {}, "invalid: front matter is not a mapping"
    return {}, None


def _footprint(front: Mapping, front_invalid: str | None, blocks: list, headings: int) -> Footprint:
    """From the front matter or the one ``## Footprint`` block; never both, never two."""
    if front_invalid is not None:
        return Footprint(reason=front_invalid)
    if "footprint" in front and (headings or blocks):
        return Footprint(reason="invalid: footprint given twice (front matter and ## Footprint block)")
    if "footprint" in front:
        return footprint_from_mapping(front["footprint"])
    if headings > 1 or len(blocks) > 1:
        return Footprint(reason="invalid: footprint given twice (two ## Footprint blocks)")
    if blocks:
        return _footprint_from_block(blocks[0])
    return Footprint(reason="missing")


def _title(front: Mapping, heading: str | None, errors: list[str]) -> str | None:
    """The front matter's title, else the first heading without its "Story N.M:" prefix."""
    raw = front.get("title")
    if raw is not None:
        if isinstance(raw, str) and raw.strip():
            return raw.strip()
        errors.append("'title' must be a non-empty string")
    if heading:
        return _STORY_PREFIX_RE.sub("", heading).strip() or None
    return None


def _depends_on(front: Mapping, errors: list[str]) -> tuple[str, ...]:
    raw = front.get("depends_on")
    if raw is None:
        return ()
    depends_on, problem = _dependency_list(raw)
    if problem:
        errors.append(problem)
    return depends_on


def _status(front: Mapping) -> str | None:
    status = front.get("status")
    return str(status).strip() or None if isinstance(status, (str, int, float)) else None


def _merge_class(front: Mapping, errors: list[str]) -> str | None:
    merge_class = front.get("merge_class")
    if merge_class is not None and merge_class not in _MERGE_CLASSES:
        errors.append(f"'merge_class' must be one of {', '.join(_MERGE_CLASSES)}, got {merge_class!r}")
        return None
    return merge_class


def _tier(front: Mapping, errors: list[str]) -> str | None:
    tier = front.get("tier")
    if tier is not None and not (isinstance(tier, str) and tier.strip()):
        errors.append(f"'tier' must be a non-empty string, got {tier!r}")
        return None
    return tier


def _done_checkpoint(front: Mapping, errors: list[str]) -> bool:
    done_checkpoint = front.get("done_checkpoint", False)
    if done_checkpoint is None:
        return False
    if not isinstance(done_checkpoint, bool):
        errors.append(f"'done_checkpoint' must be true or false, got {done_checkpoint!r}")
        return False
    return done_checkpoint


# --- the story's own status: find it, and rewrite only its value ---


@dataclass(frozen=True)
class StoryStatus:
    """The status value as written, and its span `text[start:end]` in the file's text."""

    value: str
    start: int
    end: int
    form: str  # "front-matter" | "line" | "section"


_STATUS_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_STATUS_HEADING_RE = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+|$)(.*)$")
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


def _lines(text: str, start: int = 0) -> Iterator[tuple[int, str]]:
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


def _front_matter_span(text: str) -> tuple[int, int] | None:
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
        m = _STATUS_FENCE_RE.match(line)
        if m is not None:
            fence = m.group(1)[0] * 3
            continue
        if section:
            if not line.strip():
                continue
            if _STATUS_HEADING_RE.match(line):
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
        heading = _STATUS_HEADING_RE.match(line)
        if heading is not None and len(heading.group(1)) >= 2:
            return None  # past the head: a `Status:` further down is not the story's
    return None


def read_story_status(text: str) -> StoryStatus | None:
    """The story's status as written in `text`, or None when the file states none."""
    front = _front_matter_span(text)
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


# --- the story folder, a story's file, and the stories of a board ---

_FOREIGN_RE = re.compile(r"^[A-Za-z]:[\\/]|\\")  # a Windows path: a drive, or backslashes
_NUMBER_RE = re.compile(r"^(\d+[a-z]?)(?:[-.]|$)")


@dataclass(frozen=True)
class StoryFolder:
    """The repository-relative story folder ("" = the root), why, and what to warn about."""

    rel: str | None  # None: a policy story_dir outside the repository (planning refuses it)
    path: Path
    reason: str
    warnings: tuple[str, ...] = ()


def resolve_location(raw: str, root: Path, tree: TreeView) -> tuple[str | None, str | None]:
    """A board's `story_location` as a repository-relative folder, and a warning when it had
    to be guessed (see the module docstring); (None, warning) when it resolves nowhere."""
    value = raw.strip().replace("{project-root}", str(root))
    if "{" not in value and not _FOREIGN_RE.search(value):
        path = value if os.path.isabs(value) else os.path.join(root, value)
        rel = os.path.relpath(os.path.normpath(path), root)
        if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            rel = Path(rel).as_posix()
            return ("" if rel == "." else rel), None
    parts = [p for p in re.split(r"[\\/]+", value)
             if p and p not in (".", "..") and "{" not in p and not re.fullmatch(r"[A-Za-z]:", p)]
    for i in range(len(parts)):
        suffix = "/".join(parts[i:])
        if tree.is_dir(suffix):
            return suffix, (f"story_location {raw!r} is not a folder of this repository; "
                            f"using {suffix}, the longest part of it that is")
    return None, (f"story_location {raw!r} names no folder of this repository; story files "
                  "are looked for in the default folder")


def story_folder(root: Path, tree: TreeView, board: Board, source: BoardSource, story_dir: str = "",
                 config_root: Path | None = None) -> StoryFolder:
    """The project's story folder (see the module docstring). `source` is the board's
    `locations.BoardSource`; BMAD configs are read under `config_root` (default `root`)."""
    root = Path(root)
    if story_dir.strip():
        value = story_dir.strip().replace("{project-root}", str(root))
        rel = repo_relative(value, root)
        path = root / rel if rel is not None else Path(value)
        return StoryFolder(rel, path, "policy [stories] story_dir")
    warnings = []
    if board.story_location and board.story_location.strip():
        rel, warning = resolve_location(board.story_location, root, tree)
        warnings += [f"{board.path}: {warning}"] if warning else []
        if rel is not None:
            return StoryFolder(rel, root / rel, "the board's story_location", tuple(warnings))
    if source.story_folder is not None:
        return StoryFolder(source.story_folder, root / source.story_folder,
                           f"{source.config}", tuple(warnings))
    named = config_story_folder(root, Path(config_root or root)) if source.format == "v6" else None
    if named is not None:
        return StoryFolder(named[1], root / named[1], f"{named[0]}", tuple(warnings))
    rel = posixpath.dirname(source.rel) if source.rel else None
    path = root / rel if rel is not None else Path(board.path).parent
    return StoryFolder(rel, path, "beside the board", tuple(warnings))


def _epic_and_number(entry: BoardEntry) -> tuple[str | None, str | None]:
    epic = entry.epic
    if entry.kind == "extra" or not epic or not entry.key.startswith(epic):
        return None, None
    m = _NUMBER_RE.match(entry.key[len(epic) + 1:])
    return (epic, m.group(1)) if m and entry.key[len(epic)] in "-." else (None, None)


def story_file_matches(tree: TreeView, folder: str, entry: BoardEntry) -> list[str]:
    """Every file of `tree` in `folder` that could be `entry`'s story file, in search order."""
    key = entry.key
    epic, number = _epic_and_number(entry)
    names = [f"{key}.md", f"stories/{key}.md"]
    if epic:
        names += [f"stories/epic-{epic}/{key}.md", f"epic-{epic}/{key}.md"]
    names.append(f"spec-{key}.md")
    if epic and number:
        names += [f"story-{epic}.{number}.md", f"{epic}.{number}.md"]
    found = [rel for rel in (posixpath.join(folder, n) for n in names) if tree.is_file(rel)]
    if epic and number:
        prefix = f"{epic}.{number}."
        found += [posixpath.join(folder, n) for n in tree.names(folder)
                  if n.startswith(prefix) and n.endswith(".md")]
    return list(dict.fromkeys(found))


def find_story_file(tree: TreeView, folder: str, entry: BoardEntry, root: Path) -> str | None:
    """`entry`'s story file (repository-relative), None when it has none; two matches are a
    ConfigError naming both."""
    found = story_file_matches(tree, folder, entry)
    if len(found) > 1:
        raise ConfigError(f"story {entry.key}: {len(found)} story files match it: "
                          f"{' and '.join(str(Path(root) / f) for f in found)}; keep one")
    return found[0] if found else None


def _title_from_entry(entry: BoardEntry) -> str:
    words = (entry.slug or entry.key).replace("-", " ").replace("_", " ").strip()
    return words[:1].upper() + words[1:] if words else entry.key


def _folder_rel(project_dir: Path, story_dir: Path | str) -> str | None:
    if isinstance(story_dir, str) and not os.path.isabs(story_dir):
        rel = posixpath.normpath(story_dir) if story_dir else ""
        return "" if rel == "." else rel
    return repo_relative(os.path.abspath(story_dir), Path(os.path.abspath(project_dir)))


def load_stories(
    project_dir: Path,
    board: Board,
    story_dir: Path | str,
    overrides: Mapping[str, Mapping] | None = None,
    *,
    tree: TreeView | None = None,
    problems: list[str] | None = None,
) -> list[StorySpec]:
    """Every story of the board, in file order, with its story file's metadata.

    `story_dir` is the story folder (a path, or repository-relative); `tree` where files are
    read (default: the folder on disk). A policy override (`overrides[key]`, a `{files,
    shared, resources}` mapping) replaces the story's own footprint. The story file's own path
    is always added to `footprint.files`. A metadata error in a story file is a ConfigError
    naming the file; given a `problems` list, each one is appended there instead (one line,
    naming the file) and the story read as if it had no metadata, its footprint invalid, so
    `validate` reports every problem in one pass.
    """
    project_dir = Path(project_dir)
    tree = tree if tree is not None else FolderTree(project_dir)
    folder = _folder_rel(project_dir, story_dir)
    overrides = overrides or {}
    entries = board.stories()
    found = {e.key: _story_file_or_problem(tree, folder, e, project_dir, problems)
             for e in entries}
    texts = tree.read_many([rel for rel in found.values() if rel])
    specs: list[StorySpec] = []
    for position, entry in enumerate(entries):
        rel = found[entry.key]
        story_path = rel or (posixpath.join(folder, f"{entry.key}.md") if folder is not None else None)
        story_file = project_dir / rel if rel else None
        meta, failed = _story_meta(project_dir / rel, texts[rel], problems) if rel else (None, False)
        footprint = meta.footprint if meta else \
            Footprint(reason="invalid: the story file's metadata" if failed else "missing")
        if entry.key in overrides:
            footprint = footprint_from_mapping(overrides[entry.key])
        if story_path is not None:
            # anchor it: a bare file name would otherwise match at any depth
            footprint = footprint.with_files(story_path if "/" in story_path else "/" + story_path)
        specs.append(StorySpec(
            key=entry.key, epic=entry.epic or "", status=entry.status,
            title=(meta.title if meta else None) or _title_from_entry(entry),
            story_file=story_file, story_path=story_path, footprint=footprint,
            depends_on=meta.depends_on if meta else (),
            merge_class=meta.merge_class if meta else None, tier=meta.tier if meta else None,
            done_checkpoint=meta.done_checkpoint if meta else False, position=position,
        ))
    return specs


def _story_file_or_problem(tree: TreeView, folder: str | None, entry: BoardEntry, root: Path,
                           problems: list[str] | None) -> str | None:
    if folder is None:
        return None
    try:
        return find_story_file(tree, folder, entry, root)
    except ConfigError as exc:
        if problems is None:
            raise
        problems.append(str(exc))
        # Checked on as its first match: the later checks should not call it missing.
        return story_file_matches(tree, folder, entry)[0]


def _story_meta(story_file: Path, data: bytes,
                problems: list[str] | None) -> tuple[StoryMeta | None, bool]:
    """(metadata or None, whether it was refused): a ConfigError naming the file, or without
    `problems` to collect them, one line per problem appended there."""
    try:
        meta = parse_story_text(data.decode("utf-8"))
        errors = list(meta.errors)
    except UnicodeDecodeError:
        meta, errors = None, ["story file is not UTF-8 text"]
    if not errors:
        return meta, False
    if problems is None:
        raise ConfigError(f"{story_file}: {'; '.join(errors)}")
    problems.extend(f"{story_file}: {error}" for error in errors)
    return None, True


class _PathSet(TreeView):
    """A tree of the given paths only (what `git status` reported)."""

    def __init__(self, paths: Iterable[str]) -> None:
        super().__init__()
        for path in paths:
            self._add(path, path)


def uncommitted_plan_files(git: Git, board_rel: str | None, folder: str | None, board: Board,
                           chosen: Sequence[StorySpec]) -> list[str]:
    """The working-copy changes the plan would not see: to the board, or where a chosen
    story's file is or would be found (modified, staged, deleted, untracked), as
    `path (what)`."""
    changes = dict((path, what) for what, path in uncommitted(git, [board_rel, folder]))
    if not changes:
        return []
    relevant: set[str | None] = {board_rel} if board_rel else set()
    dirty = _PathSet(changes)
    for spec in chosen:
        relevant.add(spec.story_path)
        entry = board.entry(spec.key)
        if entry is not None and folder is not None:
            relevant.update(story_file_matches(dirty, folder, entry))
    return [f"{path} ({changes[path]})" for path in changes if path in relevant]
