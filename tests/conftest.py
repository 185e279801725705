"""Shared fixtures: real git repositories shaped like BMAD projects, a migrated state database,
a HOME without git config, file barriers, and (from backends.py) the PostgreSQL and Redis
services.

Plain helpers and constants live in support.py; test modules import them from there, never
from this file or from another test module.

Every test gets its own HOME with no git identity, so nothing on this machine (a global
user.name, hooks, templates) can make a test pass that would fail on a fresh machine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# `import support` / `import backends` must work whatever import mode pytest runs in (and in
# every xdist worker), not only because pytest happens to prepend the rootdir of a test file.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from support import build_repo, migrated_database  # noqa: E402

pytest_plugins = ["backends"]  # postgres_url, redis_namespace, backend, ... for every module


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch):
    """A fresh HOME without git identity; the machine's git config cannot leak in.

    The one "no git config" fixture of the suite: every test gets it."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("EMAIL", raising=False)  # git's last resort for an author address
    for name in list(os.environ):
        if name.startswith(("GIT_AUTHOR", "GIT_COMMITTER", "BMAD_LOOP_")):
            monkeypatch.delenv(name)
    return home


@pytest.fixture
def unboxed(monkeypatch):
    """Agents and verify commands outside the OS sandbox (`sandbox = "off"` for both), for the
    tests of what bmad-loop does about an unboxed agent: one that finds bmad-loop's pid, plants
    a hook, moves the target with git, or leaves an orphan a recovery must find (boxed, each of
    these fails or dies with the box: tests/test_sandbox_escape.py)."""
    monkeypatch.setenv("BMAD_LOOP_ADAPTER_SANDBOX", "off")
    monkeypatch.setenv("BMAD_LOOP_VERIFY_SANDBOX", "off")


@pytest.fixture
def fresh_programs():
    """git and bwrap looked up again, for a test that changes PATH: bmad-loop resolves them once
    per process (sandbox/programs.py), so the test starts cold and leaves nothing behind."""
    from bmad_loop.caches import CACHES

    def forget():
        for entry in CACHES.entries():
            if entry.name in ("sandbox.programs", "sandbox.probes"):
                entry.clear()

    forget()
    yield forget
    forget()


@pytest.fixture
def escalate_at_once(monkeypatch):
    """The lane as it was before flakes, red targets and repairs (`[verify] retries = 0`,
    `[limits] max_repairs = 0`): for the tests of what an escalation at integration keeps and
    how a person goes on from it (tests/test_repairs.py and test_flakes.py test the new way)."""
    monkeypatch.setenv("BMAD_LOOP_VERIFY_RETRIES", "0")
    monkeypatch.setenv("BMAD_LOOP_LIMITS_MAX_REPAIRS", "0")


@pytest.fixture
def make_repo(tmp_path):
    """Build real git repositories with a BMAD board, story files and a scripted agent
    (`support.build_repo`); whatever they spawned is killed after the test."""
    built = []

    def build(stories, **options):
        repo = build_repo(tmp_path, stories, **options)
        built.append(repo)
        return repo

    yield build
    for repo in built:  # never leave consumer processes behind
        repo.kill_spawned()


@pytest.fixture
def db(tmp_path):
    """A fresh, migrated state database with no rows (a real SQLite file in the test's folder,
    `support.migrated_database`), disposed of after the test. A module that needs rows in it
    overrides `db` with a fixture that takes this one and adds them (`support.add_runs`)."""
    database = migrated_database(tmp_path)
    yield database
    database.dispose()


@pytest.fixture
def bar(tmp_path) -> Path:
    """A folder for file barriers (`support.barrier_script`, `inside`, `go`)."""
    path = tmp_path / "bar"
    path.mkdir()
    return path


# ------------------------------------------------------------------ how long the real CLIs took
_REALCLI: list[tuple[float, float, float]] = []  # (duration, start, stop) of each phase


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Tag the reports of tests marked `realcli` (the tag travels with the report under xdist)."""
    outcome = yield
    if item.get_closest_marker("realcli") is not None:
        outcome.get_result().user_properties.append(("realcli", True))


def pytest_runtest_logreport(report):
    """Note the time of the tests marked `realcli` (under xdist, as the controller receives them)."""
    if ("realcli", True) in report.user_properties:
        _REALCLI.append((report.duration, getattr(report, "start", 0.0), getattr(report, "stop", 0.0)))


def pytest_terminal_summary(terminalreporter):
    if _REALCLI:
        wall = max(r[2] for r in _REALCLI) - min(r[1] for r in _REALCLI)
        terminalreporter.write_line(
            f"realcli: the real agent CLI tests took {sum(r[0] for r in _REALCLI):.1f} s of test time, "
            f"{wall:.1f} s from the first to the last")
