"""The BMAD sprint board, `sprint-status.yaml`: its keys and statuses, read fast, edited one
status token at a time.

The board is a YAML file with a `development_status:` mapping whose file order is the plan order.
Other top-level keys (`story_location`, `last_updated`, `notes:`, `action_items: []`, ...) are
allowed; only `story_location` is read. Keys of `development_status` follow one grammar, where an
epic id `<E>` is letters and digits, possibly in hyphen-joined parts (`1`, `r`, `3-5`):

- `epic-<E>`                       an epic (`kind="epic"`) with id `<E>`
- `epic-<E>-retrospective`         a retrospective (`kind="retrospective"`), never a story
- `epic-<E>-retro-item-M-slug`     a retrospective action item (`kind="retro-item"`), never a story
- `<E>-S-slug`, `<E>-Sa-slug`      a story of epic `<E>` (`kind="story"`), S a number; a one-letter
                                   lower-case suffix marks one half of a split story. `<E>` is the
                                   longest epic id declared on the board that starts the key and
                                   leaves a valid `S-slug` (`3-5-1-x` is in `3-5` when `epic-3-5`
                                   is declared); with none, the leading number (`1-2-x` is in `1`)
- anything else                    `kind="extra"` (`hotfix-login`): reported by `validate` and
                                   run only with `[stories] extra_keys = "run"`; its epic is the
                                   one of the nearest `epic-<E>` line above it (None above all)

**Statuses.** BMAD boards are edited by people and by agents, so a status is not always the bare
token: `Done`, `done  `, `done ✅ (merged)`, `In Progress`, `ready_for_dev`. The reading rule
(`read_status`):

1. Take the leading phrase of the value: words of letters and digits joined by `-`, `_` or
   spaces (`done ✅ (merged)` → `done`; `In Progress (since Monday)` → `In Progress`).
2. Lower-case it and join its words with `-` (`in-progress`). The longest run of its leading
   words that is a status bmad-loop knows is the status (`ready for dev now` → `ready-for-dev`).
3. Otherwise the status is the first word, hyphens kept (`wont-do`, `on-hold`): a status
   bmad-loop does not know. Such an entry is never run and `validate` lists it as a warning.

An inline YAML comment (`backlog # later`) is not part of the value at all. `BoardEntry.status`
is the canonical token and `BoardEntry.written` the value as written; an unknown status is never
an error: the entry is not run, and `Board.warnings()` names it for `validate`.

**Keys.** A story key becomes a branch name and a worktree folder, so a key whose slug could
escape the worktree root (`/`, `\\`, `..`) or that git refuses in a branch name is bad input
(`ConfigError`). The git rules are git's own `check-ref-format --branch` rules, in pure Python in
`git/runner.py` (`branch_name_ok`, `branch_name_problem`): no git process per name.

**Reading.** A board can hold tens of thousands of keys (13 MB has been seen), and the lane reads
the target's board on every tick. Building a node graph with PyYAML's pure-Python loader took
about 15 s for 11 MB; so `read_board_yaml` walks the *events* of libyaml's C parser
(`yaml.CSafeLoader`, when PyYAML was built with it; the pure-Python parser otherwise), keeps only
the pairs of the top-level `development_status` mapping and the top-level `story_location`, and
resolves the tags of the values only (memoised: a board has a handful of distinct statuses). The
same 11 MB board reads in well under a second. It reads what `yaml.compose` would: a document
that uses anchors or aliases (where an event is not the whole story) is composed as nodes
instead, with the same result. Positions are line numbers and character offsets into the text
(`Scalar.start`/`end`); libyaml does not count a leading byte-order mark, so its offsets are
moved on by one here.

**Editing.** `set_status` changes only the status token of one line, so comments, decorations,
quoting, spacing and order survive byte for byte. The lane marks one story done (and sometimes
its epic) at every integration and reads that board back after it; `set_statuses` finds a
story's line from the line number its entry already has when the line is the plain
``key: value`` it expects (the value as the parser read it, unquoted, after the key at the
line's start), and then also knows the new Board (`remember_board`), so the next `parse_board`
of that text is free. Anything else (quotes, a flow mapping, a value that is not where the entry
says) goes through `set_status`, which reads the YAML itself. Either way the text is the same.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Collection, Iterator, NamedTuple

import yaml
from yaml.events import (AliasEvent, CollectionStartEvent, DocumentStartEvent, Event,
                         MappingEndEvent, MappingStartEvent, ScalarEvent, SequenceEndEvent,
                         StreamEndEvent)
from yaml.nodes import MappingNode, Node, ScalarNode

from ..caches import CACHES
from ..errors import ConfigError
from ..git.runner import branch_name_ok, branch_name_problem  # re-exported
from ..caches import CACHES
from ..policy.validate import did_you_mean

__all__ = [
    "ACTIONABLE",
    "STORY_STATUSES",
    "EPIC_STATUSES",
    "EPIC_STARTED",
    "RETRO_STATUSES",
    "RETRO_ITEM_STATUSES",
    "KNOWN_BY_KIND",
    "DONE",
    "StatusReading",
    "read_status",
    "is_known",
    "BoardYaml",
    "Scalar",
    "read_board_yaml",
    "LOADER",
    "STORY_KEY_RE",
    "BoardEntry",
    "Board",
    "parse_board",
    "remember_board",
    "load_board",
    "set_status",
    "set_statuses",
    "validate_story_key",
    "parse_story_key",
    "branch_name_problem",
    "branch_name_ok",
]


# --- the status vocabulary, and how a status is read as people write it ---

DONE = "done"
# Story statuses in their order. `drafted` is what older boards call `ready-for-dev`.
STORY_STATUSES = ("backlog", "drafted", "ready-for-dev", "in-progress", "review", DONE)
ACTIONABLE = ("backlog", "ready-for-dev", "drafted")
# `contexted` is what older v6 boards call an epic whose technical context was written: it has
# started, like `in-progress`.
EPIC_STATUSES = ("backlog", "contexted", "in-progress", DONE)
EPIC_STARTED = ("in-progress", "contexted")
# `optional` until held; older boards say `completed` for a held one.
RETRO_STATUSES = ("optional", "completed", DONE)
# Retrospective action items: `open` in BMAD's own vocabulary, or a story status.
RETRO_ITEM_STATUSES = ("open",) + STORY_STATUSES

KNOWN_BY_KIND: dict[str, tuple[str, ...]] = {
    "story": STORY_STATUSES,
    "extra": STORY_STATUSES,
    "epic": EPIC_STATUSES,
    "retrospective": RETRO_STATUSES,
    "retro-item": RETRO_ITEM_STATUSES,
}
_ALL_KNOWN = frozenset(s for statuses in KNOWN_BY_KIND.values() for s in statuses)

_PHRASE_RE = re.compile(r"[A-Za-z0-9]+(?:[ _-]+[A-Za-z0-9]+)*")
_WORD_RE = re.compile(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*")
_SEPARATORS_RE = re.compile(r"[ _-]+")


class StatusReading(NamedTuple):
    """`status`: the canonical token; `start`/`end`: where it is written inside the value."""

    status: str
    start: int
    end: int


def read_status(value: str) -> StatusReading:
    """The canonical status of a board value as written (see the module's rule)."""
    lead = len(value) - len(value.lstrip())
    phrase = _PHRASE_RE.match(value, lead)
    if phrase is None:  # nothing word-like: the whole value is an (unknown) status
        text = value.strip()
        return StatusReading(text.lower(), lead, lead + len(text))
    # word boundaries inside the phrase, longest run of leading words first
    ends = [m.start() for m in _SEPARATORS_RE.finditer(value, phrase.start(), phrase.end())]
    for end in sorted(ends + [phrase.end()], reverse=True):
        token = _SEPARATORS_RE.sub("-", value[lead:end]).lower()
        if token in _ALL_KNOWN:
            return StatusReading(token, lead, end)
    word = _WORD_RE.match(value, lead)
    assert word is not None  # the phrase found there starts with a word
    return StatusReading(word.group().lower(), lead, word.end())


def is_known(kind: str, status: str) -> bool:
    """Does bmad-loop know `status` for an entry of this kind?"""
    return status in KNOWN_BY_KIND.get(kind, ())


# --- the YAML: the `development_status` pairs, read from the event stream ---

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_BOM = "\ufeff"


class Scalar(NamedTuple):  # a tuple: a board makes two per key, and tuples are cheap
    """A key or value: a scalar (`value`, resolved `tag`, `style`), or (`scalar` False) a mapping
    or sequence, of which only the position is kept. `start`/`end` are offsets into the text."""

    scalar: bool
    value: str
    tag: str | None
    style: str | None
    line: int  # 1-based
    start: int
    end: int


@dataclass(frozen=True)
class BoardYaml:
    root_is_mapping: bool
    # The first top-level `development_status`: None when there is none; `status_is_mapping`
    # False when its value is not a mapping (then `pairs` is empty).
    status: Scalar | None
    status_is_mapping: bool
    pairs: tuple[tuple[Scalar, Scalar], ...]
    story_location: Scalar | None  # the first top-level `story_location` value, if any


class _NeedsNodes(Exception):
    """An anchor or alias: the events alone do not say what a value is."""


def yaml_error(exc: yaml.YAMLError, path: Path) -> ConfigError:
    where = ""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        where = f" (line {mark.line + 1})"
    problem = getattr(exc, "problem", None) or type(exc).__name__
    return ConfigError(f"{path}: invalid YAML{where}: {problem}")


def read_board_yaml(text: str, path: Path, loader: type | None = None) -> BoardYaml:
    """The board's YAML as `BoardYaml`; invalid YAML is one `ConfigError` line with its line.
    `loader`: a PyYAML loader class to use instead of the fastest one there is."""
    loader = loader or LOADER
    offset = 1 if text.startswith(_BOM) and loader is not yaml.SafeLoader else 0
    try:
        try:
            return _Walk(text, offset, loader).board()
        except _NeedsNodes:
            return _from_nodes(yaml.compose(text, Loader=loader), offset)
    except yaml.YAMLError as exc:
        raise yaml_error(exc, path) from None


class _Walk:
    def __init__(self, text: str, offset: int, loader: type):
        self.events = iter(yaml.parse(text, Loader=loader))
        self.offset = offset
        self.resolver = yaml.resolver.Resolver()
        self.tags: dict[tuple[str, tuple[bool, bool]], str] = {}

    def next(self) -> Event:
        event = next(self.events)
        if isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _NeedsNodes
        return event

    def item(self, event: Event, *, resolve: bool) -> Scalar:
        start, end = event.start_mark.index + self.offset, event.end_mark.index + self.offset
        line = event.start_mark.line + 1
        if not isinstance(event, ScalarEvent):
            self.skip(event)
            return Scalar(False, "", None, None, line, start, end)
        tag = event.tag
        if resolve and (tag is None or tag == "!"):
            key = (event.value, event.implicit)
            tag = self.tags.get(key)
            if tag is None:
                tag = self.tags[key] = self.resolver.resolve(ScalarNode, event.value, event.implicit)
        return Scalar(True, event.value, tag, event.style or None, line, start, end)

    def skip(self, event: Event) -> None:
        """Consume the rest of the collection `event` opened (nothing for a scalar)."""
        depth = 1 if isinstance(event, CollectionStartEvent) else 0
        while depth:
            event = self.next()
            if isinstance(event, CollectionStartEvent):
                depth += 1
            elif isinstance(event, (MappingEndEvent, SequenceEndEvent)):
                depth -= 1

    def mapping(self) -> Iterator[tuple[Scalar, Event]]:
        """(key, value event) pairs of the mapping whose start was just read; a key that is a
        collection is read to its end before its value's event is."""
        while not isinstance(event := self.next(), MappingEndEvent):
            key = self.item(event, resolve=False)
            yield key, self.next()

    def board(self) -> BoardYaml:
        self.next()  # StreamStart
        event = self.next()
        if isinstance(event, StreamEndEvent):  # an empty file: no document, like compose's None
            return BoardYaml(False, None, False, (), None)
        root = self.next()  # after DocumentStart
        status = location = None
        status_is_mapping, pairs = False, []
        if isinstance(root, MappingStartEvent):
            for key, value_event in self.mapping():
                if key.scalar and key.value == "development_status" and status is None:
                    status = key
                    status_is_mapping = isinstance(value_event, MappingStartEvent)
                    if status_is_mapping:
                        pairs = [(k, self.item(v, resolve=True)) for k, v in self.mapping()]
                    else:
                        self.skip(value_event)
                elif key.scalar and key.value == "story_location" and location is None:
                    location = self.item(value_event, resolve=True)
                else:
                    self.skip(value_event)
        else:
            self.skip(root)
        self.next()  # DocumentEnd
        event = self.next()
        if isinstance(event, DocumentStartEvent):
            raise yaml.composer.ComposerError("expected a single document in the stream", None,
                                              "but found another document", event.start_mark)
        return BoardYaml(isinstance(root, MappingStartEvent), status, status_is_mapping,
                         tuple(pairs), location)


def _node_item(node: Node, offset: int) -> Scalar:
    start, end = node.start_mark.index + offset, node.end_mark.index + offset
    if isinstance(node, ScalarNode):
        return Scalar(True, node.value, node.tag, node.style or None, node.start_mark.line + 1,
                      start, end)
    return Scalar(False, "", None, None, node.start_mark.line + 1, start, end)


def _from_nodes(root: Node | None, offset: int) -> BoardYaml:
    """The same reading from a composed node graph (documents with anchors or aliases)."""
    if not isinstance(root, MappingNode):
        return BoardYaml(False, None, False, (), None)
    status = location = None
    status_is_mapping, pairs = False, []
    for knode, vnode in root.value:
        if not isinstance(knode, ScalarNode):
            continue
        if knode.value == "development_status" and status is None:
            status = _node_item(knode, offset)
            status_is_mapping = isinstance(vnode, MappingNode)
            if status_is_mapping:
                pairs = [(_node_item(k, offset), _node_item(v, offset)) for k, v in vnode.value]
        elif knode.value == "story_location" and location is None:
            location = _node_item(vnode, offset)
    return BoardYaml(True, status, status_is_mapping, tuple(pairs), location)


# --- entries, keys and the parsed board ---

STORY_KEY_RE = re.compile(r"^(\d+)-(\d+)([a-z])?-(.+)$", re.DOTALL)  # a story of an undeclared epic
_EPIC_ID = r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*"
_EPIC_RE = re.compile(rf"^epic-({_EPIC_ID})$")
_RETRO_RE = re.compile(rf"^epic-({_EPIC_ID})-retrospective$")
_RETRO_ITEM_RE = re.compile(rf"^epic-({_EPIC_ID})-retro-item-(\d+)-(.+)$", re.DOTALL)
_STORY_REST_RE = re.compile(r"(\d+)([a-z])?-(.+)$", re.DOTALL)  # what follows `<E>-`
_STATUS_TOKEN_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")

StoryParts = tuple[str, int, str, str]  # (epic, story number, split suffix, slug)

_STR_TAG = "tag:yaml.org,2002:str"
_NULL_TAG = "tag:yaml.org,2002:null"

EXTRA_KEYS_MODES = ("ignore", "run")


@dataclass(frozen=True)
class BoardEntry:
    """One key of `development_status`: its canonical status, kind, epic id and 1-based line.

    `written` is the status as written (`done ✅ (merged)`); `known` says whether bmad-loop knows
    the status for this kind of entry. `number`, `split` and `slug` are a story key's parts.
    """

    key: str
    status: str
    kind: str  # "epic" | "story" | "retrospective" | "retro-item" | "extra"
    epic: str | None
    line: int
    written: str = ""
    known: bool = True
    number: int | None = None
    split: str = ""
    slug: str = ""


@dataclass(frozen=True)
class Board:
    """A parsed board. `story_location` is the raw top-level value (placeholders unresolved).

    `format` is "v6" for a `sprint-status.yaml`, "v4" for a board built from v4 story files.
    `extra_keys` is the policy's `[stories] extra_keys`: with "run", `stories()` includes the
    keys outside the story grammar (set it with `with_extra_keys`).
    """

    path: Path
    entries: tuple[BoardEntry, ...]
    story_location: str | None
    format: str = "v6"
    extra_keys: str = "ignore"

    def stories(self) -> list[BoardEntry]:
        """The entries bmad-loop may run, whatever their status, in file order."""
        kinds = ("story", "extra") if self.extra_keys == "run" else ("story",)
        return [e for e in self.entries if e.kind in kinds]

    def extras(self) -> list[BoardEntry]:
        """Keys that are neither epics, retrospectives, retro items nor stories."""
        return [e for e in self.entries if e.kind == "extra"]

    def epics(self) -> list[str]:
        """The epic ids declared by `epic-<E>` lines, in file order."""
        return [e.epic for e in self.entries if e.kind == "epic" and e.epic is not None]

    def epic_status(self, epic: str | int) -> str | None:
        entry = self.entry(f"epic-{epic}")
        return entry.status if entry is not None else None

    def entry(self, key: str) -> BoardEntry | None:
        for e in self.entries:
            if e.key == key:
                return e
        return None

    def unknown_statuses(self) -> list[tuple[BoardEntry, str]]:
        """(entry, status as written) of every entry whose status bmad-loop does not know."""
        return [(e, e.written) for e in self.entries if not e.known]

    def warnings(self) -> list[str]:
        """One line per entry `validate` should warn about, in file order: a status bmad-loop
        does not know, a key outside the grammar that is not run."""
        found = [(e.line, f"{e.kind} {_q(e.key)} has status {_q(written or '(empty)')}, which "
                  "bmad-loop does not know; it is not run"
                  + did_you_mean(e.status, KNOWN_BY_KIND.get(e.kind, ()), _STATUS_CUTOFF))
                 for e, written in self.unknown_statuses()
                 if e.kind != "extra" or self.extra_keys == "run"]
        if self.extra_keys != "run":
            found += [(e.line, f"key {_q(e.key)} is not an epic, retrospective or story key; it is "
                       "not run ([stories] extra_keys = \"ignore\")") for e in self.extras()]
        return [f"{self.path}: line {line}: {text}" for line, text in sorted(found)]

    def with_extra_keys(self, mode: str) -> Board:
        """This board under `[stories] extra_keys = mode`; with "run", every extra key must be
        safe as a branch name (ConfigError naming the board and the key)."""
        if mode not in EXTRA_KEYS_MODES:
            raise ValueError(f"extra_keys must be one of {EXTRA_KEYS_MODES}, got {mode!r}")
        if mode == "run":
            for e in self.extras():
                validate_story_key(e.key, self.path)
        return replace(self, extra_keys=mode)


def parse_story_key(key: str, epics: Collection[str] = ()) -> StoryParts | None:
    """`(epic, story, split_suffix, slug)` of a story key, or None if `key` is not a story key.

    `epics`: the epic ids declared on the board; the longest one that starts the key and leaves
    a valid `S-slug` wins. Without one, the key's leading number is its epic.
    """
    declared = epics if isinstance(epics, (set, frozenset, dict)) else set(epics)
    if declared:
        dash = len(key)
        while (dash := key.rfind("-", 0, dash)) > 0:
            if key[:dash] in declared and (m := _STORY_REST_RE.match(key, dash + 1)):
                return key[:dash], int(m.group(1)), m.group(2) or "", m.group(3)
    m = STORY_KEY_RE.match(key)
    if m is None:
        return None
    return m.group(1), int(m.group(2)), m.group(3) or "", m.group(4)


def _classify(key: str, epics: Collection[str]) -> tuple[str, str | None, StoryParts | None]:
    """(kind, epic id, story parts) of a key; `epics` are the declared epic ids."""
    if m := _RETRO_RE.match(key):
        return "retrospective", m.group(1), None
    if m := _RETRO_ITEM_RE.match(key):
        return "retro-item", m.group(1), None
    if m := _EPIC_RE.match(key):
        return "epic", m.group(1), None
    if parts := parse_story_key(key, epics):
        return "story", parts[0], parts
    return "extra", None, None


# Stricter than for policy keys: a status is a word a person chose (`doing` is not `done`).
_STATUS_CUTOFF = 0.75


def _q(text: str) -> str:
    """`'text'` for messages; a repr when the text holds characters that would break the line."""
    return f"'{text}'" if text.isprintable() else repr(text)


def validate_story_key(key: str, source: Path) -> None:
    """Raise ConfigError unless `key` is safe as a worktree folder name and a branch name part."""
    if "/" in key or "\\" in key or ".." in key or key in (".", ""):
        raise ConfigError(f"{source}: story {_q(key)}: key would escape the worktree root")
    problem = branch_name_problem(f"bmad-loop/run/{key}")
    if problem is not None:
        raise ConfigError(
            f"{source}: story {_q(key)}: not a valid git branch name component ({problem})"
        )


# --- parsing ---


def _status_pairs(data: BoardYaml, path: Path) -> tuple[tuple[Scalar, Scalar], ...]:
    if not data.root_is_mapping:
        raise ConfigError(f"{path}: not a YAML mapping with a 'development_status' key")
    if data.status is None:
        raise ConfigError(f"{path}: no 'development_status' mapping")
    if not data.status_is_mapping:
        raise ConfigError(f"{path}: 'development_status' is not a mapping")
    return data.pairs


def _is_string(item: Scalar) -> bool:
    return item.scalar and item.tag == _STR_TAG


def _story_location(item: Scalar | None, path: Path) -> str | None:
    if item is None or (item.scalar and item.tag == _NULL_TAG):
        return None
    if _is_string(item):
        return item.value
    raise ConfigError(f"{path}: 'story_location' is not a string")


# The last few boards parsed (or derived from an edit, `remember_board`), by their text: the
# lane reads the target's board after every integration, and the write-back edits that same
# text; a Board is immutable, so no text is parsed twice while it is among the last few.
_PARSED: dict[tuple[str, Path], Board] = {}
_PARSED_KEEP = 4
CACHES.register("bmad.boards", _PARSED.clear, bound=f"the last {_PARSED_KEEP} texts",
               holds="(board text, path) -> its parsed, immutable Board")
_parsed_lock = threading.Lock()


def parse_board(text: str, path: Path) -> Board:
    """Parse board text; `path` is only used in messages and kept on the Board."""
    path = Path(path)
    with _parsed_lock:
        known = _PARSED.get((text, path))
    if known is not None:
        return known
    board = _parse_board(text, path)
    remember_board(text, path, board)
    return board


def remember_board(text: str, path: Path, board: Board) -> None:
    """`board` is what `parse_board(text, path)` gives (an edit that knows its result)."""
    with _parsed_lock:
        _PARSED.pop((text, Path(path)), None)
        _PARSED[(text, Path(path))] = board
        while len(_PARSED) > _PARSED_KEEP:
            del _PARSED[next(iter(_PARSED))]


def _parse_board(text: str, path: Path) -> Board:
    data = read_board_yaml(text, path)
    pairs = _status_pairs(data, path)
    # Epic ids first: a story's epic is the longest declared one, wherever it is declared.
    epics = {m.group(1) for k, _ in pairs if k.scalar and (m := _EPIC_RE.match(k.value))
             and not _RETRO_RE.match(k.value)}
    entries: list[BoardEntry] = []
    seen: dict[str, int] = {}
    current_epic: str | None = None  # of the nearest `epic-<E>` line above
    for knode, vnode in pairs:
        line = knode.line
        if not knode.scalar:
            raise ConfigError(f"{path}: line {line}: 'development_status' key is not a scalar")
        key = knode.value
        if key in seen:
            raise ConfigError(
                f"{path}: key {_q(key)} appears twice (lines {seen[key]} and {line})"
            )
        seen[key] = line
        if not vnode.scalar:
            raise ConfigError(f"{path}: key {_q(key)}: status is not a single value")
        written = vnode.value
        # Any scalar is read as text (`~`, `42`, `true` are statuses bmad-loop does not know).
        status = read_status(written).status
        kind, epic, parts = _classify(key, epics)
        if kind == "story":
            validate_story_key(key, path)
        if kind == "epic":
            current_epic = epic
        elif kind == "extra":
            epic = current_epic
        number, split, slug = (parts[1], parts[2], parts[3]) if parts else (None, "", "")
        entries.append(BoardEntry(key=key, status=status, kind=kind, epic=epic, line=line,
                                  written=written, known=is_known(kind, status),
                                  number=number, split=split, slug=slug))
    story_location = _story_location(data.story_location, path)
    return Board(path=path, entries=tuple(entries), story_location=story_location)


def _read_text(path: Path, what: str) -> str:
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            return fh.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: {what} is a directory") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: {what} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror}") from None


