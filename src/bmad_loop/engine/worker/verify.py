"""Run `[verify].commands` in a folder: each a shell command, in order, stopping at the first failure.

Each command runs like an agent session (`agents.process.supervise`): in its own session and process
group, its output straight into the log file, its whole process tree ended on timeout, on
`stop_event` (`stop --now`) and when it exits, and tagged with the session token and
`BMAD_LOOP_OWNER`. With `run_id` and `story_key` it also carries `BMAD_LOOP_RUN_ID` and
`BMAD_LOOP_STORY_KEY`, so orphan recovery finds what a dead worker's verify left running and
kills it before the story is retried; with `thaw_after_s` a command that stops bmad-loop is
undone after that long (the process's thaw helper, `thaw.py`). Only a bounded tail of the
output is read back.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ...agents.adapter import read_tail
from ...agents.process import Command, Limits, LogCut, supervise
from ...sandbox import SANDBOX_VAR, Box

__all__ = ["VerifyResult", "run_verify", "verify_tags", "OUTPUT_TAIL_CHARS", "NOTHING_TO_RUN"]

OUTPUT_TAIL_CHARS = 20_000  # what is handed to the next prompt and kept in evidence


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    failed_command: str | None
    exit_code: int | None
    timed_out: bool
    output: str  # tail of the combined output of the failing (or last) command
    duration_s: float
    log: str | None
    interrupted: bool = False
    log_cut: LogCut | None = None  # the log passed [limits] max_log_bytes (or a write failed)
    commands: tuple[str, ...] = ()  # what ran, in order
    boxed: bool = False  # ran in the OS sandbox (bmad_loop.sandbox)

    def event(self) -> tuple[str, dict]:
        """The journal event of this verification: `verify.passed` (`command`: the commands
        that ran, joined by ` && `; None when there were none) or `verify.failed` (`command`:
        the one that failed), with `log_truncated` when its log was cut, and `boxed`."""
        ran = " && ".join(self.commands) or None
        data = {"command": ran if self.ok else self.failed_command, "exit_code": self.exit_code,
                "timed_out": self.timed_out, "duration_s": round(self.duration_s, 3),
                "log": self.log, "boxed": self.boxed}
        if self.log_cut is not None:
            data["log_truncated"] = self.log_cut.event_data()
        return ("verify.passed" if self.ok else "verify.failed", data)


# What verifying with no commands gives: passed, at once, with no log.
NOTHING_TO_RUN = VerifyResult(True, None, 0, False, "", 0.0, None)


def verify_tags(run_id: str | None, story_key: str | None) -> dict[str, str]:
    """The variables that tie a verify process to its run and story (for orphan recovery)."""
    if not (run_id or story_key):
        return {}
    tags = {"BMAD_LOOP_PHASE": "verify"}
    if run_id:
        tags["BMAD_LOOP_RUN_ID"] = run_id
    if story_key:
        tags["BMAD_LOOP_STORY_KEY"] = story_key
    return tags


@dataclass(frozen=True)
class VerifySite:
    """Where verify commands run: in `cwd`, logged to `log_path`, with `env` (None: this
    process's), in `box` (None: unboxed, else the box's own environment added), tagged with
    the run and story they verify (for orphan recovery)."""

    cwd: Path
    log_path: Path
    env: Mapping[str, str] | None = None
    box: Box | None = None
    run_id: str | None = None
    story_key: str | None = None


def run_verify(commands: Sequence[str], site: VerifySite, limits: Limits, *,
               stop_event: threading.Event | None = None) -> VerifyResult:
    """Run `commands` in order until one fails, each supervised with `limits`."""
    cwd, log_path, env, box = site.cwd, site.log_path, site.env, site.box
    run_id, story_key = site.run_id, site.story_key
    started = time.monotonic()
    if not commands:
        return NOTHING_TO_RUN
    base_env = dict(os.environ if env is None else env)
    base_env.update(verify_tags(run_id, story_key))
    base_env[SANDBOX_VAR] = box.backend if box else ""
    base_env.update(box.env if box else {})
    cuts = []
    for command in commands:
        argv = ["/bin/sh", "-c", command]
        label = f"verify{' story ' + story_key if story_key else ''}"
        boxed = box.wrap(argv, str(Path(cwd).resolve())) if box else argv  # in cwd, as unboxed
        result = supervise(Command(boxed, cwd, base_env, label), log_path, limits,
                           stop_event=stop_event)
        cuts += [result.log_cut] if result.log_cut else []
        if result.exit_code != 0 or result.timed_out or result.interrupted:
            return VerifyResult(
                ok=False, failed_command=command, exit_code=result.exit_code,
                timed_out=result.timed_out,
                output=read_tail(log_path, result.log_start, result.log_end,
                                 max_bytes=4 * OUTPUT_TAIL_CHARS, max_chars=OUTPUT_TAIL_CHARS),
                duration_s=time.monotonic() - started, log=str(log_path),
                interrupted=result.interrupted, log_cut=_summed(cuts), boxed=box is not None,
            )
    return VerifyResult(True, None, 0, False, "", time.monotonic() - started, str(log_path),
                        log_cut=_summed(cuts), commands=tuple(commands), boxed=box is not None)


def _summed(cuts: list[LogCut]) -> LogCut | None:
    """One log's cuts over its commands, as one."""
    if not cuts:
        return None
    return LogCut(sum(c.dropped for c in cuts), sum(c.lost for c in cuts),
                  next((c.error for c in cuts if c.error), None), cuts[-1].max_log_bytes)
