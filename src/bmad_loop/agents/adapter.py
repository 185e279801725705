"""The command adapter: how bmad-loop starts one agent session and ends it.

Any CLI can be an agent. Its argv template holds `{placeholders}` (see `PLACEHOLDERS`), it runs
with no shell, cwd = the story's worktree, stdin = /dev/null, the `BMAD_LOOP_*` environment of the
contract, and stdout+stderr appended to the session log. Exit 0 = success (review: approved).

Ending a session ends everything it started. The agent is the leader of its own session and process
group (`start_new_session=True`); to end it bmad-loop sends SIGTERM, waits a short grace, then
SIGKILL, each to the whole group *and* to every process of the session as `proctree` finds it:
the agent's descendants, the members of its group and session, and any process whose environment
carries the session's private `BMAD_LOOP_SESSION_TOKEN` (so a daemon that double-forked away from
the tree is found too). The agent is not reaped before the last signal, and a process whose pid
was recycled is never hit. Process-tree work lives in `proctree` (psutil, no /proc).

Every process started here also carries `BMAD_LOOP_OWNER` = `host:pid:start` of the bmad-loop
process that started it, so orphan recovery can tell a leftover of a dead bmad-loop from the
live work of another one (`recovery.py`). The child's output comes through a pipe into the
log (`logcap`: capped at `[limits] max_log_bytes`, one read at a time in memory), and
`session_output` reads back a bounded tail.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, Sequence

from .. import proctree
from . import thaw
from ..errors import ConfigError
from ..hostid import host_name
from .logcap import CappedLog, LogPump
from .stallwatch import StallWatch
from ..states import AGENT_PHASES

__all__ = [
    "PLACEHOLDERS",
    "PHASES",
    "SESSION_TOKEN_VAR",
    "OWNER_VAR",
    "OUTPUT_TAIL_BYTES",
    "VERDICT_PREFIX",
    "AgentCall",
    "AgentResult",
    "render_argv",
    "agent_env",
    "check_binary",
    "run_agent",
    "session_output",
    "owner_marker",
    "parse_owner",
    "read_tail",
    "read_verdict",
    "review_approved",
]

PLACEHOLDERS = ("phase", "story_key", "story_file", "prompt_file", "worktree", "run_id", "attempt", "model", "tier")
PHASES = AGENT_PHASES  # the phases an agent runs: dev, review, fix

SESSION_TOKEN_VAR = "BMAD_LOOP_SESSION_TOKEN"  # private marker used to find escaped descendants
OWNER_VAR = "BMAD_LOOP_OWNER"  # host:pid:start of the bmad-loop process that started the session
# What `session_output` reads back at most: enough for a review's notes and its verdict line,
# small whatever the agent printed (its whole output is in the log file).
OUTPUT_TAIL_BYTES = 256 * 1024
VERDICT_PREFIX = "BMAD-LOOP-VERDICT:"  # see read_verdict

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HEADER_ARGV_MAX = 2000


@dataclass(frozen=True)
class AgentCall:
    """Everything one agent session is told about its work."""

    phase: str  # dev | review | fix
    story_key: str
    story_file: str
    prompt_file: str
    worktree: str
    run_id: str
    attempt: int  # 1 on the first try
    base_sha: str
    model: str = ""
    tier: str = ""
    # [adapter.env] merged with the phase's env and the lane-sandbox variables, by the caller.
    extra_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def placeholder_values(self) -> dict[str, str]:
        return {
            "phase": self.phase,
            "story_key": self.story_key,
            "story_file": self.story_file,
            "prompt_file": self.prompt_file,
            "worktree": self.worktree,
            "run_id": self.run_id,
            "attempt": str(self.attempt),
            "model": self.model,
            "tier": self.tier,
        }


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


# --------------------------------------------------------------------------- argv and environment


def render_argv(template: Sequence[str], call: AgentCall) -> list[str]:
    """Substitute `{placeholders}` in each element of `template`.

    An element that is exactly one placeholder whose value is empty is dropped (`{model}` with no
    model). Text that is not `{identifier}` (JSON, `{}`) is left alone. An unknown placeholder is a
    ConfigError naming it.
    """
    values = call.placeholder_values()
    argv: list[str] = []
    for element in template:
        element = str(element)
        for name in _PLACEHOLDER.findall(element):
            if name not in values:
                raise ConfigError(f"[adapter] command: unknown placeholder {{{name}}}"
                                  f" (known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
        whole = _PLACEHOLDER.fullmatch(element)
        if whole and values[whole.group(1)] == "":
            continue
        argv.append(_PLACEHOLDER.sub(lambda m: values[m.group(1)], element))
    return argv


def agent_env(call: AgentCall, base_env: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment: `base_env`, then `call.extra_env`, then the contract variables.

    The `BMAD_LOOP_*` variables of the contract come last so that no policy or lane variable can
    make an agent believe it works on another story.
    """
    env = {str(k): str(v) for k, v in base_env.items()}
    env.update({str(k): str(v) for k, v in call.extra_env.items()})
    env.update({
        # The agent runs in its worktree; a PWD inherited from bmad-loop would name another
        # folder, and CLIs that trust PWD over getcwd() (opencode) would work there.
        "PWD": call.worktree,
        "BMAD_LOOP_RUN_ID": call.run_id,
        "BMAD_LOOP_STORY_KEY": call.story_key,
        "BMAD_LOOP_PHASE": call.phase,
        "BMAD_LOOP_WORKTREE": call.worktree,
        "BMAD_LOOP_STORY_FILE": call.story_file,
        "BMAD_LOOP_PROMPT_FILE": call.prompt_file,
        "BMAD_LOOP_ATTEMPT": str(call.attempt),
        "BMAD_LOOP_BASE_SHA": call.base_sha,
        "BMAD_LOOP_MODEL": call.model,
        "BMAD_LOOP_TIER": call.tier,
    })
    return env


