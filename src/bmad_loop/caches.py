"""Every cache that lives as long as the process, with one owner: `CACHES`.

bmad-loop keeps a few answers in memory because they are asked again and again (the lane reads
the run's policy every tick, the same diff twice per story) and cannot change while they are
kept: a git object named by its content, a frozen policy parsed from a snapshot's text, an SQL
statement built for one shape, the git a PATH finds. Each such cache is created here or
registered here, with what it holds and how far it may grow, so the next engineer finds them
all in one list (`CACHES.entries()`, and docs/architecture.md) and a test can empty them all
(`CACHES.clear()`). Their lifetime is the process's: nothing in them goes stale, and each is
bounded, so nothing has to clear them while bmad-loop runs.

What is process *state* rather than a cache (locks held per file, the verifications running
here, the steps a thaw helper watches, the SQLite files this process holds open) is not here:
clearing it would be a bug.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

__all__ = ["CACHES", "CacheEntry", "Memo", "ProcessCaches"]

_MISSING = object()


class Memo:
    """A small, thread-safe map that forgets its oldest entries beyond `size`."""

    def __init__(self, size: int = 64):
        self.size = size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            value = self._items.get(key, _MISSING)
            if value is _MISSING:
                return default
            self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class CacheEntry:
    name: str  # "<module>.<what>", e.g. "git.trees.diffs"
    holds: str  # what one entry is, and why it cannot go stale
    bound: str  # how far it may grow
    clear: Callable[[], None]


class ProcessCaches:
    """The registry of this process's caches."""

    def __init__(self) -> None:
        self._entries: dict[str, CacheEntry] = {}
        self._lock = threading.Lock()

    def register(self, name: str, clear: Callable[[], None], *, holds: str, bound: str) -> None:
        with self._lock:
            if name in self._entries:
                raise ValueError(f"cache {name!r} is registered twice")
            self._entries[name] = CacheEntry(name, holds, bound, clear)

    def memo(self, name: str, size: int, *, holds: str) -> Memo:
        """A new `Memo` of `size` entries, registered as `name`."""
        memo = Memo(size)
        self.register(name, memo.clear, holds=holds, bound=f"the last {size} entries")
        return memo

    def entries(self) -> list[CacheEntry]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.name)

    def clear(self) -> None:
        """Empty every cache (a test that must start cold; a process that forked)."""
        for entry in self.entries():
            entry.clear()


CACHES = ProcessCaches()
