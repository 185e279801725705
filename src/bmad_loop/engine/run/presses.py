"""Ctrl+C presses, counted for `run` and `resume` (`consumers.drive` acts on them).

Kept apart from the driver (consumers.py) and free of heavy imports: the command installs the
counter first thing, so a Ctrl+C during start-up (imports, planning, enqueue) is counted rather
than raised.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Callable, Union

__all__ = ["Interrupts"]

# What `signal.signal` gives back: a handler, SIG_DFL / SIG_IGN, or None (not set from Python).
Handler = Union[Callable[[int, FrameType | None], Any], int, signal.Handlers, None]


@dataclass
class Interrupts:
    """Ctrl+C presses, counted by a SIGINT handler (`install`). `notice(presses)` is called
    after the driver acted on a press (its stop is recorded), so it can say what happens next."""

    notice: Callable[[int], None] | None = None
    count: int = 0
    woke: threading.Event = field(default_factory=threading.Event)
    driving: bool = False  # before: a first press waits for the run to start, a second aborts
    previous: Handler = None  # the SIGINT handler `counting` replaced

    def press(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        self.count += 1
        self.woke.set()
        if not self.driving and self.count >= 2:
            raise KeyboardInterrupt

    @classmethod
    def counting(cls) -> "Interrupts":
        """The process's counter, installed now (the command's first line): a signal handler
        is the process's, so is its count; the driver finds it with `installed`."""
        global _installed
        _installed = cls()
        _installed.previous = _installed.install()
        return _installed

    @staticmethod
    def installed() -> "Interrupts | None":
        return _installed

    def release(self) -> None:
        """The command is over: SIGINT goes back to the handler it had (a test runner's)."""
        global _installed
        if _installed is self:
            _installed = None
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def install(self) -> Handler:
        """Count SIGINT here (main thread only); returns the handler it replaced, or None."""
        if threading.current_thread() is not threading.main_thread():
            return None
        return signal.signal(signal.SIGINT, self.press)


_installed: Interrupts | None = None
