"""Story-file metadata: title, status, footprint, depends_on, merge_class, tier, done_checkpoint.

A story file says these about itself in its YAML front matter; the footprint may instead sit in
a fenced ```yaml block under a `## Footprint` heading (holding either `footprint:` or the three
lists directly). A footprint given in both places, or twice, is invalid (exclusive).

Front-matter keys are read whatever their case and separator (`Title`, `Depends_On`,
`depends-on`, `Depends On` are `title`, `depends_on`); where two spellings of one key are
given, the lower-case one wins. `depends_on` is a list of keys or one string (comma-separated);
an annotation in parentheses is dropped (`"5-4-slug (done)"` is `5-4-slug`). Short keys (`5-4`,
`5.4`) are resolved against the board later (`selection.resolve_dependency`).
`parse_story_text` never raises on bad input: problems end up in `StoryMeta.errors` or in the
footprint's `reason`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from .footprint import Footprint, footprint_from_mapping

__all__ = ["StoryMeta", "parse_story_text"]

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


def _normalised_keys(front: Mapping) -> dict:
    """Front matter with its keys lower-cased and `-`/spaces made `_`; a key already written that
    way wins over another spelling of it."""
    out: dict = {}
    for key, value in front.items():
        if not isinstance(key, str):
            continue
        name = _KEY_SEPARATORS_RE.sub("_", key.strip()).lower()
        if name not in out or key == name:
            out[name] = value
    return out


def _dependency_list(raw) -> tuple[tuple[str, ...], str | None]:
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
