"""Helpers for the operator tests: the CLI as a child process, and waiting on barriers.

A run driven by a child `bmad-loop run` lets a test watch it from this process (status, journal,
attach) while scripted agents hold at `wait_for` barriers that the test releases.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

DEADLINE_S = 60.0


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "bmad_loop", *args]


class Child:
    """A child `bmad-loop` process whose output is collected by a thread, line by line."""

    def __init__(self, argv: list[str], **popen):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, stdin=subprocess.DEVNULL, **popen)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._done = False
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def read_until(self, needle: str, timeout: float = DEADLINE_S) -> str:
        """Block until the output holds `needle`; returns the output so far."""
        end = time.monotonic() + timeout
        with self._cond:
            while needle not in "".join(self.lines):
                left = end - time.monotonic()
                if self._done or left <= 0:
                    raise AssertionError(f"'{needle}' never appeared; got:\n{''.join(self.lines)}")
                self._cond.wait(left)
            return "".join(self.lines)

    def finish(self, timeout: float = DEADLINE_S) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        self._thread.join(timeout)
        return code, self.output

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def spawn_cli(repo, *args: str, **popen) -> Child:
    """`bmad-loop ARGS --project REPO` as a child process."""
    return Child(cli_argv(args[0], "--project", str(repo.root), *args[1:]), **popen)


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


# ---------------------------------------------------------------------------- PostgreSQL
PG_ADMIN_URL = os.environ.get("BMAD_TEST_POSTGRES_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def fresh_postgres_database():
    """A brand-new PostgreSQL database for one test, dropped afterwards.

    Missing PostgreSQL skips locally and fails in CI (CI=true), where .ci/run provides it.
    """
    import pytest
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    try:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # no server, no driver
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
    name = f"bmad_op_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
