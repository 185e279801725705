"""The BMAD sprint board: `sprint-status.yaml`.

The board is a YAML file with a `development_status:` mapping whose file order is the plan order.
Its keys follow one grammar:

- `epic-N`                         an epic (`kind="epic"`)
- `epic-N-retrospective`           a retrospective (`kind="retrospective"`), never a story
- `epic-N-retro-item-M-slug`       a retrospective action item (`kind="retro-item"`), never a story
- `E-S-slug`, `E-Sa-slug`          a story of epic E (`kind="story"`); a one-letter lower-case
                                   suffix marks one half of a split story
- anything else                    `kind="other"`: reported by `validate`, never run

A story key becomes a branch name and a worktree folder, so a key whose slug could escape the
worktree root (`/`, `\\`, `..`) or that git refuses in a branch name is bad input (`ConfigError`).
The git rules are git's own `check-ref-format --branch` rules, implemented here in pure Python
(`branch_name_ok`, `branch_name_problem`): the one branch-name check, no git process per name.

The board is edited in place by `set_status`: only the status token of one line changes, so
comments, quoting, spacing and order survive byte for byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from bmad_loop.boardyaml import BoardYaml, Scalar, read_board_yaml
from bmad_loop.errors import ConfigError

__all__ = [
    "ACTIONABLE",
    "STORY_STATUSES",
    "STORY_KEY_RE",
    "BoardEntry",
    "Board",
    "parse_board",
    "load_board",
    "set_status",
    "resolve_board_path",
    "resolve_story_dir",
    "validate_story_key",
    "parse_story_key",
    "branch_name_problem",
    "branch_name_ok",
]

ACTIONABLE = ("backlog", "ready-for-dev", "drafted")
STORY_STATUSES = ("backlog", "drafted", "ready-for-dev", "in-progress", "review", "done")

STORY_KEY_RE = re.compile(r"^(\d+)-(\d+)([a-z])?-(.+)$", re.DOTALL)
_EPIC_RE = re.compile(r"^epic-(\d+)$")
_RETRO_RE = re.compile(r"^epic-(\d+)-retrospective$")
_RETRO_ITEM_RE = re.compile(r"^epic-(\d+)-retro-item-(\d+)-(.+)$", re.DOTALL)
_STATUS_TOKEN_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")

_STR_TAG = "tag:yaml.org,2002:str"
_NULL_TAG = "tag:yaml.org,2002:null"

DEFAULT_BOARD = Path("_bmad-output") / "implementation-artifacts" / "sprint-status.yaml"
BMM_CONFIG = Path("_bmad") / "bmm" / "config.yaml"
# Keys of `_bmad/bmm/config.yaml` naming the folder of the board, most specific first.
_CONFIG_BOARD_KEYS = ("implementation_artifacts", "sprint_artifacts", "output_folder")


@dataclass(frozen=True)
class BoardEntry:
    """One key of `development_status`, with its raw status and 1-based line in the file."""

    key: str
    status: str
    kind: str  # "epic" | "story" | "retrospective" | "retro-item" | "other"
    epic: int | None
    line: int


@dataclass(frozen=True)
class Board:
    """A parsed board. `story_location` is the raw top-level value (placeholders unresolved)."""

    path: Path
    entries: tuple[BoardEntry, ...]
    story_location: str | None

    def stories(self) -> list[BoardEntry]:
        return [e for e in self.entries if e.kind == "story"]

    def others(self) -> list[BoardEntry]:
        """Keys that are neither epics, retrospectives, retro items nor stories."""
        return [e for e in self.entries if e.kind == "other"]

    def epic_status(self, n: int) -> str | None:
        entry = self.entry(f"epic-{n}")
        return entry.status if entry is not None else None

    def entry(self, key: str) -> BoardEntry | None:
        for e in self.entries:
            if e.key == key:
                return e
        return None


def parse_story_key(key: str) -> tuple[int, int, str, str] | None:
    """`(epic, story, split_suffix, slug)` of a story key, or None if `key` is not a story key."""
    m = STORY_KEY_RE.match(key)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), m.group(3) or "", m.group(4)


def _classify(key: str) -> tuple[str, int | None]:
    if m := _EPIC_RE.match(key):
        return "epic", int(m.group(1))
    if m := _RETRO_RE.match(key):
        return "retrospective", int(m.group(1))
    if m := _RETRO_ITEM_RE.match(key):
        return "retro-item", int(m.group(1))
    if m := STORY_KEY_RE.match(key):
        return "story", int(m.group(1))
    return "other", None


# --- git ref-name rules (git's refs.c check_refname_format, flags 0, plus `--branch`) ---

_REF_BAD_CHARS = frozenset(" ~^:?*[\\\x7f") | frozenset(chr(c) for c in range(0x20))
_REF_BAD_RE = re.compile("[" + re.escape("".join(sorted(_REF_BAD_CHARS))) + "]")


def _component_problem(component: str) -> str | None:
    if component == "":
        return "empty path component (leading, trailing or double '/')"
    if component.startswith("."):
        return f"component '{component}' starts with '.'"
    if component.endswith(".lock"):
        return f"component '{component}' ends with '.lock'"
    if ".." in component:
        return "contains '..'"
    if "@{" in component:
        return "contains '@{'"
    bad = _REF_BAD_RE.search(component)  # the first one, as a loop over the characters would
    if bad is not None:
        return f"contains the forbidden character {bad.group()!r}"
    return None


def branch_name_problem(name: str) -> str | None:
    """Why git would refuse `name` as a branch name (`git check-ref-format --branch`), or None.

    Names git would expand rather than judge (`@{-1}`, `@{upstream}`) are refused too: any `@{`.
    """
    if name.startswith("-"):
        return "starts with '-'"
    if name == "HEAD":
        return "is 'HEAD'"
    if name.endswith("."):
        return "ends with '.'"
    for component in name.split("/"):
        problem = _component_problem(component)
        if problem is not None:
            return problem
    return None


def branch_name_ok(name: str) -> bool:
    """True when git accepts `name` as a new branch name; checked without running git."""
    return branch_name_problem(name) is None


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


# The last board parsed, by its text: the lane re-reads the target's board on every tick, and a
# Board is immutable, so the same text need not be parsed twice in a row.
_last_parsed: tuple[str, Path, Board] | None = None


def parse_board(text: str, path: Path) -> Board:
    """Parse board text; `path` is only used in messages and kept on the Board."""
    global _last_parsed
    path = Path(path)
    last = _last_parsed
    if last is not None and last[1] == path and last[0] == text:
        return last[2]
    board = _parse_board(text, path)
    _last_parsed = (text, path, board)
    return board


def _parse_board(text: str, path: Path) -> Board:
    data = read_board_yaml(text, path)
    entries: list[BoardEntry] = []
    seen: dict[str, int] = {}
    for knode, vnode in _status_pairs(data, path):
        line = knode.line
        if not knode.scalar:
            raise ConfigError(f"{path}: line {line}: 'development_status' key is not a scalar")
        key = knode.value
        if key in seen:
            raise ConfigError(
                f"{path}: key {_q(key)} appears twice (lines {seen[key]} and {line})"
            )
        seen[key] = line
        if not _is_string(vnode):
            raise ConfigError(f"{path}: key {_q(key)}: status is not a string")
        status = vnode.value
        kind, epic = _classify(key)
        if kind == "story":
            validate_story_key(key, path)
            if status not in STORY_STATUSES:
                raise ConfigError(
                    f"{path}: story {_q(key)}: unknown status '{status}'"
                    f" (expected one of {', '.join(STORY_STATUSES)})"
                )
        entries.append(BoardEntry(key=key, status=status, kind=kind, epic=epic, line=line))
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
        raise ConfigError(f"{path}: key {_q(key)}: status is not a one-word string")
    return vnode


def _spans_token(text: str, value: Scalar) -> bool:
    """Do the offsets cover the value's token exactly (its quotes included)?"""
    token = text[value.start:value.end]
    if value.style is None:
        return token == value.value
    return len(token) >= 2 and token[0] == token[-1] == value.style


