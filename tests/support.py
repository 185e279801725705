"""What the tests share that is not a fixture: one helper per job, one argument order.

Fixtures live in conftest.py (and the service fixtures in backends.py); everything here is a
plain function, class or constant that a test module imports with `from support import ...`.
No test module imports another test module or conftest: what two modules need lives here once.

Conventions:
- Waiting is polling with a deadline, never a bare sleep: `wait_until(predicate, timeout=...,
  what=...)` and its relatives below all take the predicate first and the rest by keyword.
- Repositories are real git repositories shaped like BMAD projects (`build_repo`), driven by the
  scripted agent in tests/agents/scripted_agent.py.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
AGENT = TESTS / "agents" / "scripted_agent.py"
CI = os.environ.get("CI") == "true"
DEADLINE_S = 60.0  # the default patience of every wait below

STORY_DIR = "_bmad-output/implementation-artifacts"  # where BMAD keeps the board and stories
SETTLED = ("completed", "failed", "paused", "stopped")  # run states nothing moves on from
CONTRACT_TABLES = frozenset({"runs", "stories", "attempts", "candidates", "events", "leases"})
VIEWS = ("v_escalations", "v_flaky_commands", "v_integrations", "v_phase_usage", "v_run_usage", "v_story_runs",
         "v_story_usage", "v_waits")  # sorted

# The shape of a sprint-status.yaml as bmad-sprint-planning writes it.
# Line numbers matter to test_board (1-2-user-auth is line 13).
SAMPLE_BOARD = """\
# A sample BMAD sprint board, as `bmad-sprint-planning` writes it (shape only; content invented).
# Keys: epic-N, epic-N-retrospective, epic-N-retro-item-M-slug, and stories E-S[a]-slug
# (a one-letter lower-case suffix marks a split story: 2-6a, 2-6b). Other keys are not stories.
# Story statuses, in order (never regress): backlog, ready-for-dev, in-progress, review, done.
# Older boards may say `drafted`, which means ready-for-dev.
generated: 2026-11-20
project: sample-shop
story_location: _bmad-output/implementation-artifacts

development_status:
  epic-1: in-progress
  1-1-project-scaffold: done
  1-2-user-auth: ready-for-dev
  1-3-password-reset: ready-for-dev
  1-4-audit-log: backlog
  epic-1-retrospective: optional

  epic-2: backlog
  2-1-catalog-model: backlog
  2-2-catalog-api: backlog
  2-3a-search-index: backlog
  2-3b-search-ui: backlog
  epic-2-retrospective: optional
  epic-1-retro-item-1-flaky-login-test: backlog
"""

# The shape of a BMAD story file (create-story output).
SAMPLE_STORY = """\
---
title: User authentication
footprint:
  files: ["src/shop/auth/**", "tests/auth/**"]
  shared: ["src/shop/__init__.py", "CHANGELOG.md"]
  resources: ["database"]
---
# Story 1.2: User authentication

Status: ready-for-dev

## Story

As a shopper, I want to sign in with e-mail and password, so that my basket follows me.

## Acceptance Criteria

1. POST /login with valid credentials returns a session cookie.

## Dev Notes

