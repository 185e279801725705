"""Helpers for the operator tests: the CLI as a child process, and waiting on barriers.

A run driven by a child `bmad-loop run` lets a test watch it from this process (status, journal,
attach) while scripted agents hold at `wait_for` barriers that the test releases.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

DEADLINE_S = 60.0


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "bmad_loop", *args]


def spawn_cli(repo, *args: str, **popen) -> subprocess.Popen:
    """`bmad-loop ARGS --project REPO` as a child process, its output piped (text)."""
    argv = cli_argv(args[0], "--project", str(repo.root), *args[1:])
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, **popen)


def wait_until(predicate, what: str, timeout: float = DEADLINE_S):
    """Poll `predicate` until it returns something truthy (a barrier, not a sleep)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def wait_for_files(*paths: Path, timeout: float = DEADLINE_S) -> None:
    wait_until(lambda: all(Path(p).exists() for p in paths),
               " and ".join(str(p) for p in paths), timeout)


def read_until(proc: subprocess.Popen, needle: str, timeout: float = DEADLINE_S) -> str:
    """Read the child's stdout line by line until a line holds `needle`; returns all read."""
    import selectors

    seen = []
    end = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < end:
            if not sel.select(timeout=0.1):
                continue
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if needle in line:
                return "".join(seen)
    raise AssertionError(f"'{needle}' never appeared; got:\n{''.join(seen)}")


def finish(proc: subprocess.Popen, timeout: float = DEADLINE_S) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out or ""
