"""Shared pieces of the benchmarks: a BMAD-shaped repository, an in-process run, the journal.

Not a test helper: the benchmarks print tables. Everything here drives the real engine the way
`bmad-loop run` does (`enqueue` + `drive`: real huey consumers on the embedded SQLite queue,
real git, real agent processes), only in this process so the timings are not blurred by CLI
start-up.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bmad_loop.db.models import Attempt, Candidate, Run, Story
from bmad_loop.engine.run.consumers import drive
from bmad_loop.engine.journal import events_after
from bmad_loop.engine.run.planning import Selection, enqueue
from bmad_loop.engine.project import Project, ensure_state_dir
from bmad_loop.policy import load_policy
from bmad_loop.queue.tasks import Tasks
from sqlalchemy import select

BOARD_DIR = Path("_bmad-output") / "implementation-artifacts"
IDENTITY = ["-c", "user.name=bench", "-c", "user.email=bench@localhost",
            "-c", "commit.gpgsign=false"]


def git(cwd: Path, *args: str, input: str | None = None) -> str:
    proc = subprocess.run(["git", *IDENTITY, *args], cwd=cwd, capture_output=True, text=True,
                          input=input)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


@dataclass
class BenchStory:
    key: str  # E-S-slug
    files: list[str]
    shared: list[str] = field(default_factory=list)
    resources: list[str] = field(default_factory=list)
    writes: str = ""  # the file the agent appends one line to (repository-relative)


def filler_files(root: Path, count: int, per_dir: int = 100) -> None:
    """`count` small tracked files spread over folders of `per_dir`: a repository of some size."""
    for i in range(count):
        folder = root / "pkg" / f"d{i // per_dir:03d}"
        if i % per_dir == 0:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"m{i:05d}.py").write_text(
            f'"""Filler module {i}."""\n\n\ndef value_{i}():\n    return {i}\n')


def build_repo(root: Path, stories: list[BenchStory], *, files: int, policy: str) -> Path:
    """A git repository with `files` filler files, a sprint board, story files and a policy."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    (root / "README.md").write_text("# benchmark repository\n")
    (root / ".gitignore").write_text(".bmad-loop/\n")
    (root / "work").mkdir()
    (root / "work" / "README.md").write_text("files the benchmark agents write\n")
    filler_files(root, files)
    artifacts = root / BOARD_DIR
    artifacts.mkdir(parents=True)
    board = ["# sprint board written by bmad-loop bench", "development_status:"]
    epics: dict[int, list[BenchStory]] = {}
    for story in stories:
        epics.setdefault(int(story.key.split("-")[0]), []).append(story)
    for epic, members in epics.items():
        board.append(f"  epic-{epic}: in-progress")
        for story in members:
            board.append(f"  {story.key}: ready-for-dev")
            front = {"title": story.key.split("-", 2)[-1],
                     "footprint": {"files": story.files, "shared": story.shared,
                                   "resources": story.resources}}
            (artifacts / f"{story.key}.md").write_text(
                "---\n" + json.dumps(front, indent=2) + "\n---\n"
                f"# Story {story.key}\n\nStatus: ready-for-dev\n")
        board.append(f"  epic-{epic}-retrospective: optional")
    (artifacts / "sprint-status.yaml").write_text("\n".join(board) + "\n")
    state = ensure_state_dir(root)
    (state / "policy.toml").write_text(policy)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "bench: initial commit")
    return root


def policy_text(*, parallel: int, agent_argv: list[str], resources: dict[str, int] | None = None,
                strategy: str = "merge") -> str:
    lines = [
        "# written by bmad-loop bench",
        "[scm]",
        f"max_parallel = {parallel}",
        f'merge_strategy = "{strategy}"',
        "",
        "[gates]",
        'mode = "none"',
        "",
        "[review]",
        "enabled = false",
        "",
        "[verify]",
        "commands = []",
        "",
        "[adapter]",
        f"command = {json.dumps(agent_argv)}",
        "timeout_s = 600",
        "",
    ]
    if resources:
        lines.append("[resources]")
        lines += [f"{json.dumps(name)} = {cap}" for name, cap in resources.items()]
        lines.append("")
    return "\n".join(lines)