The users table migration runs against the shared test database, hence the `database` resource.
"""


# ------------------------------------------------------------------------------ waiting
_NOT_YET = (AssertionError, KeyError, StopIteration)  # e.g. the run row is not there yet


def poll(predicate, *, timeout: float = DEADLINE_S, interval: float = 0.05):
    """predicate()'s first truthy value within `timeout` seconds, else its last (falsy) value:
    for helpers that report rather than fail. Errors in `_NOT_YET` count as "not yet"."""
    value, _ = _poll(predicate, timeout, interval)
    return value


def wait_until(predicate, *, timeout: float = DEADLINE_S, what: str = "condition",
               interval: float = 0.05):
    """Poll until predicate() is truthy and return that value; fail the test naming `what`
    after `timeout` seconds. A barrier instead of a sleep. Everything after the predicate is
    keyword-only: four helpers with clashing argument orders became this one."""
    value, last_error = _poll(predicate, timeout, interval)
    if value:
        return value
    raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                         + (f" (last error: {last_error!r})" if last_error else ""))


def _poll(predicate, timeout: float, interval: float):
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = predicate()
        except _NOT_YET as exc:
            value, last_error = None, exc
        if value or time.monotonic() > deadline:
            return value, last_error
        time.sleep(interval)


def wait_for_files(*paths: Path, timeout: float = DEADLINE_S) -> None:
    """Wait until every path exists (the scripted agent's `touch` barriers)."""
    wait_until(lambda: all(Path(p).exists() for p in paths), timeout=timeout,
               what=" and ".join(str(p) for p in paths))


def status_when(repo, predicate, *, what: str, run: str | None = None,
                timeout: float = DEADLINE_S) -> dict:
    """The first `status --json` of `repo` (of `run`, or the latest) for which predicate holds."""
    def matching():
        status = repo.status(run)
        return status if predicate(status) else None
    return wait_until(matching, timeout=timeout, what=what)


def settled_status(repo, run: str, *, timeout: float = DEADLINE_S) -> dict:
    """The status of `run` once it is in a state nothing moves on from (`SETTLED`)."""
    return status_when(repo, lambda s: s["run"]["state"] in SETTLED, run=run, timeout=timeout,
                       what=f"run {run} to settle")


# ------------------------------------------------------------------------------ processes
def alive(pid: int) -> bool:
    """True while `pid` is a running process; a zombie waiting for its parent counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def wait_for_exit(proc: subprocess.Popen, timeout: float = DEADLINE_S,
                  log: Path | None = None) -> int:
    """The exit code of `proc`; one still running after `timeout` is killed and the test fails
    with the tail of its `log`."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"{' '.join(map(str, proc.args))} did not exit within {timeout}s"
                    + (f"; log:\n{log.read_text()[-4000:]}" if log else ""))


def stop_processes(*procs: subprocess.Popen, timeout: float = 30) -> None:
    """Ctrl+C every process still running (all first, so they stop together), then wait for
    each; one that does not exit within `timeout` is killed."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cli_argv(*args: str) -> list[str]:
    """`bmad-loop ARGS` as an argv for a child process of this interpreter."""
    return [sys.executable, "-m", "bmad_loop", *args]


def project_argv(repo, *args: str) -> list[str]:
    """`bmad-loop COMMAND --project ROOT REST...` for `repo` (a SprintRepo)."""
    return cli_argv(args[0], "--project", str(repo.root), *args[1:])


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
    """`bmad-loop ARGS --project REPO` as a child process whose output the test can read."""
    return Child(project_argv(repo, *args), **popen)


# ------------------------------------------------------------------------------ state rows
def query(repo, sql: str, *params) -> list[tuple]:
    """Rows of `repo`'s SQLite state database; [] while there is no database yet."""
    path = repo.root / ".bmad-loop" / "state.db"
    if not path.exists():
        return []
    with sqlite3.connect(path, timeout=30) as conn:
        return conn.execute(sql, params).fetchall()


T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)  # the stepped clock's zero
TTL = 10.0  # the lease time-to-live of the stepped-clock tests, in seconds


def at(seconds: float) -> dt.datetime:
    """A moment `seconds` after T0: lease decisions take `now` from the test, never the wall."""
    return T0 + dt.timedelta(seconds=seconds)


# ------------------------------------------------------------------------------ git
def git(cwd: Path, *args: str, check: bool = True) -> str:
    """`git ARGS` in `cwd` with a throwaway identity; stdout stripped. Fails the test on error."""
    proc = subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@localhost", *args],
                          cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.strip()


