"""Stories of a board, and the plan: which of them a run takes, in which order.

`Selection` is what the operator asked for (`--epic`, `--story`, `--max-stories`).
`story_files.load_stories` joins the board with the story files and the policy's footprint
overrides into `StorySpec`s. `select_stories` applies the selectors (`--epic`, `--story`, `--max-stories`)
and orders the plan: file order, except that the current epic (the one whose `epic-<E>` entry
has started) comes first. `check_dependencies` rejects, for the selected stories only, unknown
or cyclic `depends_on` and dependencies on unfinished work the run will not do.

Epic ids are strings (`"1"`, `"r"`, `"3-5"`). `--story` queries, tried in this order:

- the full key: `1-2-user-auth`
- `E-S` or `E.S`: the story and both halves of a split story (`2-3` gives `2-3a-…`, `2-3b-…`);
  `E-Sa` / `E.Sa` one half; letter and fractional epics too (`r-1`, `3-5-1`, `3.5.1`)
- the start of a key (`1-2-user`), else a fragment of the slug (`auth`); it must be unique

A `depends_on` entry is a full key or an `E-S` / `E.S` short key naming exactly one story.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .board import ACTIONABLE, DONE, EPIC_STARTED, Board, parse_story_key
from ..errors import ConfigError
from .footprint import Footprint

__all__ = [
    "Selection",
    "StorySpec",
    "select_stories",
    "match_story",
    "check_dependencies",
    "dependency_problems",
    "resolve_story_ref",
    "resolve_dependencies",
    "resolve_dependency",
    "current_epic",
]


@dataclass(frozen=True)
class Selection:
    """What the operator asked to run: `--epic`, `--story` (repeatable), `--max-stories`."""

    epic: str | None = None  # an epic id: "1", "r", "3-5"
    stories: tuple[str, ...] = ()
    max_stories: int | None = None

    def to_dict(self) -> dict:
        return {"epic": self.epic, "story": list(self.stories), "max_stories": self.max_stories}


@dataclass(frozen=True)
class StorySpec:
    """One story of the board, with what its story file and the policy say about it."""

    key: str
    epic: str  # the epic id ("1", "r", "3-5"); "" for an extra key above every epic line
    status: str
    title: str
    story_file: Path | None  # absolute; None when the committed target holds no story file
    story_path: str | None  # repo-relative posix: the story file, or where create writes it
    footprint: Footprint
    depends_on: tuple[str, ...]
    merge_class: str | None
    tier: str | None
    done_checkpoint: bool
    position: int  # 0-based among the board's stories, in file order


def current_epic(board: Board) -> str | None:
    """The epic whose `epic-<E>` entry has started (`in-progress`, or the older `contexted`):
    the first one in file order, or None."""
    for entry in board.entries:
        if entry.kind == "epic" and entry.status in EPIC_STARTED:
            return entry.epic
    return None


# `E-S`, `E.S`, `E-Sa`: the epic id is everything before the last `-` or `.`
_NUMBER_QUERY_RE = re.compile(r"^(.+)[.-](\d+)([a-z])?$")


def _parts(spec: StorySpec) -> tuple[str, int, str, str] | None:
    """A story's (epic, number, split, slug), read against its own epic."""
    return parse_story_key(spec.key, (spec.epic,) if spec.epic else ())


def _number_matches(stories: Sequence[StorySpec], q: str) -> list[StorySpec] | None:
    """The stories an `E-S[a]` / `E.S[a]` query names, or None if `q` is not such a query."""
    m = _NUMBER_QUERY_RE.match(q)
    if m is None:
        return None
    epic, number, suffix = m.group(1).replace(".", "-"), int(m.group(2)), m.group(3)
    matches = []
    for s in stories:
        parts = _parts(s)
        if parts and parts[:2] == (epic, number) and (suffix is None or parts[2] == suffix):
            matches.append(s)
    return matches


def match_story(stories: Sequence[StorySpec], query: str, board_path: Path | str) -> list[StorySpec]:
    """The stories a `--story` query names, whatever their status; ConfigError if none or ambiguous."""
    q = query.strip()
    if not q:
        raise ConfigError(f"{board_path}: empty story query")
    exact = [s for s in stories if s.key == q]
    if exact:
        return exact
    matches = _number_matches(stories, q)
    if not matches:  # not an `E-S` query, or one that names no story: a key prefix or slug
        matches = [s for s in stories if s.key.startswith(q)]
        if not matches:
            needle = q.lower()
            matches = [s for s in stories if needle in ((_parts(s) or ("", 0, "", s.key))[3]).lower()]
        if len(matches) > 1:
            names = ", ".join(s.key for s in matches)
            raise ConfigError(f"{board_path}: story query '{q}' is ambiguous: {names}")
    if not matches:
        raise ConfigError(f"{board_path}: no story matches '{q}'")
    return matches


def resolve_story_ref(stories: Sequence, ref: str, where: str) -> str:
    """The full key `ref` names among `stories` (anything with `key` and `epic`: specs or a
    run's rows), the same way in every command that takes a story: the full key; else an
    `E-S` / `E.S` / `E-Sa` short key (`5-1` names `5-1-login`, and both halves `5-1a-…`,
    `5-1b-…`: ambiguous); else a unique key prefix or fragment. NotFound or Ambiguous (exit 2,
    one line starting with `where`) otherwise."""
    from ..errors import Ambiguous, NotFound

    q = ref.strip()
    exact = [s for s in stories if s.key == q]
    if exact or not q:
        matches = exact
    else:
        matches = _number_matches(stories, q) or [s for s in stories if s.key.startswith(q)] \
            or [s for s in stories if q.lower() in s.key.lower()]
    if len(matches) == 1:
        return matches[0].key
    if not matches:
        raise NotFound(f"{where}: no story '{ref}'")
    raise Ambiguous(f"{where}: story '{ref}' is ambiguous: " + ", ".join(s.key for s in matches))