@dataclass
class RunResult:
    run_id: str
    exit_code: int
    state: str
    t_enqueue: float  # time.time() just before enqueue()
    t_returned: float  # time.time() when drive() returned (consumers stopped)
    events: list[dict]
    stories: list[dict]
    attempts: list[dict]
    candidates: list[dict]

    def ts(self, kind: str, story: str | None = None, first: bool = True) -> float | None:
        hits = [e["ts"] for e in self.events if e["kind"] == kind
                and (story is None or e["story"] == story)]
        if not hits:
            return None
        return hits[0] if first else hits[-1]

    @property
    def t_completed(self) -> float:
        done = self.ts("run.completed") or self.ts("run.paused") or self.ts("run.failed")
        return done if done is not None else self.t_returned

    @property
    def startup(self) -> float:
        """enqueue → first story.queued: planning, which reads each story file once."""
        first = self.ts("story.queued")
        return (first if first is not None else self.t_enqueue) - self.t_enqueue

    @property
    def makespan(self) -> float:
        """Wall time from the enqueue call to the run's settling event (run.completed)."""
        return self.t_completed - self.t_enqueue


def _epoch(value: dt.datetime) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.timestamp()


def run_loop(root: Path, *, workers: int) -> RunResult:
    """enqueue + drive in this process, as `bmad-loop run` does; returns the rows and events."""
    project = Project(root=root.resolve(), policy=load_policy(root))
    project.db  # create and migrate the database before the clock starts (first use only)
    tasks = Tasks(project)
    t0 = time.time()
    run_id, _plan = enqueue(project, tasks, project.policy, Selection())
    code = drive(project, tasks, run_id, workers=workers, progress=None)
    t1 = time.time()
    with project.db.transaction() as s:
        run = s.get(Run, run_id)
        events = [{"seq": e.seq, "ts": _epoch(e.ts), "kind": e.kind, "story": e.story,
                   "data": e.data or {}} for e in events_after(s, run_id, 0)]
        stories = [{"id": x.id, "key": x.key, "seq": x.seq, "state": x.state}
                   for x in s.scalars(select(Story).where(Story.run_id == run_id)
                                      .order_by(Story.seq))]
        attempts = [{"story_id": a.story_id, "phase": a.phase, "duration_s": a.duration_s,
                     "state": a.state}
                    for a in s.scalars(select(Attempt).where(Attempt.run_id == run_id))]
        candidates = [{"story_id": c.story_id, "state": c.state, "attempt": c.attempt}
                      for c in s.scalars(select(Candidate).where(Candidate.run_id == run_id))]
        state = run.state
    project.close()
    return RunResult(run_id, code, state, t0, t1, events, stories, attempts, candidates)


def mean(xs) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else float("nan")


def median(xs) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def table(headers: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A Markdown table; `align` is one letter per column (l or r), default: first l, rest r."""
    align = align or ("l" + "r" * (len(headers) - 1))
    widths = [max([len(str(h))] + [len(str(r[i])) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        out = []
        for i, cell in enumerate(cells):
            cell = str(cell)
            out.append(cell.ljust(widths[i]) if align[i] == "l" else cell.rjust(widths[i]))
        return "| " + " | ".join(out) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else (":" + "-" * (w + 1))
                         for w, a in zip(widths, align)) + "|"
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def machine() -> str:
    git_version = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()
    return (f"{os.cpu_count()} CPU(s), Python {sys.version.split()[0]}, {git_version}, "
            f"{os.uname().sysname} {os.uname().release}")


def load() -> str:
    """The 1/5/15-minute load averages: other work on the machine skews every figure."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