def init_repo(root: Path, files: dict[str, str] | None = None, *, branch: str = "main",
              message: str = "base") -> Path:
    """A plain repository at `root` (made if absent) on `branch`, as a person makes one: the
    machine's git, no config of its own. With `files`, they are written and committed as one
    commit `message` by the test identity (`git`). Returns `root`."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", branch)
    if files:
        for rel, text in files.items():
            write(root / rel, text)
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", message)
    return root


def git_repo(root: Path, files: dict[str, str] | None = None):
    """A real repository on `main` as bmad-loop's own `Git` sees it: a clean environment and
    `user.useConfigOnly`, so it never guesses an identity. With `files`, one commit "base"."""
    from bmad_loop.git.runner import Git, clean_env

    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True, env=clean_env())
    repo = Git(root)
    repo.run("config", "user.useConfigOnly", "true")
    if files:
        for rel, text in files.items():
            write(root / rel, text)
        repo.run("add", "-A")
        repo.run("commit", "-q", "-m", "base", env=repo.identity_env())
    return repo


def remote_trees(bare: Path, branch: str = "main") -> list[str]:
    """The trees of `branch`'s first-parent history in a bare repository, oldest first."""
    shas = git(bare, "rev-list", "--first-parent", "--reverse", branch).splitlines()
    return [git(bare, "rev-parse", f"{sha}^{{tree}}") for sha in shas]


# ------------------------------------------------------------------------------ boards, stories
def write(path: Path, text: str) -> Path:
    """Write `text` to `path`, making its folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def board_with(*lines: str) -> str:
    """A minimal board: `development_status:` with one indented `key: status` per line."""
    return "development_status:\n" + "".join(f"  {line}\n" for line in lines)


@dataclass
class StoryDef:
    """One story of a test sprint: its key, footprint and front matter."""

    key: str
    files: list[str] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)
    resources: list[str] = field(default_factory=list)
    status: str = "ready-for-dev"
    extra_front_matter: dict = field(default_factory=dict)
    footprint: bool = True  # False: no footprint at all (exclusive, reason "missing")


def _story_text(story: StoryDef) -> str:
    front = {"title": story.key.split("-", 2)[-1].replace("-", " ").title()}
    if story.footprint:
        front["footprint"] = {"files": story.files, "shared": story.shared,
                              "resources": story.resources}
    front.update(story.extra_front_matter)
    epic, num = story.key.split("-")[:2]
    return ("---\n" + json.dumps(front, indent=2) + "\n---\n"
            f"# Story {epic}.{num}: {front['title']}\n\nStatus: {story.status}\n")


# ------------------------------------------------------------------------------ scripted agent
def agent_command(script_path: Path, *extra: str) -> list[str]:
    """The scripted agent as an `[adapter] command` reading `script_path`."""
    return [sys.executable, str(AGENT), str(script_path), *extra]


def write_each(stories, **step) -> dict:
    """A script in which each story's dev session writes `NAME = '<key>'` to its first file."""
    return {s.key: {"dev": [{"write": {s.files[0]: f"NAME = '{s.key}'\n"}, **step}]}
            for s in stories}


# Three stories with disjoint files, and the first two alone (the operator tests' sprint).
ALPHA_BETA_GAMMA = [
    StoryDef("1-1-alpha", files=["src/alpha.py"]),
    StoryDef("1-2-beta", files=["src/beta.py"]),
    StoryDef("1-3-gamma", files=["src/gamma.py"]),
]
ALPHA_BETA = ALPHA_BETA_GAMMA[:2]
# With them: alpha integrates; beta writes "bad", which the verify command rejects on every
# attempt, so beta escalates and the run pauses (exit 3).
BAD_BETA_SCRIPT = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]},
                   "1-2-beta": {"dev": [{"write": {"src/beta.py": "bad\n"}}]}}
REJECT_BAD_POLICY = ('[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n'
                     '[verify]\ncommands = ["! grep -q bad src/beta.py"]\n')


# File barriers: each agent touches `<bar>/in-<key>` when its dev session starts and blocks until
# the test creates `<bar>/go-<key>`, so the test decides exactly who is inside at the same time.
MERGE_NONE = '[scm]\nmax_parallel = {n}\nmerge_strategy = "{strategy}"\n[gates]\nmode = "none"\n'


def barrier_script(stories, bar: Path, extra: dict | None = None) -> dict:
    """A script whose dev sessions write their file, touch `in-<key>` and wait for `go-<key>`;
    `extra` adds step keys per story key."""
    script = {}
    for s in stories:
        step = {"write": {s.files[0].lstrip("/"): f"NAME = '{s.key}'\n"} if s.files else {"x.txt": s.key},
                "touch": [str(bar / f"in-{s.key}")], "wait_for": str(bar / f"go-{s.key}")}
        step.update((extra or {}).get(s.key, {}))
        script[s.key] = {"dev": [step]}
    return script


