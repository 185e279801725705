"""Keeping this process thawed while its steps are open.

A step (an agent session, a verify command) can stop the bmad-loop process that runs it
(`kill -STOP $PPID`). SIGSTOP freezes every thread, so nothing inside the process can undo it; a
helper process does. There is one helper per bmad-loop process, started by the first step that
asks for one, before that step's own process starts (so a step that stops bmad-loop at once cannot
beat it), and reused by every later step and by every thread. Its stdin is a pipe from this
process, one line per message:

    open <id> <after_s> <note>   a step began; note: the step's log (percent-encoded, `-` for none)
    close <id>                   that step ended

While at least one step is open the helper looks at this process every `_TICK_S`; once it has
stayed stopped (SIGSTOP, SIGTSTP; not a debugger's tracing stop) for the smallest `after_s` of
the open steps, it sends SIGCONT and writes a line into the note of every open step. While no
step is open it only blocks on the pipe (and on a pidfd of this process, where there is one): it
takes no CPU, and a user's Ctrl+Z of bmad-loop between steps is left alone. It exits at the
pipe's end (this process exited or died) or when this process is gone (pid and start time). It
runs in a session of its own (Ctrl+C or Ctrl+Z at the terminal does not reach it), from `/`,
without the `BMAD_LOOP_*` variables (orphan recovery must not take it for a step's leftover).

A helper that is gone (killed, exited), stopped, or no longer reads its pipe is found at the
next open (`poll()`, its status, a broken or full pipe), reaped, and replaced; the new one is told
of every step still open.
"""

from __future__ import annotations

import itertools
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote_from_bytes, unquote_to_bytes

import psutil

from .. import proctree

__all__ = ["Guard", "guard", "helper_pid"]

_TICK_S = 0.1  # how often an open step's process is looked at
_NO_NOTE = "-"


class Guard:
    """One open step: while it is open, the helper continues this process when it stays stopped
    for `after_s`, noting it in `note`. `close()` (or leaving the `with` block) ends the step.
    With no `after_s` the guard does nothing."""

    def __init__(self, after_s: float | None, note: os.PathLike | str | None = None) -> None:
        self._id: int | None = None
        if not after_s:
            return
        # Absolute: the helper runs from `/`.
        where = quote_from_bytes(os.fsencode(os.path.abspath(note))) if note else _NO_NOTE
        with _lock:
            self._id = next(_ids)
            _open[self._id] = f"open {self._id} {float(after_s)!r} {where}\n"
            _deliver(_open[self._id], start=True)

    def close(self) -> None:
        with _lock:
            ident, self._id = self._id, None
            if ident is None or _open.pop(ident, None) is None:
                return  # closed already, or opened in the process this one was forked from
            _deliver(f"close {ident}\n", start=False)

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


guard = Guard


def helper_pid() -> int | None:
    """The pid of this process's helper while it runs, else None."""
    with _lock:
        if _helper is None or _helper.proc.poll() is not None:
            return None
        return _helper.proc.pid


# --------------------------------------------------------------------------- this process's side


class _Helper:
    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdin is not None  # _spawn opens it with stdin=PIPE
        self.proc = proc
        self.stdin = proc.stdin
        self.fd = proc.stdin.fileno()
        os.set_blocking(self.fd, False)  # a helper that stopped reading must not block a step
        try:
            self.handle: psutil.Process | None = psutil.Process(proc.pid)
        except (psutil.Error, OSError):
            self.handle = None

    def usable(self) -> bool:
        """Alive and able to act: not exited (poll() reaps it if it did), not stopped."""
        if self.proc.poll() is not None:
            return False
        try:
            return self.handle is None or self.handle.status() not in _STOPPED
        except (psutil.Error, OSError):
            return False

    def write(self, text: str) -> bool:
        data = text.encode()
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:  # BrokenPipeError (it died), BlockingIOError (its pipe is full)
            return False
        return True

    def retire(self) -> None:
        """Kill and reap it: no zombie is left behind by a living bmad-loop."""
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        try:
            self.stdin.close()
        except OSError:
            pass


_STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
_lock = threading.Lock()
_helper: _Helper | None = None
_open: dict[int, str] = {}  # id -> its open line, told again to a replacement helper
_ids = itertools.count(1)


def _deliver(line: str, *, start: bool) -> None:
    """Hand `line` to the helper; with `start`, start one (or a replacement) when needed."""
    global _helper
    for _ in range(2):
        helper = _helper
        if helper is not None and not helper.usable():
            helper.retire()
            helper = _helper = None
        fresh = helper is None
        if helper is None:
            if not start:
                return  # nothing to close in a helper that knows no step
            helper = _helper = _spawn()
            if helper is None:
                return  # best effort: the step runs unguarded
        if helper.write("".join(_open.values()) if fresh else line):
            return
        helper.retire()
        _helper = None


def _spawn() -> _Helper | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BMAD_LOOP_")}
    # The helper runs from `/`: it must still import this copy of the package.
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    pid = os.getpid()
    argv = [sys.executable, "-m", "bmad_loop.agents.thaw", str(pid), repr(proctree.own_start_time() or 0.0)]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                                env=env, cwd="/")
    except OSError:
        return None
    return _Helper(proc)


def _forget_after_fork() -> None:
    """A forked child has its own pid: it must not use (or keep open) its parent's helper."""
    global _lock, _helper
    _lock = threading.Lock()
    if _helper is not None:
        try:
            _helper.stdin.close()  # so the parent's helper still sees its pipe end
        except OSError:
            pass
    _helper = None
    _open.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


# --------------------------------------------------------------------------- the helper's side


def _serve(pid: int, start: float) -> None:
    """The helper's loop, watching process `pid` (started at `start`) for its open steps."""
    try:
        exit_fd: int | None = os.pidfd_open(pid)  # readable once `pid` exits
    except (AttributeError, OSError):
        exit_fd = None
    if not proctree.is_running(pid, start):
        return
    watched = [0] if exit_fd is None else [0, exit_fd]
    steps: dict[str, tuple[float, str]] = {}
    pending = b""
    stopped_since: float | None = None
    while True:
        readable, _, _ = select.select(watched, [], [], _TICK_S if steps else None)
        if exit_fd is not None and exit_fd in readable:
            return
        if 0 in readable:
            data = os.read(0, 65536)
            if not data:
                return  # the pipe's end: the process that started us exited or died
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                _apply(steps, line.decode("ascii", "replace"))
        if not steps:
            stopped_since = None  # a stop while no step is open is none of our business
            continue
        if not proctree.is_running(pid, start):
            return
        try:
            stopped = psutil.Process(pid).status() == psutil.STATUS_STOPPED
        except (psutil.Error, OSError):
            return
        if not stopped:
            stopped_since = None
            continue
        stopped_since = stopped_since or time.monotonic()
        held = time.monotonic() - stopped_since
        if held >= min(after_s for after_s, _ in steps.values()):
            os.kill(pid, signal.SIGCONT)
            stopped_since = None
            _note(pid, held, {note for _, note in steps.values() if note})


def _apply(steps: dict[str, tuple[float, str]], line: str) -> None:
    parts = line.split(" ")
    try:
        if parts[0] == "open" and len(parts) == 4:
            note = "" if parts[3] == _NO_NOTE else os.fsdecode(unquote_to_bytes(parts[3]))
            steps[parts[1]] = (float(parts[2]), note)
        elif parts[0] == "close" and len(parts) == 2:
            steps.pop(parts[1], None)
    except ValueError:
        pass  # not a message of ours: ignored


def _note(pid: int, held: float, notes: set[str]) -> None:
    line = (f"\n=== bmad-loop (pid {pid}) was stopped for {held:.1f}s while this step ran: "
            "continued (SIGCONT) ===\n").encode()
    for note in sorted(notes):
        try:
            with open(note, "ab") as handle:
                handle.write(line)
        except OSError:
            pass  # the log is gone: the continuation itself is what matters


if __name__ == "__main__" and len(sys.argv) == 3:
    _serve(int(sys.argv[1]), float(sys.argv[2]))
