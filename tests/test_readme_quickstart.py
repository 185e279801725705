"""The README's set-up and quick start, run as written in a fresh shell: its first set-up block
in a copy of this checkout, the way it says to reach the command, then the quick start's
`bmad-loop init`, `validate` and `run` lines in a new BMAD repository (with a policy that
names the scripted agent, the edit the README asks for)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path

from support import STORY_DIR, agent_command, git, init_repo

REPO_ROOT = Path(__file__).resolve().parents[1]
README = (REPO_ROOT / "README.md").read_text()
COPY_IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                     ".bmad-loop", ".venv", ".pytest_cache", "venv")


def _section(title: str) -> str:
    start = README.index(f"## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def _sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def _fresh_shell_env(home: Path) -> dict:
    """A new shell of the user's: no virtual environment, no Python or bmad-loop variables, an
    empty HOME; the user's own pip configuration (where their package index is) kept."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GIT_", "BMAD_LOOP_", "PYTHON", "VIRTUAL_ENV"))}
    path = [p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if "venv" not in p]
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", PATH=os.pathsep.join(path))
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    for config in (real_home / ".config" / "pip" / "pip.conf", real_home / ".pip" / "pip.conf"):
        if config.is_file() and "PIP_CONFIG_FILE" not in env:
            env["PIP_CONFIG_FILE"] = str(config)
    return env


def _bmad_project(root: Path) -> Path:
    return init_repo(root / "project", {
        f"{STORY_DIR}/sprint-status.yaml":
            "development_status:\n  epic-1: in-progress\n  1-1-hello: ready-for-dev\n",
        f"{STORY_DIR}/1-1-hello.md": '---\nfootprint:\n  files: ["hello.txt"]\n---\n# Story 1.1: Hello\n',
    }, message="board")


def test_the_readme_set_up_and_quick_start_run_as_written_in_a_fresh_shell(tmp_path):
    setup = _sh_blocks(_section("Set up"))[0].strip()
    assert len(setup.splitlines()) == 1 and "pip install" in setup
    reach = re.search(r"activate the environment first[^`]*`([^`]+)`", _section("Set up"))
    assert reach, "the README says how to reach the command after set-up"
    quick = _sh_blocks(_section("Quick start on a real repository"))
    init_line, check_and_run = quick[0].strip(), quick[1].strip()
    assert init_line.startswith("bmad-loop init") and "bmad-loop run" in check_and_run

    source = tmp_path / "bmad-loop"
    shutil.copytree(REPO_ROOT, source, ignore=COPY_IGNORE)
    project = _bmad_project(tmp_path)
    script = tmp_path / "agent.json"
    script.write_text(json.dumps({"1-1-hello": {"dev": [{"write": {"hello.txt": "hi\n"}}]}}))
    policy = tmp_path / "policy.toml"  # the edit the README asks for: an agent, no gates
    policy.write_text('[gates]\nmode = "none"\n[adapter]\n'
                      f"command = {json.dumps(agent_command(script))}\n")
    home = tmp_path / "home"
    home.mkdir()
    shell = "\n".join([
        "set -e", f"cd '{source}'", setup, reach.group(1), f"cd '{project}'", init_line,
        f"cp '{policy}' .bmad-loop/policy.toml", check_and_run])
    proc = subprocess.run(["/bin/sh", "-c", shell], env=_fresh_shell_env(home), capture_output=True,
                          text=True, timeout=1500, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert "1-1-hello" in proc.stdout and "integrated" in proc.stdout
    assert git(project, "show", "main:hello.txt") == "hi"
