"""Run `[verify].commands` in a folder: each a shell command, in order, stopping at the first failure."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..adapter import run_agent

__all__ = ["VerifyResult", "run_verify", "OUTPUT_TAIL_CHARS"]

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


def run_verify(
    commands: Sequence[str],
    *,
    cwd: Path,
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    stop_event: threading.Event | None = None,
) -> VerifyResult:
    started = time.monotonic()
    if not commands:
        return VerifyResult(True, None, 0, False, "", 0.0, None)
    base_env = dict(os.environ if env is None else env)
    for command in commands:
        offset = log_path.stat().st_size if log_path.exists() else 0
        result = run_agent(["/bin/sh", "-c", command], cwd=cwd, env=base_env, log_path=log_path,
                           timeout_s=timeout_s, stop_event=stop_event)
        if result.exit_code != 0 or result.timed_out or result.interrupted:
            return VerifyResult(
                ok=False, failed_command=command, exit_code=result.exit_code,
                timed_out=result.timed_out, output=_tail(log_path, offset),
                duration_s=time.monotonic() - started, log=str(log_path),
                interrupted=result.interrupted,
            )
    return VerifyResult(True, None, 0, False, "", time.monotonic() - started, str(log_path))


def _tail(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace")[-OUTPUT_TAIL_CHARS:]