def set_status(text: str, key: str, status: str, source: Path | str = "sprint-status.yaml") -> str:
    """Return `text` with the status of `key` replaced by `status`, and nothing else changed.

    The quoting style of the old value is kept (`'x'`, `"x"` or plain). `source` names the file
    in error messages.
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
    return text[:value.start] + quote + status + quote + text[value.end:]


# --- locating the board and the story files ---


def _substitute(value: str, project_dir: Path, extra: dict[str, str] | None = None) -> str:
    value = value.replace("{project-root}", str(project_dir))
    for name, replacement in (extra or {}).items():
        value = value.replace("{" + name + "}", replacement)
    return value


def _under_project(value: str, project_dir: Path) -> Path:
    p = Path(value)
    return p if p.is_absolute() else project_dir / p


def resolve_board_path(project_dir: Path, sprint_status: str = "") -> Path:
    """Where the board is: the policy's `[stories] sprint_status`, else what BMAD's config says."""
    project_dir = Path(project_dir)
    if sprint_status:
        return _under_project(_substitute(sprint_status, project_dir), project_dir)
    config_path = project_dir / BMM_CONFIG
    if config_path.is_file():
        text = _read_text(config_path, "BMAD config")
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConfigError(f"{config_path}: invalid YAML") from None
        if isinstance(config, dict):
            extra = {}
            if isinstance(config.get("output_folder"), str):
                extra["output_folder"] = _substitute(config["output_folder"], project_dir)
            candidates = []
            for key in _CONFIG_BOARD_KEYS:
                value = config.get(key)
                if isinstance(value, str) and value.strip():
                    folder = _under_project(_substitute(value, project_dir, extra), project_dir)
                    candidates.append(folder / "sprint-status.yaml")
            for candidate in candidates:
                if candidate.is_file():
                    return candidate
            if candidates:
                return candidates[0]
    return project_dir / DEFAULT_BOARD


def resolve_story_dir(project_dir: Path, board: Board, story_dir: str = "") -> Path:
    """Where story files live: the policy's `story_dir`, else `story_location`, else beside the board."""
    project_dir = Path(project_dir)
    if story_dir:
        return _under_project(_substitute(story_dir, project_dir), project_dir)
    if board.story_location and board.story_location.strip():
        return _under_project(_substitute(board.story_location, project_dir), project_dir)
    return Path(board.path).parent
