"""Session and verify logs with a ceiling (`[limits] max_log_bytes`), kept on disk as they grow.

A log never grows past its cap, not even for a moment: the process's output comes through a pipe
(`LogPump`, one bounded read at a time) and `CappedLog` writes it. The first half of the cap is
the output's first bytes, exactly. Once the output would pass the cap, a fixed marker line goes
at the half (`CUT_MARKER`), and after it a rolling tail: when the tail is full, its newer half
is copied down over its older half and the file truncated, so what follows the marker is always
a run of the output's last bytes — between a quarter and a half of the cap once the output is
long. Memory stays one read (64 KiB) and one copy block (1 MiB), whatever the output.

Followers (`attach`) need to know where the tail moved: a small side file `<log>.cut` says
where the tail starts, how many bytes were dropped so far, and whether a copy is under way
(`moving`). A reader that sees the same `dropped` before and after its read, and no move,
read a consistent tail.

A write the disk refuses (a full disk, an I/O error) is not retried: the log keeps what it had,
the rest of the output is drained and dropped (the process is never blocked on its output), and
the error is reported with the count (`CappedLog.error`, `CappedLog.lost`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CappedLog", "LogPump", "CutState", "read_cut", "cut_marker", "MIN_CAP"]

MIN_CAP = 64 * 1024
_READ = 64 * 1024
_COPY = 1 << 20
DRAIN_S = 5.0  # how long the pipe is still read once the process tree has ended


def cut_marker(cap: int) -> bytes:
    """The line at the gap (fixed for a given cap, so it can be found and never moves)."""
    return (f"\n=== bmad-loop: output cut here (max_log_bytes {cap}): the first {cap // 2} bytes "
            f"are above, the output's last bytes below ===\n").encode()


@dataclass(frozen=True)
class CutState:
    marker_at: int  # where the marker line starts (the cap's half)
    tail: int  # where the rolling tail starts (just after the marker)
    dropped: int  # bytes of output dropped at the gap so far
    rolled: int  # of those, dropped by rolling the tail: what every later byte moved down by
    moving: bool  # a copy of the tail is under way


def read_cut(log: Path) -> CutState | None:
    """The cut of `log` as its side file says, or None (not cut, or unreadable)."""
    try:
        data = json.loads(Path(f"{log}.cut").read_text())
        return CutState(int(data["marker_at"]), int(data["tail"]), int(data["dropped"]),
                        int(data["rolled"]), bool(data["moving"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class CappedLog:
    """Appends to `path`, never past `cap` bytes (None: no cap). `write` never raises OSError."""

    def __init__(self, path: Path, cap: int | None):
        self.path = Path(path)
        self.cap = max(cap, MIN_CAP) if cap else None
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.size = os.fstat(self._fd).st_size
        self._cut = self._earlier_cut()  # an earlier command's (a verify log)
        self.dropped = 0  # bytes this writer dropped at the gap
        self.rolled = 0  # of those, by rolling the tail
        self.lost = 0  # bytes this writer could not write at all (error)
        self.error: str | None = None

    def tell(self) -> int:
        return self.size

    def _earlier_cut(self) -> CutState | None:
        """The cut an earlier writer of this file made, if the side file and the file agree
        (the marker in its place at this cap's half); else none."""
        if not self.cap:
            return None
        cut = read_cut(self.path)
        if cut is None:
            return None
        marker = cut_marker(self.cap)
        if (cut.marker_at, cut.tail) != (self.cap // 2, self.cap // 2 + len(marker)) \
                or cut.tail > self.size or cut.moving:
            return None
        if os.pread(self._fd, len(marker), cut.marker_at) != marker:
            return None
        return cut

    def moved(self, offset: int) -> int:
        """Where a byte that was at `offset` when this writer began is now: unchanged in the
        head; in the tail, earlier by what this writer dropped (at most the tail's start)."""
        if self._cut is None or offset < self._cut.marker_at:
            return offset
        return max(self._cut.tail, offset - self.rolled)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.error is not None:
                self.lost += len(view)
                return
            try:
                taken = self._write_some(view)
            except OSError as exc:
                self.error = exc.strerror or str(exc)
                continue
            view = view[taken:]

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ inside
    def _write_some(self, view: memoryview) -> int:
        """Write a first part of `view`; returns how many bytes were taken."""
        self.size = max(self.size, os.fstat(self._fd).st_size)  # a note appended by another
        if self.cap is None or (self._cut is None and self.size + len(view) <= self.cap):
            return self._append(view)
        cut = self._cut
        if cut is None:
            head_room = self.cap // 2 - self.size
            if head_room > 0:
                return self._append(view[:head_room])
            cut = self._make_cut(self.cap)
        budget = self.cap - cut.tail
        piece = view[:max(1, budget // 2)]
        if self.size + len(piece) > self.cap:
            self._roll(cut, keep=budget // 2)
        return self._append(piece)

    def _append(self, view: memoryview) -> int:
        written = os.pwrite(self._fd, view, self.size)
        self.size += written
        return written

    def _make_cut(self, cap: int) -> CutState:
        marker = cut_marker(cap)
        at = cap // 2
        os.pwrite(self._fd, marker, at)
        overwritten = max(0, min(self.size, at + len(marker)) - at)
        self.dropped += overwritten
        self.size = max(self.size, at + len(marker))
        self._cut = CutState(at, at + len(marker), overwritten, 0, False)
        self._save(self._cut)
        return self._cut

    def _roll(self, cut: CutState, keep: int) -> None:
        """Copy the tail's last `keep` bytes down to its start and truncate after them."""
        source = self.size - keep
        self._cut = dataclasses.replace(cut, moving=True)
        self._save(self._cut)
        done = 0
        while done < keep:
            block = os.pread(self._fd, min(_COPY, keep - done), source + done)
            if not block:
                break
            os.pwrite(self._fd, block, cut.tail + done)
            done += len(block)
        os.ftruncate(self._fd, cut.tail + keep)
        dropped = source - cut.tail
        self.dropped += dropped
        self.rolled += dropped
        self.size = cut.tail + keep
        self._cut = CutState(cut.marker_at, cut.tail, cut.dropped + dropped, cut.rolled + dropped,
                             False)
        self._save(self._cut)

    def _save(self, cut: CutState) -> None:
        side = Path(f"{self.path}.cut")
        temp = side.with_name(side.name + ".tmp")
        try:
            temp.write_text(json.dumps(dataclasses.asdict(cut)))
            os.replace(temp, side)
        except OSError:
            pass  # only followers read it; the log itself is what counts


class LogPump:
    """Reads a pipe in a thread of its own and writes what comes into a `CappedLog`."""

    def __init__(self, fd: int, log: CappedLog):
        self._fd = fd
        self._log = log
        self._done = threading.Event()
        name = f"bmad-log-{log.path.parent.name}-{log.path.stem}"  # e.g. bmad-log-1-2-beta-dev-1
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def _run(self) -> None:
        drained_by = None
        while True:
            if self._done.is_set():
                drained_by = drained_by or time.monotonic() + DRAIN_S
                if time.monotonic() > drained_by:
                    return  # something that escaped the kill keeps writing: stop listening
            try:
                ready, _, _ = select.select([self._fd], [], [], 0.1)
                if not ready:
                    if self._done.is_set():
                        return  # all drained; a writer still holding the pipe is ignored
                    continue
                data = os.read(self._fd, _READ)
            except OSError:
                return
            if not data:
                return
            self._log.write(data)

    def finish(self) -> None:
        """Drain what the pipe still holds, then stop and close it."""
        self._done.set()
        self._thread.join()
        os.close(self._fd)
