#!/usr/bin/env python
"""The N = 1 cycle, step by step: from one agent's end to the next agent's start.

    python bench/cycle.py [--stories 16] [--agent-seconds 0.5] [--files 200] [--repeat 3]
                          [--against SRC]

At `max_parallel = 1` the loop's overhead per story is this cycle (plus the run's start spread
over its stories). Each run is `bench/makespan.py`'s independent sprint at N = 1 in a fresh
repository, driven in a child process; the steps are read from the journal, per pair of
consecutive stories A, B, and their medians printed:

| step | from → to |
|:--|:--|
| commit | A's `attempt.finished` → A's `story.ready` |
| to the candidate | A's `story.ready` → A's `candidate.composed` (the lane's wake-up and compose) |
| advance | A's `candidate.composed` → A's `story.integrated` |
| landed → B prepared | A's `story.integrated` → B's `story.prepared` |
| B's session set-up | B's `story.prepared` → B's `attempt.started` |
| cycle | A's `attempt.finished` → B's `attempt.started` |
| child CPU / K | user + system CPU of the whole child run (its git and agent processes included, and the repository's build, the same for every run) / K |

`--against SRC` runs another engine's source folder (e.g. a `git worktree` of an earlier
commit: its `src`) alternately with this one, run by run, in one invocation, and prints both
and the paired differences (this − other): the machine's speed drifts by a fifth over
minutes here, so only pairs compare. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load, machine, table  # noqa: E402

HERE = Path(__file__).resolve().parent
OWN_SRC = HERE.parent / "src"
STEPS = ("commit", "to the candidate", "advance", "landed → B prepared", "B's session set-up",
         "cycle", "child CPU / K")


def _stamp(value) -> float:
    return dt.datetime.fromisoformat(str(value)).timestamp() * 1000.0


def steps_of(state_db: Path) -> dict[str, float]:
    """Median ms of each step over the run's consecutive pairs (see the module)."""
    con = sqlite3.connect(state_db)
    try:
        rows = con.execute("SELECT kind, ts, story FROM events ORDER BY seq").fetchall()
    finally:
        con.close()
    first: dict[tuple[str, str], float] = {}
    order: list[str] = []
    for kind, at, story in rows:
        first.setdefault((story, kind), _stamp(at))
        if kind == "story.queued" and story not in order:
            order.append(story)
    spans: dict[str, list[float]] = {name: [] for name in STEPS if name != "child CPU / K"}
    for a, b in zip(order, order[1:]):
        at = lambda story, kind: first[(story, kind)]  # noqa: E731
        spans["commit"].append(at(a, "story.ready") - at(a, "attempt.finished"))
        spans["to the candidate"].append(at(a, "candidate.composed") - at(a, "story.ready"))
        spans["advance"].append(at(a, "story.integrated") - at(a, "candidate.composed"))
        spans["landed → B prepared"].append(at(b, "story.prepared") - at(a, "story.integrated"))
        spans["B's session set-up"].append(at(b, "attempt.started") - at(b, "story.prepared"))
        spans["cycle"].append(at(b, "attempt.started") - at(a, "attempt.finished"))
    return {name: statistics.median(values) for name, values in spans.items()}


def one_run(src: Path, work: Path, args) -> dict[str, float]:
    """makespan.py's independent sprint at N = 1 with the engine in `src`, in a child process."""
    env = dict(os.environ, PYTHONPATH=str(src))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, str(HERE / "makespan.py"), "--stories", str(args.stories),
                    "--agent-seconds", str(args.agent_seconds), "--files", str(args.files),
                    "--parallel", "1", "--sprints", "independent", "--no-adjacent",
                    "--dir", str(work)],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    steps = steps_of(work / "independent-n1-r1" / "repo" / ".bmad-loop" / "state.db")
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    steps["child CPU / K"] = cpu_s * 1000.0 / args.stories
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stories", type=int, default=16)
    parser.add_argument("--agent-seconds", type=float, default=0.5)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another engine's src folder, alternated")
    args = parser.parse_args()
    engines = [("this", OWN_SRC)] + ([("other", args.against.resolve())] if args.against else [])
    print(f"# bench/cycle.py — N = 1, K = {args.stories}, T = {args.agent_seconds} s, "
          f"{args.files} files, {args.repeat} repeat(s)")
    print(f"machine: {machine()}")
    print(f"load average at start: {load()}")
    results: dict[str, list[dict]] = {name: [] for name, _ in engines}
    with tempfile.TemporaryDirectory(prefix="bmad-loop-bench-cycle-") as tmp:
        for r in range(args.repeat):
            for name, src in (engines if r % 2 == 0 else engines[::-1]):
                steps = one_run(src, Path(tmp) / f"{name}-{r}", args)
                results[name].append(steps)
                print(f"  {name:5s} run {r + 1}: cycle {steps['cycle']:6.1f} ms, child CPU / K "
                      f"{steps['child CPU / K']:6.1f} ms, load {load()}", flush=True)
    print(f"load average at end: {load()}\n")
    header = ["step (median ms)"] + [f"{name} run {i + 1}" for name, _ in engines
                                     for i in range(args.repeat)]
    rows = [[step] + [f"{results[name][i][step]:.1f}" for name, _ in engines
                      for i in range(args.repeat)] for step in STEPS]
    print(table(header, rows))
    if args.against:
        diffs = {step: [a[step] - b[step] for a, b in zip(results["this"], results["other"])]
                 for step in STEPS}
        print("\nPaired differences, this − other (ms): negative = this engine is faster\n")
        print(table(["step", "per pair", "median"],
                    [[step, ", ".join(f"{d:+.1f}" for d in diffs[step]),
                      f"{statistics.median(diffs[step]):+.1f}"] for step in STEPS]))


if __name__ == "__main__":
    main()
