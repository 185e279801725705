"""`bmad-loop demo`: a small BMAD-shaped repository, a scripted agent, a real run, a summary.

Needs nothing but the package: the repository is made with git in a fresh folder, the agent is
`python -m bmad_loop.cli.demo_agent`, and the run uses the embedded SQLite default.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import ConfigError
from ..engine.run.consumers import drive
from ..engine.run.planning import enqueue
from ..engine.project import Project, ensure_state_dir
from ..engine.run.status import run_status
from ..policy import load_policy
from ..bmad.selection import Selection
from ..queue.tasks import Tasks
from ..engine.journal import EventKind

__all__ = ["run_demo", "build_demo_repo"]

# (key, title, files footprint, shared footprint, files written, lines appended)
STORIES = [
    ("1-1-greeting", "Greeting", ["src/greet.py"], ["/NOTES.md"],
     {"src/greet.py": "def greet(name):\n    return f'Hello, {name}!'\n"},
     {"NOTES.md": "- 1-1: greet()\n"}),
    ("1-2-arithmetic", "Arithmetic helpers", ["src/arith.py"], ["/NOTES.md"],
     {"src/arith.py": "def add(a, b):\n    return a + b\n"},
     {}),
    ("1-3-farewell", "Farewell (same file as the greeting: serialised)", ["src/greet.py"], [],
     {"src/greet.py": "def greet(name):\n    return f'Hello, {name}!'\n\n\n"
                      "def farewell(name):\n    return f'Goodbye, {name}!'\n"}, {}),
    ("2-1-report", "Report", ["src/report.py"], [],
     {"src/report.py": "def total(xs):\n    t = 0\n"
                       "    for x in xs:\n        t += x\n    return t\n"}, {}),
    ("2-2-docs", "Usage docs", ["docs/**"], [],
     {"docs/usage.md": "# Usage\n\nCall greet(), add() and total().\n"}, {}),
    ("2-3-multiply", "Multiplication", ["src/mul.py"], [],
     {"src/mul.py": "def mul(a, b):\n    return a * b\n"}, {}),
    ("3-1-changelog", "Changelog", ["CHANGELOG.md"], [],
     {"CHANGELOG.md": "# Changelog\n\n- first release\n"}, {}),
]

CHECK_PY = '''"""Demo verification: every module that exists imports and behaves."""
import importlib, pathlib, sys
sys.path.insert(0, "src")
for path in sorted(pathlib.Path("src").glob("*.py")):
    importlib.import_module(path.stem)
if pathlib.Path("src/greet.py").exists():
    from greet import greet
    assert greet("Ada") == "Hello, Ada!"
if pathlib.Path("src/report.py").exists():
    from report import total
    assert total([1, 2, 3]) == 6
print("demo checks passed")
'''


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=demo", "-c", "user.email=demo@localhost", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout


def build_demo_repo(root: Path, count: int = 5, parallel: int = 2) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise ConfigError(f"--dir: {root} is not empty; give a new or empty folder")
    chosen = STORIES[:max(1, min(count, len(STORIES)))]
    _git(root, "init", "-q", "-b", "main")
    artifacts = root / "_bmad-output" / "implementation-artifacts"
    artifacts.mkdir(parents=True)
    (root / "src").mkdir()
    (root / "README.md").write_text("# demo shop\n\nA repository made by `bmad-loop demo`.\n")
    (root / "NOTES.md").write_text("# Notes\n")
    (root / "check.py").write_text(CHECK_PY)
    (root / ".gitignore").write_text("__pycache__/\n*.pyc\n.bmad-loop/\n")
    board = ["# sprint board written by bmad-loop demo", "generated: 2026-12-02", "project: demo",
             "", "development_status:"]
    epics = sorted({int(key.split("-")[0]) for key, *_ in chosen})
    for epic in epics:
        board.append(f"  epic-{epic}: {'in-progress' if epic == epics[0] else 'backlog'}")
        for key, title, files, shared, writes, append in chosen:
            if int(key.split("-")[0]) != epic:
                continue
            board.append(f"  {key}: ready-for-dev")
            front = {"title": title, "footprint": {"files": files, "shared": shared},
                     "demo": {"writes": writes, "append": append}}
            (artifacts / f"{key}.md").write_text(
                "---\n" + json.dumps(front, indent=2) + "\n---\n"
                f"# Story {key.split('-')[0]}.{key.split('-')[1]}: {title}\n\nStatus: ready-for-dev\n\n"
                "## Acceptance Criteria\n\n1. The demo checks pass.\n")
        board.append(f"  epic-{epic}-retrospective: optional")
        board.append("")
    (artifacts / "sprint-status.yaml").write_text("\n".join(board))
    state = ensure_state_dir(root)
    verify = f"{shlex.quote(sys.executable)} -B check.py"
    (state / "policy.toml").write_text(
        "# Policy written by bmad-loop demo\n"
        "[scm]\n"
        f"max_parallel = {parallel}\n"
        'merge_strategy = "merge"\n\n'
        "[gates]\n"
        'mode = "none"\n\n'
        "[verify]\n"
        f"commands = [{json.dumps(verify)}]\n\n"
        "[adapter]\n"
        f"command = [{json.dumps(sys.executable)}, \"-m\", \"bmad_loop.cli.demo_agent\", \"{{phase}}\"]\n"
        "timeout_s = 120\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "demo: initial commit")
    return root


def run_demo(directory: Path | None, *, parallel: int = 2, count: int = 5, echo=print) -> dict:
    say = echo or (lambda *_: None)
    root = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="bmad-loop-demo-"))
    started = time.monotonic()
    build_demo_repo(root.resolve(), count=count, parallel=parallel)
    say(f"demo repository: {root}")
    project = Project(root=root.resolve(), policy=load_policy(root))
    tasks = Tasks(project)
    run_id, plan = enqueue(project, tasks, project.policy, Selection())
    assert run_id is not None  # the demo repository always has stories to run
    say(f"run {run_id}: {len(plan.stories)} stories, max_parallel={parallel}, strategy=merge")

    def progress(event):
        if event.kind in (EventKind.STORY_QUEUED, EventKind.STORY_READY, EventKind.STORY_INTEGRATED, EventKind.STORY_ESCALATED,
                          EventKind.STORY_WAITING, EventKind.RUN_COMPLETED, EventKind.RUN_PAUSED, EventKind.CANDIDATE_STALE):
            detail = event.data.get("reason") or ""
            say(f"  {event.ts:%H:%M:%S} {event.kind:<18} {event.story or ''} {detail}".rstrip())

    code = drive(project, tasks, run_id, workers=parallel, progress=progress)
    elapsed = time.monotonic() - started
    with project.db.transaction() as s:
        from ..db.models import Run

        status = run_status(s, s.get_one(Run, run_id))
    history = _git(root, "log", "--first-parent", "--format=%h %s", "main").splitlines()
    say("")
    say("stories:")
    for story in status["stories"]:
        say(f"  {story['seq']}. {story['key']:<16} {story['state']}")
    say("target history (first parent, newest first):")
    for line in history:
        say(f"  {line}")
    say(f"run {status['run']['state']} in {elapsed:.1f}s (exit {code})")
    project.close()
    return {"dir": str(root), "run_id": run_id, "exit_code": code, "elapsed_s": round(elapsed, 2),
            "stories": [{"key": s["key"], "state": s["state"]} for s in status["stories"]],
            "history": history, "state": status["run"]["state"]}
