"""Holding a checkout's index the way git itself does, across a compare-and-swap.

git serialises writers of an index with `<index>.lock`, created exclusively; a writer puts the
new index in the lock file and renames it over the index. The lane takes that lock *before* it
moves the target and keeps it until the checkout follows the new target, so nobody (an editor
running `git status`, a person committing) ever sees the checkout half-way: its branch moved but
its index still at the old tree, which would read as a staged revert of the story.

While held, the lock file carries a marker line naming bmad-loop, the host and the process,
never index data: git treats any content as "locked", and the lane can tell its own stale lock
(left by a process that died) from a foreign one, which it waits for instead.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..errors import TransientError
from ..hostid import host_name

__all__ = ["IndexLock", "MARKER", "lock_owner", "stale_marker_lock"]

MARKER = b"bmad-loop index lock"


def lock_owner(lock: Path) -> tuple[str, int] | None:
    """(host, pid) of a bmad-loop lock file; None for a lock git made (or an unreadable one)."""
    try:
        head = lock.read_bytes()[:200]
    except OSError:
        return None
    if not head.startswith(MARKER):
        return None
    words = head[len(MARKER):].decode("utf-8", "replace").split()
    try:
        return words[0], int(words[1])
    except (IndexError, ValueError):
        return None


def stale_marker_lock(lock: Path) -> bool:
    """True for a bmad-loop lock on this host whose process is gone."""
    owner = lock_owner(lock)
    if owner is None or owner[0] != host_name():
        return False
    host, pid = owner
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class IndexLock:
    """`<index>.lock` of one checkout, taken exclusively; waits for a foreign holder.

    `on_wait(path)` is called once when the lock is found held; `on_stale(path)` when a stale
    lock of a dead bmad-loop process is removed.
    """

    def __init__(self, index: Path, *, wait_s: float, on_wait=None, on_stale=None,
                 clock=time.monotonic, sleep=time.sleep):
        self.index = Path(index)
        self.lock = self.index.with_name(self.index.name + ".lock")
        self.wait_s = wait_s
        self.on_wait, self.on_stale = on_wait, on_stale
        self.clock, self.sleep = clock, sleep
        self.held = False

    def acquire(self) -> None:
        deadline = self.clock() + self.wait_s
        delay, told = 0.01, False
        while True:
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if stale_marker_lock(self.lock):
                    self._remove_stale()
                    continue
                if self.clock() >= deadline:
                    raise TransientError(
                        f"{self.lock} is held by another git process (an editor, a person?) "
                        f"and stayed so for {self.wait_s:g}s", where=str(self.lock)) from None
                if not told and self.on_wait:
                    self.on_wait(str(self.lock))
                told = True
                self.sleep(delay)
                delay = min(delay * 2, 0.25)
                continue
            try:
                os.write(fd, MARKER + f" {host_name()} {os.getpid()}\n".encode())
            finally:
                os.close(fd)
            self.held = True
            return

    def install(self, new_index: Path) -> None:
        """Make `new_index` the checkout's index (atomically), still holding the lock."""
        os.replace(new_index, self.index)

    def release(self) -> None:
        if self.held:
            self.held = False
            if lock_owner(self.lock) == (host_name(), os.getpid()):
                self.lock.unlink(missing_ok=True)

    def _remove_stale(self) -> None:
        try:
            self.lock.unlink()
        except FileNotFoundError:
            return
        if self.on_stale:
            self.on_stale(str(self.lock))

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