def select_stories(
    stories: list[StorySpec],
    board: Board,
    *,
    epic: str | int | None = None,
    story: Sequence[str] = (),
    max_stories: int | None = None,
) -> list[StorySpec]:
    """The plan: the selected actionable stories, current epic first, then file order.

    The `depends_on` of each planned story are resolved to full keys (`resolve_dependencies`).
    """
    if max_stories is not None and (
        isinstance(max_stories, bool) or not isinstance(max_stories, int) or max_stories < 1
    ):
        raise ConfigError(f"max_stories must be a whole number of at least 1, got {max_stories!r}")
    if isinstance(story, str):
        story = (story,)
    if epic is not None:
        epic = str(epic).strip()
        if board.entry(f"epic-{epic}") is None and not any(s.epic == epic for s in stories):
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
    return resolve_dependencies(stories, pool)


def _where(spec: StorySpec) -> str:
    return str(spec.story_file or spec.story_path or "story")


def resolve_dependency(stories: Sequence[StorySpec], spec: StorySpec, dep: str) -> str:
    """The full key a `depends_on` entry of `spec` names: a full key, or a short key `E-S` /
    `E.S` (`E-Sa`) naming exactly one story. ConfigError naming the story file otherwise.
    (An annotation such as `(done)` was already dropped when the story file was read.)"""
    if any(s.key == dep for s in stories):
        return dep
    matches = _number_matches(stories, dep) or []
    if len(matches) == 1:
        return matches[0].key
    if len(matches) > 1:
        names = ", ".join(s.key for s in matches)
        raise ConfigError(f"{_where(spec)}: story {spec.key} depends on '{dep}', which names "
                          f"more than one story: {names}")
    raise ConfigError(f"{_where(spec)}: story {spec.key} depends on unknown story '{dep}'")


def resolve_dependencies(all_stories: Sequence[StorySpec],
                         specs: Sequence[StorySpec]) -> list[StorySpec]:
    """`specs` with every `depends_on` entry resolved to a full key (ConfigError for an unknown
    or ambiguous one). Only these stories are looked at: another story's front matter never
    blocks them."""
    resolved = []
    for spec in specs:
        deps = tuple(dict.fromkeys(resolve_dependency(all_stories, spec, d) for d in spec.depends_on))
        resolved.append(spec if deps == spec.depends_on else replace(spec, depends_on=deps))
    return resolved


def check_dependencies(all_stories: Sequence[StorySpec], selected: Sequence[StorySpec]) -> None:
    """ConfigError for the first of `dependency_problems`."""
    problems = dependency_problems(all_stories, selected)
    if problems:
        raise ConfigError(problems[0])


def dependency_problems(all_stories: Sequence[StorySpec], selected: Sequence[StorySpec]) -> list[str]:
    """One line per problem, in plan order: a selected story whose `depends_on` names an
    unknown or ambiguous story, a dependency cycle among the selected stories, a selected
    story that depends on a story neither selected (earlier in the plan) nor `done`.

    Only the selected stories are checked: a `done` dependency is satisfied whatever it depends
    on, and any other dependency must be selected, so a cycle can only run through the plan."""
    problems: list[str] = []
    resolved = []
    for spec in selected:  # each unresolvable entry is a problem; the others are checked on
        deps = []
        for dep in spec.depends_on:
            try:
                deps.append(resolve_dependency(all_stories, spec, dep))
            except ConfigError as exc:
                problems.append(str(exc))
        deps_t = tuple(dict.fromkeys(deps))
        resolved.append(spec if deps_t == spec.depends_on else replace(spec, depends_on=deps_t))
    cycle = _first_cycle(resolved)
    if cycle is not None:
        problems.append(cycle)
    return problems + _order_problems(all_stories, resolved)


def _first_cycle(selected: Sequence[StorySpec]) -> str | None:
    """The first dependency cycle, depth-first over the plan in plan order (deterministic)."""
    plan = {s.key: s for s in selected}
    state: dict[str, int] = {}  # 1 on the path, 2 finished
    for root in selected:
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
            elif dep not in plan:
                continue
            elif state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                return f"{_where(plan[dep])}: dependency cycle: {' -> '.join(cycle)}"
            elif dep not in state:
                state[dep] = 1
                path.append(dep)
                pending.append(iter(plan[dep].depends_on))
    return None


def _order_problems(all_stories: Sequence[StorySpec], selected: Sequence[StorySpec]) -> list[str]:
    by_key = {s.key: s for s in all_stories}
    plan_index = {s.key: i for i, s in enumerate(selected)}
    problems = []
    for s in selected:
        for dep in s.depends_on:
            if dep in plan_index:
                if plan_index[dep] > plan_index[s.key]:
                    problems.append(f"{_where(s)}: story {s.key} depends on {dep}, which comes "
                                    "later in the plan")
            elif by_key[dep].status != DONE:
                problems.append(f"{_where(s)}: story {s.key} depends on {dep}, which is"
                                f" {by_key[dep].status} and not selected")
    return problems