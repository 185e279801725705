"""Answers git gave about objects named by their content, kept for the next asker in this process.

A git object's name is a hash of its content, so what is true of it stays true: the diff of two
commits, a commit's tree and date, a tree's entries, a file written into a tree. The lane and the
workers ask some of these twice per story (the dirty check and the checkout sync diff the same
pair; the lane reads back the board its own write-back wrote). A `Memo` keeps a few such answers,
keyed with the repository folder so one repository's answers never serve another; the oldest are
dropped. Nothing here can go stale, so nothing ever has to be cleared.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["Memo"]

_MISSING = object()


class Memo:
    """A small, thread-safe map that forgets its oldest entries beyond `size`."""

    def __init__(self, size: int = 64):
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, default=None):
        with self._lock:
            value = self._items.get(key, _MISSING)
            if value is _MISSING:
                return default
            self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
