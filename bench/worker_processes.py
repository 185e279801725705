#!/usr/bin/env python
"""What-if: the story consumers in several processes instead of threads of one.

    python bench/worker_processes.py [--stories 8] [--agent-seconds 2] [--parallel 4]
                                     [--processes 2,4] [--files 200] [--repeat 2]

`bmad-loop run` drives a run with one process: the lane thread and N story-consumer threads
share one Python interpreter, so their Python work (SQLAlchemy, the git wrapper, the session's
set-up and end) takes turns on one lock while it overlaps in time (at a round boundary of an
N = 4 sprint, four workers commit, are refilled and prepare at once). This measures how much
of the makespan that costs, with what users can already do: `bmad-loop worker` processes.

Each run is a fresh repository with K independent stories (bench/makespan.py's `independent`
sprint: each agent sleeps T and appends one line to its story's file), max_parallel N, and the
consumers started as separate processes before `bmad-loop enqueue`:

- *threads*: one `bmad-loop worker --queue all -w N` (what `run` does in process);
- *P processes*: one `bmad-loop worker --queue integration` (the lane) and P processes of
  `bmad-loop worker --queue stories -w N/P`.

Makespan = `run.created` → `run.completed` from the journal (so the CLI's own start-up is not
counted). Modes alternate within each repeat. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import build_repo, load, machine, policy_text, table  # noqa: E402
from makespan import sprint  # noqa: E402

CLI = [sys.executable, "-m", "bmad_loop"]
SETTLED = ("completed", "failed", "paused", "stopped")


def _consumers(root: Path, mode: int, n: int) -> list[subprocess.Popen]:
    """mode 0: one process, N threads; mode P: the lane alone and P story processes."""
    def worker(*args):
        return subprocess.Popen([*CLI, "worker", "--project", str(root), *args],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if mode == 0:
        return [worker("--queue", "all", "-w", str(n))]
    return [worker("--queue", "integration")] + [
        worker("--queue", "stories", "-w", str(max(1, n // mode))) for _ in range(mode)]


def _ready(db: Path, procs: list[subprocess.Popen]) -> None:
    """Each consumer process has opened the state database (the lane holds its lease)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise SystemExit("a worker process exited early")
        try:
            with sqlite3.connect(db) as con:
                if con.execute("select count(*) from leases where name like 'lane:%'").fetchone()[0]:
                    time.sleep(1.0)  # the story processes start beside it
                    return
        except sqlite3.Error:
            pass
        time.sleep(0.1)
    raise SystemExit("the consumers did not start within 60 s")


def _makespan(db: Path) -> tuple[str, float]:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as con:
            row = con.execute("select state from runs").fetchone()
        if row and row[0] in SETTLED:
            break
        time.sleep(0.1)
    else:
        raise SystemExit("the run did not settle within 600 s")
    with sqlite3.connect(db) as con:
        ts = dict(con.execute("select kind, ts from events "
                              "where kind in ('run.created', 'run.completed')").fetchall())
    if "run.completed" not in ts:
        return row[0], float("nan")
    at = lambda s: dt.datetime.fromisoformat(s).timestamp()  # noqa: E731
    return row[0], at(ts["run.completed"]) - at(ts["run.created"])


def one_run(folder: Path, mode: int, k: int, n: int, t: float, files: int) -> float:
    folder.mkdir(parents=True)
    stories = sprint("independent", k)
    map_file = folder / "agent-writes.map"
    map_file.write_text("".join(f"{s.key} {s.writes}\n" for s in stories))
    script = (f'sleep {t:g}; f=$(sed -n "s/^$BMAD_LOOP_STORY_KEY //p" {map_file}); '
              'echo "$BMAD_LOOP_STORY_KEY" >> "$f"')
    root = build_repo(folder / "repo", stories, files=files,
                      policy=policy_text(parallel=n, agent_argv=["/bin/sh", "-c", script]))
    subprocess.run([*CLI, "status", "--project", str(root), "--json"], capture_output=True)
    db = root / ".bmad-loop" / "state.db"
    procs = _consumers(root, mode, n)
    try:
        _ready(db, procs)
        done = subprocess.run([*CLI, "enqueue", "--project", str(root)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise SystemExit(f"enqueue failed: {done.stderr.strip()}")
        state, span = _makespan(db)
        if state != "completed":
            print(f"  run in {root} ended {state}", file=sys.stderr)
        return span
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stories", type=int, default=8)
    parser.add_argument("--agent-seconds", type=float, default=2.0)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--processes", default="2,4", help="story processes P to try [2,4]")
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    modes = [0] + [int(x) for x in args.processes.split(",") if x.strip()]
    print(f"# bench/worker_processes.py — K = {args.stories}, T = {args.agent_seconds:g} s, "
          f"N = {args.parallel}\nmachine: {machine()}\nload average at start: {load()}\n")
    base = Path(tempfile.mkdtemp(prefix="bmad-loop-bench-procs-"))
    spans: dict[int, list[float]] = {m: [] for m in modes}
    for r in range(args.repeat):
        for m in modes:
            span = one_run(base / f"r{r}-m{m}", m, args.stories, args.parallel,
                           args.agent_seconds, args.files)
            spans[m].append(span)
            label = "threads" if m == 0 else f"{m} story processes"
            print(f"  repeat {r + 1}, {label}: makespan {span:.2f} s, load {load()}", flush=True)
    print(f"\nload average at end: {load()}\n")
    rows = []
    for m in modes:
        best = min(spans[m])
        rows.append(["one process, N threads" if m == 0 else f"lane + {m} story processes",
                     ", ".join(f"{x:.2f}" for x in spans[m]), f"{best:.2f}",
                     f"{min(spans[0]) / best:.3f}"])
    print(table(["consumers", "makespans s", "best s", "threads ÷ this"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
