"""Stall detection for agent sessions: silent *and* idle for `[adapter] stall_s` seconds.

A session is alive while its log grows or any process of its tree uses CPU. Either alone is
not enough: an agent waiting on a long test run inside a tool call prints nothing for minutes
while the tests burn CPU, and an agent streaming tokens from a remote model uses almost no CPU
while it prints. Only a session that does neither for `stall_s` (a hung network read, a prompt
waiting for input that will never come) is stalled, and `process.supervise` kills it.

The process tree is `proctree.session_processes` (descendants, group, session and the session's
marker variable), sampled every `sample_s` rather than on every poll: walking every process of
the machine is not free. CPU is compared per process, keyed by pid and start time, so a child
that exits (taking its CPU time with it) never hides the CPU its siblings use, and a new child
counts as activity by itself.

`last_output_at` is what `status --json` shows as a story's `last_output_at`: the session log's
modification time, read from the file system (no database write per line of output).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import Callable

import psutil

from .. import proctree

__all__ = ["StallWatch", "last_output_at", "tree_cpu"]


def last_output_at(log_path: str | os.PathLike | None) -> dt.datetime | None:
    """When the log at `log_path` last grew (its mtime, UTC), or None without a readable log."""
    if not log_path:
        return None
    try:
        mtime = Path(log_path).stat().st_mtime
    except OSError:
        return None
    return dt.datetime.fromtimestamp(mtime, dt.timezone.utc)


def tree_cpu(root: int, marker: tuple[str, str] | None = None,
             since: float | None = None) -> dict[tuple[int, float], float]:
    """(pid, start time) -> CPU seconds (user + system, own and reaped children) of every
    process of the session rooted at `root` (which started at or after `since`, when given)."""
    cpu: dict[tuple[int, float], float] = {}
    for pid, process in proctree.session_processes(root, marker, since=since).items():
        try:
            with process.oneshot():
                times = process.cpu_times()
                started = process.create_time()
        except (psutil.Error, OSError):
            continue  # gone between the walk and the read
        cpu[(pid, started)] = (times.user + times.system
                               + getattr(times, "children_user", 0.0)
                               + getattr(times, "children_system", 0.0))
    return cpu


class StallWatch:
    """Watches one session; `stalled()` says whether it has been silent and idle for `stall_s`.

    `clock` and `sample` are the seams a test could turn; the defaults are the monotonic clock
    and `tree_cpu` of the session's root.
    """

    def __init__(self, stall_s: float, log_path: str | os.PathLike, sample: Callable[[], dict], *,
                 sample_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """`sample()`: the CPU times of the session's processes (`tree_cpu`), by process."""
        self.stall_s = float(stall_s)
        self.log_path = Path(log_path)
        self.sample_s = sample_s if sample_s is not None else min(max(self.stall_s / 5, 0.1), 5.0)
        self._clock = clock
        self._sample = sample
        now = clock()
        self._last_active = now
        # The first sample is due one `sample_s` in, not at once: the session is active as it
        # starts, and a walk of every process of the machine (~7 ms of CPU with 85 processes
        # here) would compete with the agent's own start. That sample has no baseline, so its
        # processes are all new, i.e. active: a session that never does anything is found
        # stalled `sample_s` later than `stall_s` (at most a fifth of it), never earlier.
        self._next_sample = now + self.sample_s
        self._size = self._log_size()
        self._cpu: dict = {}

    @classmethod
    def of_tree(cls, stall_s: float, log_path: str | os.PathLike, root: int, *,
                marker: tuple[str, str] | None = None, since: float | None = None) -> "StallWatch":
        """A watch on the process tree of `root` (and the processes carrying `marker`, started
        since `since`)."""
        return cls(stall_s, log_path, lambda: tree_cpu(root, marker, since))

    @property
    def quiet_s(self) -> float:
        """Seconds since the session last printed or used CPU (as of the last sample)."""
        return self._clock() - self._last_active

    def stalled(self) -> bool:
        """Sample when due; True once nothing happened for `stall_s` seconds."""
        now = self._clock()
        if now >= self._next_sample:
            self._next_sample = now + self.sample_s
            if self._active():
                self._last_active = now
        return now - self._last_active >= self.stall_s

    def _active(self) -> bool:
        size = self._log_size()
        cpu = self._sample()
        grew = size != self._size
        busy = any(cpu.get(key, 0.0) > self._cpu.get(key, -1.0) for key in cpu)
        self._size, self._cpu = size, cpu
        return grew or busy

    def _log_size(self) -> tuple[int, int]:
        """Size and modification time: a log at its cap (`logcap`) rolls without growing."""
        try:
            info = self.log_path.stat()
        except OSError:
            return (-1, -1)
        return (info.st_size, info.st_mtime_ns)
