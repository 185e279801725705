"""The package as users get it: a wheel built from this tree, installed into a fresh venv.

The venv is paid for once per module (`installed`): build the wheel from a copy of the
repository (so the source tree gets no build/ or egg-info litter), install it with its
dependencies from the package index, then drive the installed `bmad-loop` console script as a
subprocess in brand-new git repositories, with an empty HOME (no git identity), no PYTHON*
variables (a user's shell has no PYTHONDONTWRITEBYTECODE) and nothing of this checkout on the path.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import CONTRACT_TABLES

REPO_ROOT = Path(__file__).resolve().parents[1]
COPY_IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                     ".bmad-loop", ".venv", ".pytest_cache", "venv")


def _run(argv, *, env, cwd=None, timeout=900, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check:
        assert proc.returncode == 0, _describe(argv, proc)
    return proc


def _describe(argv, proc) -> str:
    return (f"{' '.join(map(str, argv))} exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")


def _user_env(home: Path, bin_dir: Path) -> dict:
    """A user's shell: the venv first on PATH, an empty HOME, no git identity, no Python leaks."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GIT_", "BMAD_LOOP_", "PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1",
               PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}")
    env.pop("XDG_CONFIG_HOME", None)
    return env


def _assert_migrated(db_path: Path) -> None:
    assert db_path.is_file(), f"{db_path} was not created"
    with sqlite3.connect(db_path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        versions = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
    assert CONTRACT_TABLES <= tables, CONTRACT_TABLES - tables
    from bmad_loop.db.migrate import head_revision

    assert versions == [head_revision()]


@dataclass
class Installed:
    root: Path  # a scratch folder for this module
    venv: Path
    env: dict
    wheel_names: set[str]
    init: subprocess.CompletedProcess
    project: Path
    demo: subprocess.CompletedProcess
    demo_dir: Path

    @property
    def bmad_loop(self) -> Path:
        return self.venv / "bin" / "bmad-loop"

    def cli(self, *args, cwd=None, check=False) -> subprocess.CompletedProcess:
        return _run([self.bmad_loop, *args], env=self.env, cwd=cwd or self.root, check=check,
                    timeout=600)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """Build the wheel, install it in a fresh venv, then run `init` and `demo --json` with it."""
    root = tmp_path_factory.mktemp("package")
    home = root / "home"
    home.mkdir()
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = _user_env(home, env_dir / "bin")

    source = root / "source"  # build from a copy of the working tree: this checkout stays clean
    shutil.copytree(REPO_ROOT, source, ignore=COPY_IGNORE)
    setuptools_ok = subprocess.run(
        [python, "-c", "import setuptools, sys; "
                       "sys.exit(int(setuptools.__version__.split('.')[0]) < 68)"],
        env=env, capture_output=True).returncode == 0
    isolation = ["--no-build-isolation"] if setuptools_ok else []  # else pip fetches setuptools
    dist = root / "dist"
    _run([python, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", dist, source], env=env)
    (wheel,) = dist.glob("bmad_loop-*.whl")
    _run([python, "-m", "pip", "install", "-q", wheel], env=env)

    project = root / "project"
    project.mkdir()
    _run(["git", "init", "-q", "-b", "main"], env=env, cwd=project)
    bmad_loop = env_dir / "bin" / "bmad-loop"
    init = _run([bmad_loop, "init"], env=env, cwd=project, check=False)
    demo_dir = root / "demo"
    demo = _run([bmad_loop, "demo", "--dir", demo_dir, "--json"], env=env, cwd=root,
                timeout=600, check=False)
    return Installed(root=root, venv=env_dir, env=env,
                     wheel_names=set(zipfile.ZipFile(wheel).namelist()), init=init,
                     project=project, demo=demo, demo_dir=demo_dir)


# ------------------------------------------------------------------------------ the wheel
def test_the_installed_console_script_runs_the_installed_copy_not_this_checkout(installed):
    where = _run([installed.venv / "bin" / "python", "-c",
                  "import bmad_loop, bmad_loop._migrations as m; "
                  "print(bmad_loop.__file__); print(m.__file__)"],
                 env=installed.env, cwd=installed.root).stdout.split()
    assert all(Path(p).is_relative_to(installed.venv) for p in where), where
    result = installed.cli("--help", check=True)
    assert result.stdout.startswith("Usage:")


def test_the_wheel_carries_the_migrations_and_the_data_files(installed):
    names = installed.wheel_names
    for packaged in ("bmad_loop/_migrations/env.py", "bmad_loop/_migrations/script.py.mako",
                     "bmad_loop/policy_template.toml", "bmad_loop/agents/profiles/claude.toml"):
        assert packaged in names, f"{packaged} is not in the wheel"
    versions = sorted(p.name for p in (REPO_ROOT / "migrations" / "versions").glob("[0-9]*.py"))
    for version in versions:
        assert f"bmad_loop/_migrations/versions/{version}" in names, version


def test_the_wheel_carries_every_package_of_the_source_tree(installed):
    src = REPO_ROOT / "src"
    packages = {str(p.parent.relative_to(src)) for p in (src / "bmad_loop").rglob("__init__.py")
                if "__pycache__" not in p.parts}
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in installed.wheel_names)
    assert missing == [], f"packages missing from the wheel: {missing}"


# ------------------------------------------------------------------------------ init
def test_installed_init_writes_a_policy_and_a_migrated_state_database(installed):
    assert installed.init.returncode == 0, _describe(["bmad-loop", "init"], installed.init)
    assert (installed.project / ".bmad-loop" / "policy.toml").is_file()
    _assert_migrated(installed.project / ".bmad-loop" / "state.db")


# ------------------------------------------------------------------------------ demo
def test_installed_demo_creates_and_migrates_its_state_database(installed):
    assert installed.demo.stdout.strip(), _describe(["bmad-loop", "demo"], installed.demo)
    result = json.loads(installed.demo.stdout)
    assert Path(result["dir"]).resolve() == installed.demo_dir.resolve()
    assert result["stories"], result
    _assert_migrated(installed.demo_dir / ".bmad-loop" / "state.db")


def test_installed_demo_integrates_every_story_and_exits_zero(installed):
    result = json.loads(installed.demo.stdout)
    assert installed.demo.returncode == 0, result
    assert result["exit_code"] == 0 and result["state"] == "completed", result
    assert all(s["state"] == "integrated" for s in result["stories"]), result["stories"]
    log = _run(["git", "log", "--first-parent", "--format=%s", "main"], env=installed.env,
               cwd=installed.demo_dir).stdout.splitlines()
    assert len(log) == len(result["stories"]) + 1  # one merge per story, plus the initial commit


def test_installed_status_json_reads_the_demo_run(installed):
    result = installed.cli("status", "--project", installed.demo_dir, "--json")
    assert result.returncode == 0, _describe(["bmad-loop", "status"], result)
    status = json.loads(result.stdout)
    assert status["run"]["id"] == json.loads(installed.demo.stdout)["run_id"]


def test_installed_journal_json_reads_the_demo_run(installed):
    result = installed.cli("journal", "--project", installed.demo_dir, "--json")
    assert result.returncode == 0, _describe(["bmad-loop", "journal"], result)
    kinds = [json.loads(line)["kind"] for line in result.stdout.splitlines() if line.strip()]
    assert kinds and kinds[0] == "run.created"