def load_board(path: Path) -> Board:
    """Read and parse the board; every problem is a one-line ConfigError naming the file."""
    path = Path(path)
    return parse_board(_read_text(path, "sprint status file"), path)


def _status_value(text: str, key: str, path: Path, loader: type | None = None) -> Scalar:
    for knode, vnode in _status_pairs(read_board_yaml(text, path, loader), path):
        if knode.scalar and knode.value == key:
            break
    else:
        raise ConfigError(f"{path}: no key {_q(key)} in development_status")
    if not (_is_string(vnode) and vnode.style in (None, "'", '"')):
        raise ConfigError(f"{path}: key {_q(key)}: status is not a one-line string")
    return vnode


def _spans_token(text: str, value: Scalar) -> bool:
    """Do the offsets cover the value's token exactly (its quotes included)?"""
    token = text[value.start:value.end]
    if value.style is None:
        return token == value.value
    return len(token) >= 2 and token[0] == token[-1] == value.style


def set_status(text: str, key: str, status: str, source: Path | str = "sprint-status.yaml") -> str:
    """Return `text` with the status of `key` replaced by `status`, and nothing else changed.

    Only the status token inside the value is replaced (`Backlog (next)` becomes `done (next)`);
    the quoting style of the old value, a decoration after it and an inline comment are kept.
    `source` names the file in error messages.
    """
    if not _STATUS_TOKEN_RE.match(status):
        raise ValueError(f"not a status token: {status!r}")
    path = Path(source)
    value = _status_value(text, key, path)
    if not _spans_token(text, value):
        # The C parser's offsets do not fall on the token (text it counts differently): take
        # the pure-Python parser's, which count characters exactly as Python does.
        value = _status_value(text, key, path, yaml.SafeLoader)
    quote = value.style or ""
    inner = value.start + len(quote)
    if text[inner:value.end - len(quote)] == value.value:
        reading = read_status(value.value)
        return text[:inner + reading.start] + status + text[inner + reading.end:]
    # a quoted value with escapes: its characters are not where the text has them
    return text[:value.start] + quote + status + quote + text[value.end:]


# --- status edits that know the board they make, without parsing it again ---

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


def _quick_edit(text: str, entry: BoardEntry, status: str) -> tuple[str, str] | None:
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
