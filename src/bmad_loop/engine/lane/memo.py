"""What the lane keeps across ticks of one run (a tick makes a fresh lane object)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from .admission import ConflictIndex, StoryView, views_of
from ...caches import CACHES

__all__ = ["RunMemo", "run_memo"]

# Kept across ticks (a tick makes a fresh `_Lane`), per (project, run): the run's conflict
# relation (see conflictindex.py) and the keys the target's board marks done at the target
# commit last read. A handful of runs at most.
_MEMO_RUNS = 16
_memo: OrderedDict[tuple[str, str], "RunMemo"] = OrderedDict()
_memo_lock = threading.Lock()
CACHES.register("engine.lane.run_memos", _memo.clear, bound=f"{_MEMO_RUNS} runs",
               holds="(project, run) -> the lane's conflict index and last board reading")


class RunMemo:
    def __init__(self):
        self.lock = threading.Lock()  # one lane per run, but a test may also tick by hand
        self.index = ConflictIndex()
        self.board_done: tuple[str, frozenset[str]] | None = None  # (target sha, done keys)
        self.rows: dict = {}  # the run's stories' rows as last read, by id (runs.lane_rows)
        self._views: dict = {}  # (story id, stacking) -> (row, its admission view)

    def views_of(self, rows, stacking: bool = False, settled=None) -> list[StoryView]:
        """`admission.views_of`, made once per row: a row kept across passes (the same object
        while its `rev` stands) keeps its view, so a pass over a long sprint does not rebuild
        hundreds of them. A row read again, or made for the pass, is a new object: a new view."""
        views, kept = [], self._views
        for row in rows:
            hit = kept.get((row.id, stacking))
            if hit is None or hit[0] is not row or hit[2] != settled:  # rules compare by value
                hit = kept[row.id, stacking] = (row, views_of((row,), stacking, settled)[0], settled)
            views.append(hit[1])
        if len(kept) > 2 * len(rows) + 64:  # stories that left the run: not kept forever
            current = {row.id for row in rows}
            for key in [key for key in kept if key[0] not in current]:
                del kept[key]
        return views


def run_memo(project, run_id: str) -> RunMemo:
    key = (str(project.key), run_id)
    with _memo_lock:
        memo = _memo.get(key)
        if memo is None:
            memo = _memo[key] = RunMemo()
            while len(_memo) > _MEMO_RUNS:
                _memo.popitem(last=False)
        _memo.move_to_end(key)
        return memo
