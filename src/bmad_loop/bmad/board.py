"""The BMAD sprint board: `sprint-status.yaml`.

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

Statuses are read through decorations (`boardstatus.read_status`): `BoardEntry.status` is the
canonical token and `BoardEntry.written` the value as written. An unknown status is never an
error: the entry is not run, and `Board.warnings()` names it for `validate`.

A story key becomes a branch name and a worktree folder, so a key whose slug could escape the
worktree root (`/`, `\\`, `..`) or that git refuses in a branch name is bad input (`ConfigError`).
The git rules are git's own `check-ref-format --branch` rules, in pure Python in `git/runner.py`
(`branch_name_ok`, `branch_name_problem`): the one branch-name check, no git process per name.

The board is edited in place by `set_status`: only the status token of one line changes, so
comments, decorations, quoting, spacing and order survive byte for byte.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from .board_status import ACTIONABLE, KNOWN_BY_KIND, STORY_STATUSES, is_known, read_status
from .board_yaml import BoardYaml, Scalar, read_board_yaml
from ..errors import ConfigError
from ..git.runner import branch_name_ok, branch_name_problem  # re-exported
from ..caches import CACHES
from ..policy.validate import did_you_mean

__all__ = [
    "ACTIONABLE",
    "STORY_STATUSES",
    "STORY_KEY_RE",
    "BoardEntry",
    "Board",
    "parse_board",
    "remember_board",
    "load_board",
    "set_status",
    "validate_story_key",
    "parse_story_key",
    "branch_name_problem",
    "branch_name_ok",
]

STORY_KEY_RE = re.compile(r"^(\d+)-(\d+)([a-z])?-(.+)$", re.DOTALL)  # a story of an undeclared epic
_EPIC_ID = r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*"
_EPIC_RE = re.compile(rf"^epic-({_EPIC_ID})$")
_RETRO_RE = re.compile(rf"^epic-({_EPIC_ID})-retrospective$")
_RETRO_ITEM_RE = re.compile(rf"^epic-({_EPIC_ID})-retro-item-(\d+)-(.+)$", re.DOTALL)
_STORY_REST_RE = re.compile(r"(\d+)([a-z])?-(.+)$", re.DOTALL)  # what follows `<E>-`
_STATUS_TOKEN_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")

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
        return [e.epic for e in self.entries if e.kind == "epic"]

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


def parse_story_key(key: str, epics=()) -> tuple[str, int, str, str] | None:
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


def _classify(key: str, epics) -> tuple[str, str | None, tuple[str, int, str, str] | None]:
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


def _status_pairs(data: BoardYaml, path: Path):
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


def _status_value(text: str, key: str, path: Path, loader=None) -> Scalar:
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
