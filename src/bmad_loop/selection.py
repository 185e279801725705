"""Stories of a board, and the plan: which of them a run takes, in which order.

`Selection` is what the operator asked for (`--epic`, `--story`, `--max-stories`).
`load_stories` joins the board with the story files (`<story_dir>/<key>.md`) and the policy's
footprint overrides. `select_stories` applies the selectors (`--epic`, `--story`, `--max-stories`)
and orders the plan: file order, except that the current epic (the one whose `epic-N` entry is
`in-progress`) comes first. `check_dependencies` rejects unknown or cyclic `depends_on` and
selected stories that depend on unfinished work the run will not do.

`--story` queries, tried in this order:

- the full key: `1-2-user-auth`
- `E-S` or `E.S`: the story and both halves of a split story (`2-3` gives `2-3a-…`, `2-3b-…`);
  `E-Sa` / `E.Sa` one half
- the start of a key (`1-2-user`), else a fragment of the slug (`auth`); it must be unique
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bmad_loop.board import ACTIONABLE, Board, parse_story_key
from bmad_loop.errors import ConfigError
from bmad_loop.footprint import Footprint, footprint_from_mapping
from bmad_loop.storymeta import parse_story_text

__all__ = [
    "Selection",
    "StorySpec",
    "load_stories",
    "select_stories",
    "match_story",
    "check_dependencies",
    "current_epic",
]


@dataclass(frozen=True)
class Selection:
    """What the operator asked to run: `--epic`, `--story` (repeatable), `--max-stories`."""

    epic: int | None = None
    stories: tuple[str, ...] = ()
    max_stories: int | None = None

    def to_dict(self) -> dict:
        return {"epic": self.epic, "story": list(self.stories), "max_stories": self.max_stories}


@dataclass(frozen=True)
class StorySpec:
    """One story of the board, with what its story file and the policy say about it."""

    key: str
    epic: int
    status: str
    title: str
    story_file: Path | None  # absolute; None when the file does not exist
    story_path: str | None  # repo-relative posix path of <story_dir>/<key>.md, even if missing
    footprint: Footprint
    depends_on: tuple[str, ...]
    merge_class: str | None
    tier: str | None
    done_checkpoint: bool
    position: int  # 0-based among the board's stories, in file order


def _relative_posix(path: Path, root: Path) -> str | None:
    # Lexically first; resolving symlinks (a stat per component) only when that fails, since
    # this runs once per story of the board.
    pairs = ((lambda: (Path(os.path.abspath(path)), Path(os.path.abspath(root)))),
             (lambda: (path.resolve(), root.resolve())))
    for pair in pairs:
        p, r = pair()
        try:
            return p.relative_to(r).as_posix()
        except ValueError:
            continue
    return None


def _title_from_key(key: str) -> str:
    parsed = parse_story_key(key)
    slug = parsed[3] if parsed else key
    words = slug.replace("-", " ").replace("_", " ").strip()
    return words[:1].upper() + words[1:] if words else key


def load_stories(
    project_dir: Path,
    board: Board,
    story_dir: Path,
    overrides: Mapping[str, Mapping] | None = None,
) -> list[StorySpec]:
    """Every story of the board, in file order, with its story file's metadata.

    A policy override (`overrides[key]`, a `{files, shared, resources}` mapping) replaces the
    story's own footprint. The story file's own path is always added to `footprint.files`.
    A metadata error in a story file is a ConfigError naming the file.
    """
    project_dir = Path(project_dir)
    story_dir = Path(story_dir)
    if not story_dir.is_absolute():
        story_dir = project_dir / story_dir
    overrides = overrides or {}
    specs: list[StorySpec] = []
    for position, entry in enumerate(board.stories()):
        path = story_dir / f"{entry.key}.md"
        story_path = _relative_posix(path, project_dir)
        story_file = Path(os.path.abspath(path)) if path.is_file() else None
        title = None
        depends_on: tuple[str, ...] = ()
        merge_class = tier = None
        done_checkpoint = False
        footprint = Footprint(reason="missing")
        if story_file is not None:
            try:
                text = story_file.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise ConfigError(f"{story_file}: story file is not UTF-8 text") from None
            except OSError as exc:
                raise ConfigError(f"{story_file}: cannot read story file: {exc.strerror}") from None
            meta = parse_story_text(text)
            if meta.errors:
                raise ConfigError(f"{story_file}: {'; '.join(meta.errors)}")
            title = meta.title
            footprint = meta.footprint
            depends_on = meta.depends_on
            merge_class = meta.merge_class
            tier = meta.tier
            done_checkpoint = meta.done_checkpoint
        if entry.key in overrides:
            footprint = footprint_from_mapping(overrides[entry.key])
        if story_path is not None:
            # anchor it: a bare file name would otherwise match at any depth
            footprint = footprint.with_files(story_path if "/" in story_path else "/" + story_path)
        specs.append(
            StorySpec(
                key=entry.key,
                epic=entry.epic if entry.epic is not None else parse_story_key(entry.key)[0],
                status=entry.status,
                title=title or _title_from_key(entry.key),
                story_file=story_file,
                story_path=story_path,
                footprint=footprint,
                depends_on=depends_on,
                merge_class=merge_class,
                tier=tier,
                done_checkpoint=done_checkpoint,
                position=position,
            )
        )
    return specs


def current_epic(board: Board) -> int | None:
    """The epic whose `epic-N` entry is `in-progress` (the first one in file order), or None."""
    for entry in board.entries:
        if entry.kind == "epic" and entry.status == "in-progress":
            return entry.epic
    return None


_NUMBER_QUERY_RE = re.compile(r"^(\d+)[.-](\d+)([a-z])?$")


def match_story(stories: Sequence[StorySpec], query: str, board_path) -> list[StorySpec]:
    """The stories a `--story` query names, whatever their status; ConfigError if none or ambiguous."""
    q = query.strip()
    if not q:
        raise ConfigError(f"{board_path}: empty story query")
    exact = [s for s in stories if s.key == q]
    if exact:
        return exact
    m = _NUMBER_QUERY_RE.match(q)
    if m:
        epic, number, suffix = int(m.group(1)), int(m.group(2)), m.group(3)
        matches = []
        for s in stories:
            parsed = parse_story_key(s.key)
            if parsed and parsed[:2] == (epic, number) and (suffix is None or parsed[2] == suffix):
                matches.append(s)
    else:
        matches = [s for s in stories if s.key.startswith(q)]
        if not matches:
            needle = q.lower()
            matches = [
                s for s in stories
                if needle in (parse_story_key(s.key) or (0, 0, "", s.key))[3].lower()
            ]
        if len(matches) > 1:
            names = ", ".join(s.key for s in matches)
            raise ConfigError(f"{board_path}: story query '{q}' is ambiguous: {names}")
    if not matches:
        raise ConfigError(f"{board_path}: no story matches '{q}'")
    return matches


def select_stories(
    stories: list[StorySpec],
    board: Board,
    *,
    epic: int | None = None,
    story: Sequence[str] = (),
    max_stories: int | None = None,
) -> list[StorySpec]:
    """The plan: the selected actionable stories, current epic first, then file order."""
    if max_stories is not None and (
        isinstance(max_stories, bool) or not isinstance(max_stories, int) or max_stories < 1
    ):
        raise ConfigError(f"max_stories must be a whole number of at least 1, got {max_stories!r}")
    if isinstance(story, str):
        story = (story,)
    if epic is not None and board.entry(f"epic-{epic}") is None and not any(
        s.epic == epic for s in stories
    ):
        raise ConfigError(f"{board.path}: no epic {epic} on the board")
    if story:
        chosen: set[str] = set()
        for query in story:
            matches = match_story(stories, query, board.path)
            actionable = [s for s in matches if s.status in ACTIONABLE]
            if not actionable:
                if len(matches) == 1:
                    s = matches[0]
                    raise ConfigError(
                        f"{board.path}: story {s.key} is {s.status}, not actionable"
                    )
                listed = ", ".join(f"{s.key} ({s.status})" for s in matches)
                raise ConfigError(f"{board.path}: stories {listed} are not actionable")
            chosen.update(s.key for s in actionable)
        pool = [s for s in stories if s.key in chosen]
    else:
        pool = [s for s in stories if s.status in ACTIONABLE]
    if epic is not None:
        pool = [s for s in pool if s.epic == epic]
    first = current_epic(board)
    pool.sort(key=lambda s: (0 if first is not None and s.epic == first else 1, s.position))
    if max_stories is not None:
        pool = pool[:max_stories]
    return pool


def _where(spec: StorySpec) -> str:
    return str(spec.story_file or spec.story_path or "story")


def check_dependencies(all_stories: Sequence[StorySpec], selected: Sequence[StorySpec]) -> None:
    """ConfigError for an unknown or cyclic `depends_on` anywhere on the board, and for a selected
    story that depends on a story neither selected (earlier in the plan) nor `done`."""
    by_key = {s.key: s for s in all_stories}
    for s in all_stories:
        for dep in s.depends_on:
            if dep not in by_key:
                raise ConfigError(f"{_where(s)}: story {s.key} depends on unknown story '{dep}'")

    # cycles: depth-first, in file order, so the reported cycle is deterministic
    state: dict[str, int] = {}  # 1 on the path, 2 finished
    for root in all_stories:
        if root.key in state:
            continue
        path: list[str] = [root.key]
        pending = [iter(root.depends_on)]
        state[root.key] = 1
        while pending:
            dep = next(pending[-1], None)
            if dep is None:
                state[path.pop()] = 2
                pending.pop()
            elif state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                raise ConfigError(f"{_where(by_key[dep])}: dependency cycle: {' -> '.join(cycle)}")
            elif dep not in state:
                state[dep] = 1
                path.append(dep)
                pending.append(iter(by_key[dep].depends_on))

    plan_index = {s.key: i for i, s in enumerate(selected)}
    for s in selected:
        for dep in s.depends_on:
            if dep in plan_index:
                if plan_index[dep] > plan_index[s.key]:
                    raise ConfigError(
                        f"{_where(s)}: story {s.key} depends on {dep}, which comes later in the plan"
                    )
            elif by_key[dep].status != "done":
                raise ConfigError(
                    f"{_where(s)}: story {s.key} depends on {dep}, which is"
                    f" {by_key[dep].status} and not selected"
                )