def inside(bar: Path) -> list[str]:
    """The story keys whose agents are inside dev (or were), sorted."""
    return sorted(p.name[3:] for p in bar.glob("in-*"))


def go(bar: Path, key: str) -> None:
    """Release `key`'s agent from its barrier."""
    (bar / f"go-{key}").write_text("go")


def states(repo) -> dict[str, str]:
    """Story key -> state, from `status --json`."""
    return {s["key"]: s["state"] for s in repo.status()["stories"]}


# ------------------------------------------------------------------------------ sprint repos
@dataclass
class SprintRepo:
    """A real repository with a BMAD board, driven through the CLI (in process or as children)."""

    root: Path
    script_path: Path
    board_rel: str = f"{STORY_DIR}/sprint-status.yaml"
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
                     f"command = {json.dumps(agent_command(self.script_path))}\ntimeout_s = 60\n")
        (self.root / ".bmad-loop").mkdir(exist_ok=True)
        (self.root / ".bmad-loop" / "policy.toml").write_text(text)

    def cli(self, *args: str, input: str | None = None):
        from click.testing import CliRunner

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
        proc = subprocess.Popen(project_argv(self, *args), stdout=log, stderr=subprocess.STDOUT,
                                env=full_env, start_new_session=True)
        self._spawned.append(proc)
        return proc

    def spawned_logs(self, tail: int = 3000) -> str:
        """The last `tail` characters of each log `spawn` wrote, for an assertion message."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-tail:]}"
                         for p in sorted(self.root.parent.glob(f"{self.root.name}-*.log")))

    def kill_spawned(self) -> None:
        """Kill what `spawn` started and is still running (never leave consumers behind), and the
        agent sessions they started: those lead sessions of their own, out of the group a kill
        reaches, and would otherwise outlive a test that failed while they waited."""
        import psutil

        from bmad_loop.agents.process import OWNER_VAR, SESSION_TOKEN_VAR, parse_owner
        from bmad_loop.proctree import kill_marked

        owners: dict[int, float] = {}  # pid -> start time of each killed bmad-loop process
        for proc in self._spawned:
            if proc.poll() is None:
                try:
                    top = psutil.Process(proc.pid)
                    for each in [top, *top.children(recursive=True)]:
                        owners[each.pid] = each.create_time()
                except psutil.Error:
                    pass
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                proc.wait()

        def started_by_them(env) -> bool:
            owner = parse_owner(env.get(OWNER_VAR))
            return owner is not None and owner[1] in owners and abs(owners[owner[1]] - owner[2]) < 1

        if owners:
            kill_marked(started_by_them, token_var=SESSION_TOKEN_VAR)

    def story(self, key: str, run: str | None = None) -> dict:
        return next(s for s in self.status(run)["stories"] if s["key"] == key)

    def commit_all(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def status(self, run: str | None = None) -> dict:
        result = self.cli("status", *([run] if run else []), "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    def journal(self, run: str | None = None) -> list[dict]:
        result = self.cli("journal", *([run] if run else []), "--json")
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in result.output.splitlines() if line.strip()]

    def events(self, kind: str, story: str | None = None, run: str | None = None) -> list[dict]:
        """The journal's events of `kind` (of `story`, when given) in the run `run` (newest by
        default), in order: what `journal --json` prints."""
        return [e for e in self.journal(run)
                if e["kind"] == kind and (story is None or e["story"] == story)]

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


def build_repo(parent: Path, stories: list[StoryDef], *, policy: str = "",
               script: dict | None = None, files: dict[str, str] | None = None,
               epic_status: dict[int, str] | None = None, name: str = "repo") -> SprintRepo:
    """A real git repository `parent/name` with a BMAD board, story files and the scripted agent
    (its script beside the repository). Use it through the `make_repo` fixture, which also stops
    what the repository spawned."""
    root = parent / name
    root.mkdir()
    init_repo(root)
    artifacts = root / STORY_DIR
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
    repo = SprintRepo(root=root, script_path=parent / f"{name}-script.json")
    repo.write_script(script or {})
    repo.write_policy(policy)
    repo.commit_all("initial")
    return repo


def make_remote_project(make_repo, stories, script, policy, name="repo"):
    """A checkout whose `origin` is a fresh bare repository; the policy names that remote.
    Returns (repo, bare)."""
    repo = make_repo(stories, script=script, policy=policy, name=name)
    bare = repo.root.parent / f"{name}-remote.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo.root), str(bare)], check=True)
    repo.git("remote", "add", "origin", str(bare))
    text = (repo.root / ".bmad-loop" / "policy.toml").read_text()
    (repo.root / ".bmad-loop" / "policy.toml").write_text(
        text.replace("[scm]\n", '[scm]\nremote = "origin"\n', 1))
    return repo, bare


# ------------------------------------------------------------------------------ the create phase
def drop_story_files(repo, *keys: str) -> None:
    """Remove these stories' files from `repo` and commit: backlog stories create-story has not
    written yet (build_repo writes every story's file)."""
    for key in keys:
        (repo.root / STORY_DIR / f"{key}.md").unlink()
    repo.commit_all("stories not created yet")


def create_step(story: StoryDef, **step) -> dict:
    """A scripted `create` step that writes `story`'s file, front matter and footprint as
    `StoryDef` declares them, where bmad-loop asked for it (`$BMAD_LOOP_STORY_FILE`, relative to
    the worktree: `<STORY_DIR>/<key>.md`); `step` adds or replaces step keys."""
    out = {"write": {f"{STORY_DIR}/{story.key}.md": _story_text(story)}}
    out.update(step)
    return out


# ------------------------------------------------------------------------------ stand-in agent CLIs
FAKE_CLIS = {"claude": "fake_claude.py", "codex": "fake_codex.py", "gemini": "fake_gemini.py"}


def install_fake_clis(bin_dir: Path) -> Path:
    """Executables `claude`, `codex` and `gemini` in `bin_dir` that run the stand-ins of
    tests/agents (put `bin_dir` first on PATH and name their script in FAKE_CLI_SCRIPT)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, script in FAKE_CLIS.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{TESTS / "agents" / script}" "$@"\n')
        path.chmod(0o755)
    return bin_dir


def story_file_text(story: StoryDef) -> str:
    """The story file `build_repo` writes for `story`, for tests that lay out their own board."""
    return _story_text(story)


def status_changes(before: str, after: str) -> dict[str, tuple[str, str]]:
    """Board key -> (old, new) status for each line that changed; asserts that the two texts
    have the same lines and that a changed line differs only in its status token."""
    old_lines, new_lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
    assert len(old_lines) == len(new_lines), "lines were added or removed"
    changes = {}
    for old, new in zip(old_lines, new_lines):
        if old == new:
            continue
        key, old_rest = old.split(":", 1)
        new_key, new_rest = new.split(":", 1)
        old_token, new_token = old_rest.split()[0], new_rest.split()[0]
        assert key == new_key and old_rest.replace(old_token, new_token, 1) == new_rest, (old, new)
        changes[key.strip()] = (old_token, new_token)
    return changes


def migrated_database(folder: Path):
    """A fresh, migrated state database with no rows: a real SQLite file `state.db` in
    `folder`. Tests take it as the `db` fixture (conftest.py), which also disposes of it."""
    from bmad_loop.db.database import Database

    database = Database(f"sqlite:///{folder / 'state.db'}", lock_wait_s=2.0)
    database.migrate()
    return database


def add_runs(database, runs=("r1",), *, max_parallel: int = 1):
    """One running run per id in `runs`, as the engine's rows would hold it (no repository
    behind it), for tests of the engine's row writes. Returns `database`."""
    from bmad_loop.db.models import Run

    with database.transaction() as s:
        for run_id in runs:
            s.add(Run(id=run_id, project="p", target_branch="main", target_sha="0" * 40,
                      state="running", max_parallel=max_parallel, merge_strategy="merge",
                      isolation="worktree", board_path="b", policy={}))
    return database


