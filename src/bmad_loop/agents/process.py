"""Supervising one process to its end: an agent session or a verify command.

`supervise` runs a `Command` with no shell, stdin = /dev/null and stdout+stderr appended to a log
between a header and a footer line, and ends it — whole tree — when its `Limits` say so: the
timeout, a stop request, a stall (`stallwatch`). Ending a session ends everything it started:
the process is the leader of its own session and group (`start_new_session=True`); bmad-loop
sends SIGTERM, waits a short grace, then SIGKILL, each to the whole group *and* to every process
of the session as `proctree` finds it (descendants, group and session members, and any process
whose environment carries the session's private `BMAD_LOOP_SESSION_TOKEN`, so a daemon that
double-forked away is found too). Nothing is reaped before the last signal, so a recycled pid is
never hit.

Every process started here also carries `BMAD_LOOP_OWNER` = `host:pid:start` of the bmad-loop
process that started it, so orphan recovery can tell a leftover of a dead bmad-loop from the
live work of another one (`engine/recovery.py`). The output comes through a pipe into the log
(`logcap`: capped at `[limits] max_log_bytes`, one read at a time in memory).
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from enum import Enum, auto
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from .. import proctree
from . import thaw
from ..errors import ConfigError
from ..hostid import host_name
from .logcap import CappedLog, LogPump
from .stallwatch import StallWatch

__all__ = ["Command", "Limits", "LogCut", "AgentResult", "supervise", "SESSION_TOKEN_VAR",
           "OWNER_VAR", "owner_marker", "parse_owner"]

SESSION_TOKEN_VAR = "BMAD_LOOP_SESSION_TOKEN"  # private marker used to find escaped descendants
OWNER_VAR = "BMAD_LOOP_OWNER"  # host:pid:start of the bmad-loop process that started the session
_HEADER_ARGV_MAX = 2000


@dataclass(frozen=True)
class Command:
    """What to run: `argv` (no shell) in `cwd` with exactly `env`; `label` names it in the log's
    header and footer (default: from the `BMAD_LOOP_*` phase, attempt and story in `env`)."""

    argv: Sequence[str]
    cwd: Path
    env: Mapping[str, str]
    label: str | None = None
    # The log's header: `shown`, what the user configured (the agent's or verify's own command
    # line; default `argv`), then `note` on a line of its own (the box it runs in). The argv a
    # box wraps it in is kilobytes of mounts: the journal has it, the header does not.
    shown: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class Limits:
    """When bmad-loop ends the process itself.

    `timeout_s`: its whole run. `stall_s`: silent and idle that long (`stallwatch`).
    `max_log_bytes`: the log never grows past it (its first half, a marker, a rolling last
    half). `thaw_after_s`: this process's thaw helper continues bmad-loop when the child
    stopped it (SIGSTOP) that long, so a stopped bmad-loop never outlasts its lease by much.
    `poll_s`: how often a stop request and a stall are looked at; `kill_grace_s`: between
    SIGTERM and SIGKILL."""

    timeout_s: float
    stall_s: float | None = None
    max_log_bytes: int | None = None
    thaw_after_s: float | None = None
    poll_s: float = 0.2
    kill_grace_s: float = 3.0


@dataclass(frozen=True)
class LogCut:
    """What a session's log could not keep: `dropped` at the gap (the cap), `lost` to an error."""

    dropped: int
    lost: int
    error: str | None
    max_log_bytes: int | None

    def event_data(self) -> dict:
        return {"dropped_bytes": self.dropped, "lost_bytes": self.lost, "error": self.error,
                "max_log_bytes": self.max_log_bytes}


@dataclass(frozen=True)
class AgentResult:
    """How a session ended.

    `exit_code` is the agent's own exit status (negative: killed by that signal from elsewhere), or
    None when bmad-loop ended it (`timed_out` or `interrupted`). `log_start`/`log_end` are the byte
    offsets of this session's output in the log, header and footer lines excluded.
    """

    exit_code: int | None
    timed_out: bool
    interrupted: bool
    duration_s: float
    pid: int
    log_start: int = 0
    log_end: int = 0
    stalled: bool = False  # killed by bmad-loop: no output and no CPU for `stall_s` (stallwatch)
    log_cut: LogCut | None = None  # the log passed its cap, or could not be written

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.interrupted