def check_binary(argv0: str, source: str, *, path: str | None = None, cwd: str | os.PathLike | None = None) -> str:
    """Resolve the agent binary like exec would, or raise a ConfigError naming it and `source`.

    A name without a slash is looked up on `path` (default: this process's PATH); one with a slash
    must be an executable file (relative to `cwd` when given). Returns the resolved path.
    """
    if not argv0:
        raise ConfigError(f"{source}: the agent command is empty")
    if os.sep in argv0 or (os.altsep and os.altsep in argv0):
        candidate = Path(argv0)
        if not candidate.is_absolute() and cwd is not None:
            candidate = Path(cwd) / candidate
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate.absolute())
        raise ConfigError(f"{source}: agent binary '{argv0}' not found or not executable")
    found = shutil.which(argv0, path=path)
    if found is None:
        raise ConfigError(f"{source}: agent binary '{argv0}' not found on PATH")
    return found


# --------------------------------------------------------------------------- running a session


def run_agent(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    timeout_s: float,
    stop_event: threading.Event | None = None,
    on_start: Callable[[int], None] | None = None,
    poll_s: float = 0.2,
    kill_grace_s: float = 3.0,
    label: str | None = None,
    thaw_after_s: float | None = None,
    stall_s: float | None = None,
    max_log_bytes: int | None = None,
) -> AgentResult:
    """Run one agent session to its end and return how it ended.

    No shell; stdin is /dev/null; stdout and stderr are appended to `log_path` (parents created)
    between a header and a footer line. `on_start(pid)` is called right after the spawn. The session
    is killed, whole tree, when `timeout_s` passes (`timed_out`) or `stop_event` is set
    (`interrupted`); whatever it left running when it exits by itself is ended too. Any exception
    while waiting (including `StopRequested` or Ctrl+C) kills the tree before it propagates.
    With `thaw_after_s`, this process's thaw helper (`thaw.guard`) continues bmad-loop when the
    session stopped it (SIGSTOP) for that long, so a stopped bmad-loop never outlasts its lease
    by much.
    With `stall_s`, a session silent and idle that long is killed (`stalled`, see stallwatch).
    With `max_log_bytes`, the log never grows past it (`logcap`: its first half, a marker, a
    rolling last half); the output comes through a pipe, never more than one read in memory.
    """
    if not argv:
        raise ConfigError("[adapter] command: the agent command is empty")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    child_env = {str(k): str(v) for k, v in env.items()}
    child_env[SESSION_TOKEN_VAR] = token
    child_env[OWNER_VAR] = owner_marker()
    label = label or _label_from_env(child_env)

    with CappedLog(log_path, max_log_bytes) as log:
        log.write(f"=== bmad-loop {label} started {_utc_now()}: {_show_argv(argv)} ===\n".encode())
        log_start = log.tell()
        started = time.monotonic()
        # The thaw helper is up before the agent starts: an agent that stops bmad-loop at once
        # would otherwise freeze it before the helper exists, for good. Only the first step of
        # this process starts it; later ones just tell it they are open.
        thawer = thaw.guard(thaw_after_s, log_path)
        proc, pump = _start(argv, cwd, child_env, log, label, thawer)

        timed_out = interrupted = stalled = False
        # The agent's start, as the process table tells it: nothing older is the session's, and
        # its descendants' start times are read on the same clock (None: search them all).
        since = proctree.start_time(proc.pid)
        waiter = proctree.ExitWaiter(proc)
        watch = (StallWatch(stall_s, log_path, proc.pid, marker=(SESSION_TOKEN_VAR, token), since=since)
                 if stall_s else None)
        try:
            if on_start is not None:
                on_start(proc.pid)
            deadline = started + timeout_s
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                if waiter.wait(remaining if stop_event is None and watch is None else min(poll_s, remaining)):
                    break
                if stop_event is not None and stop_event.is_set():
                    interrupted = True
                    break
                if watch is not None and watch.stalled():
                    stalled = True
                    break
        except BaseException:
            _end_session(proc, token, kill_grace_s, since)
            waiter.close()
            thawer.close()
            pump.finish()
            log.write(f"=== bmad-loop {label} killed: bmad-loop itself was interrupted ===\n".encode())
            raise
        waiter.close()
        thawer.close()

        _end_session(proc, token, kill_grace_s, since)
        pump.finish()
        duration = time.monotonic() - started
        log_end = log.tell()
        log_start = log.moved(log_start)  # where the session's start is now (the tail rolls)
        if timed_out:
            how = f"timed out after {timeout_s:g}s: process tree killed"
        elif interrupted:
            how = "stopped: process tree killed"
        elif stalled:
            how = f"stalled: no output and no CPU for {stall_s:g}s: process tree killed"
        else:
            how = f"exited {proc.returncode}"
        newline = b"" if log_end == log_start or _last_byte(log_path) == b"\n" else b"\n"
        log.write(newline + f"=== bmad-loop {label} {how} ({duration:.1f}s) ===\n".encode())

    return AgentResult(
        exit_code=None if (timed_out or interrupted or stalled) else proc.returncode,
        timed_out=timed_out, interrupted=interrupted, duration_s=duration, pid=proc.pid,
        log_start=log_start, log_end=log_end, stalled=stalled,
        log_cut=LogCut(log.dropped, log.lost, log.error, max_log_bytes) if log.dropped or log.error
        else None,
    )


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
        os.close(out), os.close(into)
        log.write(f"=== bmad-loop {label} could not start: {exc} ===\n".encode())
        if exc.filename is not None and str(exc.filename) == str(cwd):
            raise
        raise ConfigError(f"[adapter] command: cannot run agent binary '{argv[0]}': {exc.strerror}") from exc
    except BaseException:
        thawer.close()  # an open step left behind would keep the helper watching
        os.close(out), os.close(into)
        raise
    os.close(into)  # the session's tree holds the only write ends: EOF once it has ended
    return proc, LogPump(out, log)


