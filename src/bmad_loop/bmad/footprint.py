"""Footprints: which paths a story may change, and when two stories' footprints conflict.

A footprint says which paths a story may change:

    footprint:
      files: ["src/auth/**", "tests/test_auth.py"]   # exclusive: overlap serialises
      shared: ["src/app/__init__.py"]                # overlap with other `shared` is allowed
      resources: ["database"]                        # named tokens, counted elsewhere

It comes from a story file (see `story_files.parse_story_text`) or from a policy override. A footprint that is
missing, empty (all lists empty), invalid, or given twice is *exclusive*: it conflicts with every
other story. `Footprint.reason` says why. Patterns are gitignore-style globs (see `globs`); two
footprints conflict when their globs may overlap, conservatively. Given the directories of the
target tree, a literal path that is not one of them is a file (`CHANGELOG.md` does not meet
`src/greet.py`); without them, any path may be a directory and overlap is decided as before.

A commit's tree never changes, so its directory set (`tree_directories`) is listed by one git
process per SHA and kept in a small cache shared by every lane in the process; `conflict_on`
compares footprints against the target's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from ..caches import CACHES
from ..git.runner import Git
from ..globs import globs_may_overlap, pattern_problem
from ..policy.validate import did_you_mean

__all__ = ["Footprint", "footprint_from_mapping", "footprints_conflict", "tree_directories",
           "conflict_on", "CACHED_TREES"]

_FOOTPRINT_KEYS = ("files", "shared", "resources")


class _BadList(ValueError):
    pass


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


# --- footprint sources ---


def _string_list(data: Mapping[str, object], key: str) -> tuple[str, ...]:
    value = data.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _BadList(f"'{key}' must be a list of strings")
    for item in value:
        if not isinstance(item, str):
            raise _BadList(f"'{key}' must be a list of strings, got {item!r}")
    return tuple(value)


def footprint_from_mapping(data: object) -> Footprint:
    """Validate a `{files, shared, resources}` mapping (a story's footprint or a policy override)."""
    if data is None:
        return Footprint(reason="empty")
    if not isinstance(data, Mapping):
        return Footprint(reason="invalid: footprint must be a mapping of files, shared, resources")
    unknown = [str(k) for k in data if k not in _FOOTPRINT_KEYS]
    if unknown:
        hint = did_you_mean(unknown[0], _FOOTPRINT_KEYS) if len(unknown) == 1 else ""
        return Footprint(reason=f"invalid: unknown key {', '.join(map(repr, unknown))}{hint}")
    try:
        files = _string_list(data, "files")
        shared = _string_list(data, "shared")
        resources = _string_list(data, "resources")
    except _BadList as exc:
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


# --- conflicts ---


def footprints_conflict(a: Footprint, b: Footprint, directories: frozenset[str] | None = None) -> str | None:
    """None if stories with footprints `a` and `b` may run in parallel, else a short reason.

    `files` conflict with the other's `files` and `shared`; `shared` never conflicts with
    `shared`; an exclusive footprint conflicts with everything. Resources are not conflicts
    (they are capacities, counted by the scheduler). `directories`: the target tree's
    directories (`tree_directories`); None = unknown, every matched path may be a directory.
    """
    if a.exclusive:
        return f"exclusive footprint ({a.reason})"
    if b.exclusive:
        return f"exclusive footprint ({b.reason})"
    for pa in a.files:
        for pb in b.files + b.shared:
            if globs_may_overlap(pa, pb, directories):
                return f"{pa} overlaps {pb}"
    for pb in b.files:
        for pa in a.shared:
            if globs_may_overlap(pb, pa, directories):
                return f"{pb} overlaps {pa}"
    return None


# --- the directories of the target's tree ---

CACHED_TREES = 16  # a lane needs the current target's; a few more cover recent advances

_cache: OrderedDict[str, frozenset[str]] = OrderedDict()
_lock = threading.Lock()
CACHES.register("bmad.tree_folders", _cache.clear, bound=f"the last {CACHED_TREES} trees",
               holds="tree sha -> the folders it holds")


def tree_directories(git: Git, sha: str | None) -> frozenset[str] | None:
    """Every directory of `sha`'s tree, repo-relative without a trailing `/` (`src`, `src/app`),
    or None when there is no such commit here (unknown: the conflict test stays conservative).
    Submodules are not directories here: nothing under one is a path of this repository."""
    if not sha:
        return None
    with _lock:
        if sha in _cache:
            _cache.move_to_end(sha)
            return _cache[sha]
    proc = git.run("ls-tree", "-r", "-d", "-z", "--name-only", sha, check=False)
    if proc.returncode != 0:
        return None
    directories = frozenset(name for name in proc.stdout.split("\0") if name)
    with _lock:
        _cache[sha] = directories
        _cache.move_to_end(sha)
        while len(_cache) > CACHED_TREES:
            _cache.popitem(last=False)
    return directories


def conflict_on(git: Git, target_sha: Callable[[], str | None]) -> Callable[[Footprint, Footprint], str | None]:
    """`footprints_conflict` against the directories of the target's tree. The target is read
    and its tree listed at the first comparison, so a pass that compares nothing costs no git."""
    listed: list[frozenset[str] | None] = []

    def conflict(a: Footprint, b: Footprint) -> str | None:
        if a.exclusive or b.exclusive:
            return footprints_conflict(a, b)
        if not listed:
            listed.append(tree_directories(git, target_sha()))
        return footprints_conflict(a, b, listed[0])

    return conflict
