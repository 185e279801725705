"""What changed: between two commits (`changed_status`, `changed_paths`) and in a checkout
(`dirty_paths`). Re-exported by `compose`.

A diff of two full SHAs is asked of git once per process (`caches.CACHES`): the lane's dirty check
and its checkout sync diff the same pair, and the worker's commit already knows its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..runner import Git, is_full_sha

_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}  # a path is a path, never a glob
from ...caches import CACHES

__all__ = ["dirty_paths", "changed_paths", "changed_status", "remember_diff"]


# More paths than this, or a longer command line, and the whole worktree is looked at instead.
MAX_PATHSPECS = 256
_MAX_PATHSPEC_CHARS = 32_000


def dirty_paths(git: Git, worktree: Path, within: Sequence[str] | None = None) -> set[str]:
    """Paths that are modified, staged, deleted or untracked in `worktree` (not ignored ones).

    Repository-relative. A rename counts as both its paths. `within` (repository-relative
    paths, taken literally): only those and what lies under them are looked at, which spares
    git a walk of the whole worktree (20 → 3 ms at 2,000 files here); past `MAX_PATHSPECS`
    of them the whole worktree is looked at, which finds the same and more.
    """
    limit = []
    if within is not None and len(within) <= MAX_PATHSPECS \
            and sum(len(p) + 1 for p in within) <= _MAX_PATHSPEC_CHARS:
        if not within:
            return set()
        limit = ["--", *within]
    raw = git.run(
        "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", *limit,
        cwd=worktree, env=_LITERAL if limit else None,
    ).stdout
    fields = raw.split("\0")
    paths: set[str] = set()
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.add(entry[3:])
        if "R" in entry[:2] or "C" in entry[:2]:  # renames despite --no-renames: source follows
            if i < len(fields) and fields[i]:
                paths.add(fields[i])
            i += 1
    return paths


def changed_paths(git: Git, base: str, head: str) -> list[str]:
    """Paths that differ between commits (or trees) `base` and `head`, renames as two paths."""
    return list(changed_status(git, base, head))


# The diff of two full SHAs never changes (objects are named by their content): the lane's
# dirty check and its checkout sync ask for the same pair, and git is run for it once.
_DIFFS = CACHES.memo("git.trees.diffs", 16,
                     holds="(repository, sha, sha) -> the diff of two commits")


def changed_status(git: Git, base: str, head: str) -> dict[str, str]:
    """{path: status letter (A, D, M, T)} between commits (or trees) `base` and `head`, in
    git's path order, renames as a deletion and an addition."""
    known = _DIFFS.get((os.fspath(git.repo_dir), base, head))
    if known is not None:
        return dict(known)
    raw = git.run("diff-tree", "-r", "-z", "--name-status", "--no-renames", base, head).stdout
    fields = raw.split("\0")
    status = {fields[i + 1]: fields[i][:1] for i in range(0, len(fields) - 1, 2) if fields[i + 1]}
    remember_diff(git, base, head, status)
    return status


def remember_diff(git: Git, base: str, head: str, status: dict[str, str]) -> None:
    """What `changed_status(base, head)` is, known without asking git (two full SHAs only)."""
    if is_full_sha(base) and is_full_sha(head):
        _DIFFS.put((os.fspath(git.repo_dir), base, head), dict(status))