def supervise(command: Command, log_path: Path, limits: Limits, *,
              stop_event: threading.Event | None = None,
              on_start: Callable[[int], None] | None = None) -> AgentResult:
    """Run `command` to its end and return how it ended. `on_start(pid)` is called right after
    the spawn. The tree is killed when `limits.timeout_s` passes (`timed_out`), `stop_event` is
    set (`interrupted`) or the process stalls (`stalled`); what it left running when it exits by
    itself is ended too. Any exception while waiting (Ctrl+C too) kills the tree first."""
    if not command.argv:
        raise ConfigError("[adapter] command: the agent command is empty")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    env = {**{str(k): str(v) for k, v in command.env.items()},
           SESSION_TOKEN_VAR: token, OWNER_VAR: owner_marker()}
    label = command.label or _label_from_env(env)

    with CappedLog(log_path, limits.max_log_bytes) as log:
        log.write(_header(command, label))
        log_start = log.tell()
        started = time.monotonic()
        # The thaw helper is up before the child starts (a child that stops bmad-loop at once
        # would freeze it for good); the first step of this process starts it.
        thawer = thaw.guard(limits.thaw_after_s, log_path)
        proc, pump = _start(command.argv, command.cwd, env, log, label, thawer)
        # The child's start, as the process table tells it: nothing older is the session's, and
        # its descendants' start times are read on the same clock (None: search them all).
        since = proctree.start_time(proc.pid)
        waiter = proctree.ExitWaiter(proc)
        watch = (StallWatch.of_tree(limits.stall_s, log_path, proc.pid, since=since,
                                    marker=(SESSION_TOKEN_VAR, token)) if limits.stall_s else None)
        try:
            if on_start is not None:
                on_start(proc.pid)
            ending = _wait(waiter, started + limits.timeout_s, limits.poll_s, stop_event, watch)
        except BaseException:
            _end_session(proc, token, limits.kill_grace_s, since)
            waiter.close()
            thawer.close()
            pump.finish()
            log.write(f"=== bmad-loop {label} killed: bmad-loop itself was interrupted ===\n".encode())
            raise
        waiter.close()
        thawer.close()
        _end_session(proc, token, limits.kill_grace_s, since)
        pump.finish()
        duration = time.monotonic() - started
        log_end = log.tell()
        log_start = log.moved(log_start)  # where the session's start is now (the tail rolls)
        newline = b"" if log_end == log_start or _last_byte(log_path) == b"\n" else b"\n"
        how = _how_it_ended(ending, proc.returncode, limits)
        log.write(newline + f"=== bmad-loop {label} {how} ({duration:.1f}s) ===\n".encode())

    return AgentResult(
        exit_code=None if ending else proc.returncode,
        timed_out=ending is Ending.TIMED_OUT, interrupted=ending is Ending.INTERRUPTED,
        duration_s=duration, pid=proc.pid, log_start=log_start, log_end=log_end,
        stalled=ending is Ending.STALLED,
        log_cut=LogCut(log.dropped, log.lost, log.error, limits.max_log_bytes)
        if log.dropped or log.error else None,
    )


class Ending(Enum):
    """Why bmad-loop ended a session itself (a session that exits on its own has no Ending)."""
    TIMED_OUT = auto()
    INTERRUPTED = auto()
    STALLED = auto()