def state_database(folder: Path, runs=("r1",), *, max_parallel: int = 1):
    """A migrated state database in `folder` holding one running run per id in `runs`."""
    return add_runs(migrated_database(folder), runs, max_parallel=max_parallel)


def fill_disk(disk: Path) -> Path:
    """Write until the disk says no more (big chunks, then small ones for the last pages)."""
    filler = disk / "filler.bin"
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY)
    try:
        for size in (1 << 20, 4096, 512):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler
# ------------------------------------------------------------------------------ a run with a bit of everything
# For the run report (tests/test_html_report.py, tests/render_docs.py): five stories at
# max_parallel 3. a, b and c integrate as a speculative stack (their three candidates verify at
# once: the verify gate holds every candidate until `<bar>/release` exists; c's first review asks
# for changes, which a fix session makes); d's first dev
# session writes "bad", its verify fails and its second session passes (a retry); e writes "bad"
# twice and escalates, so the run pauses (exit 3). In a story worktree the gate fails on "bad",
# printing a diagnosis, and passes otherwise.
EVERYTHING = [StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"]),
              StoryDef("1-3-c", files=["src/c.py"]), StoryDef("2-1-d", files=["src/d.py"]),
              StoryDef("2-2-e", files=["src/e.py"])]
STACKED = {"1-1-a-1", "1-2-b-1", "1-3-c-1"}  # the candidates that verify at once
_EVERYTHING_GATE = '''\
import os, sys, time
bar = BAR
if "/candidates/" not in os.getcwd():
    for name in sorted(os.listdir("src")):
        if "bad" in open(os.path.join("src", name)).read():
            print(f"DIAGNOSIS: src/{name} says bad")
            sys.exit(1)
    sys.exit(0)
open(os.path.join(bar, "verifying-" + os.path.basename(os.getcwd())), "a").close()
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(bar, "release")) and time.monotonic() < deadline:
    time.sleep(0.02)
'''


