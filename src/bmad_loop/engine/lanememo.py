"""What the lane keeps across ticks of one run (a tick makes a fresh lane object)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from .admission import ConflictIndex

__all__ = ["RunMemo", "run_memo"]

# Kept across ticks (a tick makes a fresh `_Lane`), per (project, run): the run's conflict
# relation (see conflictindex.py) and the keys the target's board marks done at the target
# commit last read. A handful of runs at most.
_MEMO_RUNS = 16
_memo: OrderedDict[tuple[str, str], "RunMemo"] = OrderedDict()
_memo_lock = threading.Lock()


class RunMemo:
    def __init__(self):
        self.lock = threading.Lock()  # one lane per run, but a test may also tick by hand
        self.index = ConflictIndex()
        self.board_done: tuple[str, frozenset[str]] | None = None  # (target sha, done keys)
        self.rows: dict = {}  # the run's stories' rows as last read, by id (runs.lane_rows)


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