def _wait(waiter, deadline: float, poll_s: float, stop_event, watch) -> Ending | None:
    """Until the process exits (None) or bmad-loop must end it (the Ending)."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Ending.TIMED_OUT
        if waiter.wait(remaining if stop_event is None and watch is None else min(poll_s, remaining)):
            return None
        if stop_event is not None and stop_event.is_set():
            return Ending.INTERRUPTED
        if watch is not None and watch.stalled():
            return Ending.STALLED


def _how_it_ended(ending: Ending | None, returncode: int | None, limits: Limits) -> str:
    if ending is Ending.TIMED_OUT:
        return f"timed out after {limits.timeout_s:g}s: process tree killed"
    if ending is Ending.INTERRUPTED:
        return "stopped: process tree killed"
    if ending is Ending.STALLED:
        return f"stalled: no output and no CPU for {limits.stall_s:g}s: process tree killed"
    return f"exited {returncode}"


def _start(argv, cwd, env, log: CappedLog, label: str, thawer) -> tuple[subprocess.Popen, LogPump]:
    """Spawn the session, its output through a pipe into `log`; a binary that cannot be run
    is a ConfigError naming it (a missing `cwd` is raised as it is)."""
    out, into = os.pipe()
    try:
        proc = subprocess.Popen(
            [str(a) for a in argv], cwd=str(cwd), env=env, stdin=subprocess.DEVNULL,
            stdout=into, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        thawer.close()
        os.close(out)
        os.close(into)
        log.write(f"=== bmad-loop {label} could not start: {exc} ===\n".encode())
        if exc.filename is not None and str(exc.filename) == str(cwd):
            raise
        raise ConfigError(f"[adapter] command: cannot run agent binary '{argv[0]}': {exc.strerror}") from exc
    except BaseException:
        thawer.close()  # an open step left behind would keep the helper watching
        os.close(out)
        os.close(into)
        raise
    os.close(into)  # the session's tree holds the only write ends: EOF once it has ended
    return proc, LogPump(out, log)


def _end_session(proc: subprocess.Popen, token: str, grace_s: float, since: float | None) -> None:
    """End the agent and everything it started: SIGTERM, grace, SIGKILL; then reap the agent.

    Nothing is reaped before the last signal, so no pid in the tree can have been recycled.
    Processes that started before `since` (the session's start) are not searched for its marker.
    """
    tree = proc.returncode is None  # False only when the agent had to be reaped to see it exit
    proctree.end_tree(proc.pid, marker=(SESSION_TOKEN_VAR, token), grace_s=grace_s, tree=tree,
                      since=since)
    proc.wait()


def owner_marker() -> str:
    """`host:pid:start` of this process (its start time tells it from a later one with its pid)."""
    return f"{host_name()}:{os.getpid()}:{proctree.own_start_time() or 0.0:.2f}"


def parse_owner(value: str | None) -> tuple[str, int, float] | None:
    """(host, pid, start) from an `owner_marker` value, or None when it is not one."""
    try:
        host, pid, start = (value or "").rsplit(":", 2)
        return host, int(pid), float(start)
    except ValueError:
        return None


def _label_from_env(env: Mapping[str, str]) -> str:
    phase = env.get("BMAD_LOOP_PHASE")
    if not phase:
        return "session"
    parts = [phase]
    if env.get("BMAD_LOOP_ATTEMPT"):
        parts.append(f"attempt {env['BMAD_LOOP_ATTEMPT']}")
    if env.get("BMAD_LOOP_STORY_KEY"):
        parts.append(f"story {env['BMAD_LOOP_STORY_KEY']}")
    return " ".join(parts)


def _last_byte(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1)
    except OSError:
        return b""


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _header(command: Command, label: str) -> bytes:
    """The log's header: the command as configured, then the box on a line of its own."""
    shown = _short_line(command.shown) if command.shown is not None else _show_argv(command.argv)
    header = f"=== bmad-loop {label} started {_utc_now()}: {shown} ===\n"
    if command.note:
        header += f"=== {_short_line(command.note)} ===\n"
    return header.encode()


def _show_argv(argv: Iterable[str]) -> str:
    return _short_line(shlex.join(str(a) for a in argv))


def _short_line(text: str) -> str:
    shown = text.replace("\n", " ")
    return shown if len(shown) <= _HEADER_ARGV_MAX else shown[:_HEADER_ARGV_MAX] + " …"
