"""The repository's mutation lock, shared by bmad-loop's threads and processes on one machine.

`repo_lock` serialises ref and worktree mutations inside one repository (concurrent ``git
worktree add`` in one repository fails intermittently otherwise); `locked_read` keeps a read
such as ``worktree list`` apart from them without creating the lock file.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from .runner import Git

__all__ = ["LOCK_FILE_NAME", "locked_read", "repo_lock"]

LOCK_FILE_NAME = "bmad-loop.lock"
T = TypeVar("T")

# Per-thread depth of the locks this thread holds, keyed by lock file: makes repo_lock re-entrant
# within a thread (a caller may hold it around several mutations that each take it again).
_held = threading.local()


@contextmanager
def repo_lock(git: Git) -> Iterator[None]:
    """Hold the repository's mutation lock: ``fcntl.flock`` on ``<common_dir>/bmad-loop.lock``.

    Each outermost acquisition opens its own file description, so threads of one process exclude
    each other as well as processes do; the kernel releases it if the holder is killed (even with
    SIGKILL). Re-entrant within one thread. Do not fork while holding it (the child would share
    it). Works only among processes on one machine (the scale-out mode needs a lease instead).
    """
    path = str(git.common_dir() / LOCK_FILE_NAME)
    depths = _held.__dict__.setdefault("depths", {})
    if depths.get(path):
        depths[path] += 1
        try:
            yield
        finally:
            depths[path] -= 1
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        depths[path] = 1
        try:
            yield
        finally:
            depths[path] = 0
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def locked_read(git: Git, read: Callable[[], T]) -> T:
    """`read()` kept apart from bmad-loop's mutations, without creating the lock file.

    A read-only command (`validate`, `status`) must leave `.git` as it found it. Every mutation
    creates the lock file before it starts and nothing deletes it, so when the file is missing
    both before and after the read, no mutation overlapped it; when it appeared meanwhile (a
    first run starting this moment), the read runs again under the lock.
    """
    path = git.common_dir() / LOCK_FILE_NAME
    if not path.exists():
        try:
            result = read()
        except Exception:
            if not path.exists():
                raise
        else:
            if not path.exists():
                return result
    with repo_lock(git):
        return read()
