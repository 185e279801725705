"""Process trees, portably: find what a session started, read a process's environment, end them.

Everything here goes through psutil and POSIX calls (`os.killpg`, `os.getpgid`, `os.getsid`),
never through /proc, so it works the same on Linux and macOS.

A session is found by `session_processes`: the root's descendants by parent pid (so a grandchild
that called setsid is found while its parent still lives), the members of the root's process
group and session, and any process whose environment carries a private marker variable (so a
daemon that double-forked away from the tree is found too). This is best effort: a process that
both left the tree and scrubbed its environment cannot be told apart from the rest of the
machine. The processes are psutil handles, which remember their creation time: a handle whose pid
was recycled counts as gone and is never signalled.

`end_tree` signals SIGTERM, waits a grace, looks again, then SIGKILLs. It polls liveness itself
rather than using `psutil.wait_procs`, which reaps a child of ours (the agent must stay unreaped
until the last signal, so its pid and group id cannot be recycled) and counts a zombie as alive.

`kill_marked` is for what a dead (or fenced) bmad-loop left behind: every process whose
environment passes a test (e.g. "names this run and story"), with its whole session, SIGKILLed
at once and waited for. `started_at`/`is_running` identify a process by pid *and* start time, so
an owner recorded as `pid:start` is never confused with a later process that got its pid.
(Keeping bmad-loop thawed while a step runs is `thaw`'s job.)
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Mapping

import psutil
from .caches import CACHES

__all__ = [
    "ExitWaiter",
    "alive",
    "end_tree",
    "environ_of",
    "is_running",
    "kill_marked",
    "session_processes",
    "signal_group",
    "started_at",
]

_POLL_S = 0.02
_START_SLACK_S = 1.0  # psutil's start times can be rounded (to clock ticks on Linux)


def environ_of(pid: int) -> dict[str, str] | None:
    """The environment of process `pid`, or None when it is gone, a zombie or not ours to read."""
    try:
        return psutil.Process(pid).environ()
    except (psutil.Error, OSError):
        return None


def alive(process: psutil.Process) -> bool:
    """Is the process behind this handle still running (same pid, same start, not a zombie)?"""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def session_processes(root: int, marker: tuple[str, str] | None = None, *,
                      tree: bool = True, since: float | None = None) -> dict[int, psutil.Process]:
    """pid -> handle of every process belonging to the session rooted at `root`.

    `marker` is a `(name, value)` environment variable that only the session's processes carry.
    `tree=False` (the root was already reaped, its pid may be reused) skips the walk by parent pid
    and the group/session match, leaving only the marker. This process and pid 1 are never listed.
    `since` (the start time of the session's first process, as `start_time` reads it): a process
    that started earlier cannot carry the marker, which is made for the session and handed only
    to its processes, so its environment is not read (that read is most of this walk's cost on
    a machine with many processes). `_START_SLACK_S` covers start times that are rounded.
    """
    found: dict[int, psutil.Process] = {}
    if tree:
        try:
            top = psutil.Process(root)
            found[root] = top
            # A root that exited (a zombie until it is reaped) has no children left: the kernel
            # gave them to init or a subreaper as it exited, and the group/session match below
            # finds them. The walk by parent pid reads every process, so it is skipped then.
            if top.status() != psutil.STATUS_ZOMBIE:
                for child in top.children(recursive=True):
                    found.setdefault(child.pid, child)
        except (psutil.Error, OSError):
            pass
    # Fresh handles from psutil.pids(), not process_iter(): its cached handles may predate a pid's
    # reuse, and a stale handle would hide the process now behind that pid.
    for pid in psutil.pids():
        if pid in found:
            continue
        if not (tree and _in_group_or_session(pid, root)) and not _carries(pid, marker, since):
            continue
        try:
            found[pid] = psutil.Process(pid)
        except (psutil.Error, OSError):
            pass
    found.pop(os.getpid(), None)
    found.pop(1, None)
    return found


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to process group `pgid`; a group that is gone or not ours is left alone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def end_tree(root: int, *, marker: tuple[str, str] | None = None, grace_s: float = 3.0,
             tree: bool = True, since: float | None = None) -> None:
    """End the session rooted at `root`: SIGTERM, up to `grace_s` of grace, then SIGKILL.

    Each signal goes to the group `root` (when `tree`) and to every process of
    `session_processes(root, marker, tree=tree)`; the processes are looked for again after the
    grace, so whatever was started during it is killed too. Nothing is reaped here.
    """
    group = root if tree else None
    targets = session_processes(root, marker, tree=tree, since=since)
    if not _any_alive(targets):
        return
    _signal_all(group, targets, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _any_alive(targets):
        time.sleep(_POLL_S)
    targets.update(session_processes(root, marker, tree=tree, since=since))
    _signal_all(group, targets, signal.SIGKILL)


def start_time(pid: int | None = None) -> float | None:
    """The start time of process `pid` (default: this one), as psutil reports it; None if gone."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def started_at(pid: int | None = None) -> float:
    """`start_time`, with 0.0 for a process that is gone."""
    return start_time(pid) or 0.0


_OWN_STARTS: dict[int, float | None] = {}
CACHES.register("proctree.own_start", _OWN_STARTS.clear, bound="one per pid this process had",
               holds="this process's pid -> its start time")


def own_start_time() -> float | None:
    """This process's `start_time`, read once (keyed by pid: a forked child reads its own)."""
    pid = os.getpid()
    if pid not in _OWN_STARTS:
        _OWN_STARTS[pid] = start_time(pid)
    return _OWN_STARTS[pid]


def is_running(pid: int, start: float | None = None, *, tolerance_s: float = 0.01) -> bool:
    """Is `pid` alive (not a zombie) and, when `start` is given, the process that started then
    (within `tolerance_s`: a start time read back from a file may be rounded)?"""
    try:
        process = psutil.Process(pid)
        if start is not None and abs(process.create_time() - start) > tolerance_s:
            return False  # the pid was recycled
        return process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def kill_marked(matches: Callable[[Mapping[str, str]], bool], *, token_var: str | None = None,
                wait_s: float = 3.0) -> list[int]:
    """SIGKILL every process whose environment passes `matches`, with its session; the pids.

    For each match the kill also takes its descendants, the members of its process group and
    session when it leads them (an agent or a verify command does), and every process carrying
    the same `token_var` value (a double-forked daemon). Waits up to `wait_s` for them
    to be gone (a zombie counts as gone), so a step retried after this never meets them.
    This process and pid 1 are never touched.
    """
    targets: dict[int, psutil.Process] = {}
    for pid in psutil.pids():
        if pid in targets or pid in (os.getpid(), 1):
            continue
        env = environ_of(pid)
        if env is None or not matches(env):
            continue
        token = env.get(token_var) if token_var else None
        marker = (token_var, token) if token_var and token else None
        targets.update(session_processes(pid, marker, tree=True))
    if not targets:
        return []
    for pid, process in targets.items():
        if _leads_group(pid):
            signal_group(pid, signal.SIGKILL)
    _signal_all(None, targets, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while _any_alive(targets) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return sorted(targets)


class ExitWaiter:
    """Waits for a child to exit without reaping it, so its pid (and group id) stay reserved
    until its tree is cleaned up. Uses a pidfd where there is one (Linux 5.3+); elsewhere polls
    psutil for the zombie; only when neither can tell falls back to `Popen.poll`, which reaps."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self._proc = proc
        try:
            self._fd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self._fd = None
        self._handle: psutil.Process | None = None
        if self._fd is None:
            try:
                self._handle = psutil.Process(proc.pid)
            except (psutil.Error, OSError):
                self._handle = None

    def wait(self, timeout_s: float) -> bool:
        """True once the child has exited; False when `timeout_s` passed first."""
        if self._fd is not None:
            readable, _, _ = select.select([self._fd], [], [], max(0.0, timeout_s))
            return bool(readable)
        deadline = time.monotonic() + max(0.0, timeout_s)
        while not self._exited():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(_POLL_S, remaining))
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _exited(self) -> bool:
        if self._handle is not None:
            try:
                return self._handle.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True  # reaped elsewhere
            except (psutil.Error, OSError):
                self._handle = None  # cannot tell: fall back to Popen
        return self._proc.poll() is not None


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def _in_group_or_session(pid: int, root: int) -> bool:
    try:
        return os.getpgid(pid) == root or os.getsid(pid) == root
    except OSError:
        return False


def _carries(pid: int, marker: tuple[str, str] | None, since: float | None = None) -> bool:
    if marker is None:
        return False
    try:
        process = psutil.Process(pid)
        if since is not None and process.create_time() < since - _START_SLACK_S:
            return False
        env = process.environ()
    except (psutil.Error, OSError):
        return False  # gone, a zombie or not ours to read
    return env.get(marker[0]) == marker[1]


def _any_alive(targets: Mapping[int, psutil.Process]) -> bool:
    return any(alive(p) for p in targets.values())


def _signal_all(pgid: int | None, targets: Mapping[int, psutil.Process], sig: int) -> None:
    if pgid is not None:
        signal_group(pgid, sig)
    for process in targets.values():
        if alive(process):
            try:
                process.send_signal(sig)  # psutil refuses a pid that was recycled
            except (psutil.Error, OSError):
                pass