def everything_run(make_repo, bar: Path, policy: str = ""):
    """The repository of the run above (not run yet); `policy` adds sections (a back-end)."""
    gate = _EVERYTHING_GATE.replace("BAR", repr(str(bar)))  # in the repository: a short command
    command = json.dumps("python3 tools/check.py")
    script = write_each(EVERYTHING[:3])
    script["1-3-c"].update(review=[{"exit": 1, "say": "rename it"}, {"exit": 0}],
                           fix=[{"write": {"src/c.py": "NAME_C = '1-3-c'\n"}}])
    script["2-1-d"] = {"dev": [{"write": {"src/d.py": "bad\n"}}, {"write": {"src/d.py": "D = 1\n"}}]}
    script["2-2-e"] = {"dev": [{"write": {"src/e.py": "bad\n"}}]}
    text = MERGE_NONE.format(n=3, strategy="merge") + f"[verify]\ncommands = [{command}]\n" + policy
    return make_repo(EVERYTHING, script=script, policy=text,
                     files={"src/__init__.py": "", "tools/check.py": gate})


def run_everything(repo, bar: Path, *args: str) -> int:
    """`run ARGS` as a process; once the three candidates verify at once, release them.
    Returns the exit code (3: e escalated, the run paused)."""
    proc = repo.spawn("run", *args)
    try:
        wait_until(lambda: {p.name[len("verifying-"):] for p in bar.glob("verifying-*")} >= STACKED,
                   what="three candidates verifying at once")
        (bar / "release").write_text("")
        return proc.wait(timeout=DEADLINE_S * 2)
    finally:
        repo.kill_spawned()


def run_agent(argv, *, cwd, env, log_path, label=None, stop_event=None, on_start=None, **limits):
    """`supervise` with its Command and Limits spelled as keywords, as the process tests write
    them."""
    from bmad_loop.agents.process import Command, Limits, supervise

    return supervise(Command(argv, cwd, env, label), log_path, Limits(**limits),
                     stop_event=stop_event, on_start=on_start)