def session_output(log_path: Path, result: AgentResult, *, max_chars: int | None = None,
                   max_bytes: int = OUTPUT_TAIL_BYTES) -> str:
    """The text one session wrote to its log (e.g. a review's notes): its last `max_bytes` at
    most (memory stays bounded whatever the agent printed), optionally only `max_chars`."""
    return read_tail(log_path, result.log_start, result.log_end, max_bytes=max_bytes,
                     max_chars=max_chars)


def read_tail(path: Path, start: int = 0, end: int | None = None, *,
              max_bytes: int = OUTPUT_TAIL_BYTES, max_chars: int | None = None) -> str:
    """Bytes `start`..`end` (default: to the end) of `path`, of which only the last `max_bytes`
    are read, decoded as UTF-8 (a character cut at the edge is replaced)."""
    try:
        with open(path, "rb") as handle:
            if end is None:
                end = handle.seek(0, os.SEEK_END)
            begin = max(start, end - max_bytes)
            handle.seek(begin)
            data = handle.read(max(0, end - begin))
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    return text[-max_chars:] if max_chars else text


def read_verdict(text: str) -> bool | None:
    """The last `BMAD-LOOP-VERDICT: APPROVED | CHANGES-REQUESTED` line in `text`, or None.

    Real CLIs exit 0 whenever their session completes, so a review run through them cannot say
    "changes requested" with its exit status; the shipped profiles ask the reviewer to print this
    line instead (profile `verdict = "marker"`).
    """
    verdict: bool | None = None
    for line in text.splitlines():
        line = line.strip().strip("*`_ ").strip()
        if line.upper().startswith(VERDICT_PREFIX):
            word = line[len(VERDICT_PREFIX):].strip().strip("*`_ .").upper()
            if word.startswith("APPROVE"):
                verdict = True
            elif word.startswith("CHANGES"):
                verdict = False
    return verdict


def review_approved(result: AgentResult, output: str, *, verdict: str = "exit") -> bool:
    """Did a review session approve? `verdict` is the profile's: "exit" or "marker".

    "exit": exit 0 approves (the contract for any CLI). "marker": the session must also have exited
    0 and its output must end its verdict with `BMAD-LOOP-VERDICT: APPROVED`; no marker is not an
    approval. Either way a session that timed out or was stopped approves nothing.
    """
    if not result.ok:
        return False
    if verdict == "marker":
        return read_verdict(output) is True
    if verdict != "exit":
        raise ConfigError(f"[adapter] verdict: unknown verdict mode {verdict!r} (known: exit, marker)")
    return True


# --------------------------------------------------------------------------- ending the session


def _end_session(proc: subprocess.Popen, token: str, grace_s: float, since: float | None) -> None:
    """End the agent and everything it started: SIGTERM, grace, SIGKILL; then reap the agent.

    Nothing is reaped before the last signal, so no pid in the tree can have been recycled.
    Processes that started before `since` (the session's start) are not searched for its marker.
    """
    tree = proc.returncode is None  # False only when the agent had to be reaped to see it exit
    proctree.end_tree(proc.pid, marker=(SESSION_TOKEN_VAR, token), grace_s=grace_s, tree=tree,
                      since=since)
    proc.wait()


# --------------------------------------------------------------------------- the owner marker

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


# --------------------------------------------------------------------------- small helpers


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


def _show_argv(argv: Iterable[str]) -> str:
    shown = shlex.join(str(a) for a in argv).replace("\n", " ")
    return shown if len(shown) <= _HEADER_ARGV_MAX else shown[:_HEADER_ARGV_MAX] + " …"
