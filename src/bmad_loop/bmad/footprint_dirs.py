"""The directories of a commit's tree, for the footprint conflict test.

Whether a literal footprint path (`src`, `CHANGELOG.md`) covers what lies under it depends on
whether it is a directory of the target tree (see `globs`). A commit's tree never changes, so
its directory set is listed by one git process per SHA and kept in a small cache shared by
every lane in the process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

from .footprint import Footprint, footprints_conflict
from ..git.runner import Git
from ..caches import CACHES

__all__ = ["tree_directories", "conflict_on", "CACHED_TREES"]

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
