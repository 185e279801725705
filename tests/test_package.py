"""The package as users get it: a wheel built from this tree, installed into a fresh venv.

One test pays the venv cost once: build the wheel from a copy of the repository (so the source
tree gets no build/ or egg-info litter), install it with its dependencies from the package
index, then drive the installed `bmad-loop` console script as a subprocess in brand-new git
repositories, with an empty HOME (no git identity) and nothing of this checkout on the path.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONTRACT_TABLES = {"runs", "stories", "attempts", "candidates", "events", "leases"}
COPY_IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                     ".bmad-loop", ".venv", ".pytest_cache", "venv")


def _run(argv, *, env, cwd=None, timeout=900) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, argv))} exited {proc.returncode}\n"
        f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


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


def test_the_installed_wheel_inits_a_project_and_runs_the_demo_to_completion(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    bin_dir = env_dir / "bin"
    python = bin_dir / "python"
    env = _user_env(home, bin_dir)

    # Build from a copy of the working tree, so this checkout stays clean.
    source = tmp_path / "source"
    shutil.copytree(REPO_ROOT, source, ignore=COPY_IGNORE)
    setuptools_ok = subprocess.run(
        [python, "-c", "import setuptools, sys; "
                       "sys.exit(int(setuptools.__version__.split('.')[0]) < 68)"],
        env=env, capture_output=True).returncode == 0
    isolation = ["--no-build-isolation"] if setuptools_ok else []
    dist = tmp_path / "dist"
    _run([python, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", dist, source], env=env)
    (wheel,) = dist.glob("bmad_loop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for packaged in ("bmad_loop/_migrations/env.py", "bmad_loop/_migrations/script.py.mako",
                     "bmad_loop/policy_template.toml"):
        assert packaged in names, f"{packaged} is not in the wheel"
    assert any(n.startswith("bmad_loop/_migrations/versions/0001") for n in names)
    _run([python, "-m", "pip", "install", "-q", wheel], env=env)

    # The console script runs the installed copy, not this checkout.
    where = _run([python, "-c", "import bmad_loop, bmad_loop._migrations as m; "
                                "print(bmad_loop.__file__); print(m.__file__)"],
                 env=env, cwd=tmp_path).stdout.split()
    assert all(Path(p).is_relative_to(env_dir) for p in where), where
    bmad_loop = bin_dir / "bmad-loop"
    assert bmad_loop.is_file()
    assert _run([bmad_loop, "--help"], env=env, cwd=tmp_path).stdout.startswith("Usage:")

    # init in a fresh repository: a policy and a migrated state database.
    project = tmp_path / "project"
    project.mkdir()
    _run(["git", "init", "-q", "-b", "main"], env=env, cwd=project)
    _run([bmad_loop, "init"], env=env, cwd=project)
    assert (project / ".bmad-loop" / "policy.toml").is_file()
    _assert_migrated(project / ".bmad-loop" / "state.db")

    # demo: builds its own repository, runs the loop, every story lands.
    demo_dir = tmp_path / "demo"
    proc = _run([bmad_loop, "demo", "--dir", demo_dir, "--json"], env=env, cwd=tmp_path,
                timeout=600)
    result = json.loads(proc.stdout)
    assert result["exit_code"] == 0 and result["state"] == "completed", result
    assert result["stories"] and all(s["state"] == "integrated" for s in result["stories"]), result
    assert Path(result["dir"]).resolve() == demo_dir.resolve()
    _assert_migrated(demo_dir / ".bmad-loop" / "state.db")
    log = subprocess.run(["git", "log", "--first-parent", "--format=%s", "main"], cwd=demo_dir,
                         env=env, capture_output=True, text=True, check=True).stdout
    assert len(log.splitlines()) == len(result["stories"]) + 1  # one merge per story + initial
