"""Shared fixtures: real git repositories shaped like BMAD projects, a scripted agent, the CLI.

Every test gets its own HOME with no git identity, so nothing on this machine (a global
user.name, hooks, templates) can make a test pass that would fail on a fresh machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

AGENT = Path(__file__).parent / "agents" / "scripted_agent.py"
CI = os.environ.get("CI") == "true"


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch):
    """A fresh HOME without git identity; the machine's git config cannot leak in."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for name in list(os.environ):
        if name.startswith(("GIT_AUTHOR", "GIT_COMMITTER", "BMAD_LOOP_")):
            monkeypatch.delenv(name)
    return home


def git(cwd: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@localhost", *args],
                          cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.strip()


@dataclass
class StoryDef:
    key: str
    files: list[str] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)
    resources: list[str] = field(default_factory=list)
    status: str = "ready-for-dev"
    extra_front_matter: dict = field(default_factory=dict)
    footprint: bool = True  # False: no footprint at all (exclusive, reason "missing")


@dataclass
class SprintRepo:
    root: Path
    script_path: Path
    board_rel: str = "_bmad-output/implementation-artifacts/sprint-status.yaml"
    _spawned: list = field(default_factory=list)

    @property
    def board(self) -> Path:
        return self.root / self.board_rel

    def write_script(self, script: dict) -> None:
        self.script_path.write_text(json.dumps(script))

    def calls(self) -> list[dict]:
        path = Path(str(self.script_path) + ".calls")
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def write_policy(self, body: str, *, agent: bool = True) -> None:
        text = body
        if agent and "[adapter]" not in body:
            text += ("\n[adapter]\n"
                     f"command = [{json.dumps(sys.executable)}, {json.dumps(str(AGENT))}, "
                     f"{json.dumps(str(self.script_path))}]\ntimeout_s = 60\n")
        (self.root / ".bmad-loop").mkdir(exist_ok=True)
        (self.root / ".bmad-loop" / "policy.toml").write_text(text)

    def cli(self, *args: str, input: str | None = None):
        from bmad_loop.cli import cli

        runner = CliRunner()
        return runner.invoke(cli, [args[0], "--project", str(self.root), *args[1:]],
                             input=input, catch_exceptions=False)

    def git(self, *args: str, check: bool = True) -> str:
        return git(self.root, *args, check=check)

    def spawn(self, *args: str, env: dict | None = None, log_name: str = "spawn") -> subprocess.Popen:
        """`bmad-loop ARGS --project ROOT` as a real process (output to a log beside the repo)."""
        full_env = dict(os.environ)
        full_env.update(env or {})
        log = open(self.root.parent / f"{self.root.name}-{log_name}-{len(self._spawned)}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "bmad_loop", args[0], "--project",
                                 str(self.root), *args[1:]], stdout=log, stderr=subprocess.STDOUT,
                                env=full_env, start_new_session=True)
        self._spawned.append(proc)
        return proc

    def story(self, key: str, run: str | None = None) -> dict:
        return next(s for s in self.status(run)["stories"] if s["key"] == key)

    def commit_all(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def status(self, run: str | None = None) -> dict:
        result = self.cli("status", *( [run] if run else []), "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    def journal(self, run: str | None = None) -> list[dict]:
        result = self.cli("journal", *([run] if run else []), "--json")
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in result.output.splitlines() if line.strip()]

    def bmad_branches(self) -> list[str]:
        out = self.git("for-each-ref", "--format=%(refname)", "refs/heads/bmad-loop", "refs/bmad-loop")
        return [line for line in out.splitlines() if line]

    def worktrees(self) -> list[str]:
        out = self.git("worktree", "list", "--porcelain")
        return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")]

    def first_parent_trees(self, branch: str = "main") -> list[dict]:
        """The target's history as (subject, parents count, files) per first-parent commit."""
        shas = self.git("rev-list", "--first-parent", "--reverse", branch).splitlines()
        out = []
        for sha in shas:
            parents = self.git("rev-list", "--parents", "-n", "1", sha).split()[1:]
            files = sorted(self.git("ls-tree", "-r", "--name-only", sha).splitlines())
            out.append({"sha": sha, "subject": self.git("log", "-1", "--format=%s", sha),
                        "parents": len(parents), "files": files,
                        "tree": self.git("rev-parse", f"{sha}^{{tree}}")})
        return out

    def board_status(self, key: str, ref: str = "main") -> str:
        text = self.git("show", f"{ref}:{self.board_rel}")
        for line in text.splitlines():
            if line.strip().startswith(f"{key}:"):
                return line.split(":", 1)[1].split("#")[0].strip()
        raise KeyError(key)


def wait_until(predicate, timeout: float = 60.0, what: str = "condition", interval: float = 0.05):
    """Poll until predicate() is truthy; fail the test with `what` after `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = predicate()
        except (AssertionError, KeyError, StopIteration) as exc:  # e.g. the run is not there yet
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f" (last error: {last_error})" if last_error else ""))
        time.sleep(interval)


def _story_text(story: StoryDef) -> str:
    front = {"title": story.key.split("-", 2)[-1].replace("-", " ").title()}
    if story.footprint:
        front["footprint"] = {"files": story.files, "shared": story.shared,
                              "resources": story.resources}
    front.update(story.extra_front_matter)
    epic, num = story.key.split("-")[:2]
    return ("---\n" + json.dumps(front, indent=2) + "\n---\n"
            f"# Story {epic}.{num}: {front['title']}\n\nStatus: {story.status}\n")


@pytest.fixture
def make_repo(tmp_path):
    """Build a real git repository with a BMAD board, story files and a scripted agent."""

    built = []

    def build(stories: list[StoryDef], *, policy: str = "", script: dict | None = None,
              files: dict[str, str] | None = None, epic_status: dict[int, str] | None = None,
              name: str = "repo") -> SprintRepo:
        root = tmp_path / name
        root.mkdir()
        git(root, "init", "-q", "-b", "main")
        artifacts = root / "_bmad-output" / "implementation-artifacts"
        artifacts.mkdir(parents=True)
        (root / "README.md").write_text("# test repo\n")
        for rel, text in (files or {"src/__init__.py": ""}).items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        lines = ["# test board", "development_status:"]
        epics: dict[int, list[StoryDef]] = {}
        for story in stories:
            epics.setdefault(int(story.key.split("-")[0]), []).append(story)
        for epic, members in epics.items():
            lines.append(f"  epic-{epic}: {(epic_status or {}).get(epic, 'backlog')}  # epic {epic}")
            for story in members:
                lines.append(f"  {story.key}: {story.status}")
                (artifacts / f"{story.key}.md").write_text(_story_text(story))
            lines.append(f"  epic-{epic}-retrospective: optional")
        (artifacts / "sprint-status.yaml").write_text("\n".join(lines) + "\n")
        (root / ".gitignore").write_text(".bmad-loop/\n")
        repo = SprintRepo(root=root, script_path=tmp_path / f"{name}-script.json")
        repo.write_script(script or {})
        repo.write_policy(policy)
        repo.commit_all("initial")
        built.append(repo)
        return repo

    yield build
    for repo in built:  # never leave consumer processes behind
        for proc in repo._spawned:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                proc.wait()
