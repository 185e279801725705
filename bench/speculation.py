#!/usr/bin/env python
"""A lane that keeps up with slow verification: speculative candidates against one at a time.

    python bench/speculation.py [--stories 8] [--agent-seconds 1] [--verify-seconds 3]
                                [--parallel 4] [--depths 1,4] [--files 200] [--dir DIR]

K independent stories (disjoint footprints) at N = `--parallel`; each agent session sleeps T
seconds and appends a line to its story's file; the one verify command sleeps V seconds, and
runs, as always, in each story's worktree after dev and on each candidate before the target
advances. Review off, gates none, `merge_strategy = "merge"`, 200 filler files. Each depth in
`--depths` is `[verify] parallel` (1: the one-at-a-time lane; N: the default, as deep as
`max_parallel`) on a fresh repository, one real run each (`enqueue` + `drive` in process, real
huey consumers on the embedded SQLite queue, real git), all in this one invocation.

Printed per depth: makespan (`enqueue` → `run.completed`), makespan / (K·V), the most candidates
verifying at once (from `candidate.composed` … `candidate.verified` spans), and whether the
target took the same sequence of trees as the one-at-a-time run. The aim (issue 16): 8 stories,
T = 1 s, V = 3 s, N = 4: makespan ≤ 0.6 × K·V = 14.4 s. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchStory, build_repo, git, load, machine, policy_text, run_loop, table  # noqa: E402


def stories(k: int) -> list[BenchStory]:
    keys = [f"1-{i}-s{i:02d}" for i in range(1, k + 1)]
    return [BenchStory(key, files=[f"work/{key}.txt"], writes=f"work/{key}.txt") for key in keys]


def policy(n: int, depth: int, t: float, v: float) -> str:
    agent = ["/bin/sh", "-c", f'sleep {t}; echo "done by the agent" >> "work/$BMAD_LOOP_STORY_KEY.txt"']
    text = policy_text(parallel=n, agent_argv=agent)
    return text.replace("[verify]\ncommands = []\n",
                        f'[verify]\ncommands = ["sleep {v}"]\nparallel = {depth}\n')


def most_at_once(result) -> int:
    """The most candidates whose verification spans overlap."""
    spans = []
    for e in result.events:
        if e["kind"] == "candidate.composed":
            spans.append([e["ts"], None, e["story"], e["data"].get("attempt")])
        elif e["kind"] in ("candidate.verified", "candidate.verify_failed"):
            for span in spans:
                if span[1] is None and span[2] == e["story"] and span[3] == e["data"].get("attempt"):
                    span[1] = e["ts"]
    edges = sorted([(s[0], 1) for s in spans if s[1]] + [(s[1], -1) for s in spans if s[1]],
                   key=lambda x: (x[0], x[1]))
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def trees(root: Path) -> list[str]:
    return git(root, "log", "--first-parent", "--format=%T", "main").split()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stories", type=int, default=8, help="K [8]")
    parser.add_argument("--agent-seconds", type=float, default=1.0, help="T [1]")
    parser.add_argument("--verify-seconds", type=float, default=3.0, help="V [3]")
    parser.add_argument("--parallel", type=int, default=4, help="N = max_parallel [4]")
    parser.add_argument("--depths", default="1,4", help="[verify] parallel values [1,4]")
    parser.add_argument("--files", type=int, default=200, help="tracked filler files [200]")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    args = parser.parse_args(argv)
    k, t, v, n = args.stories, args.agent_seconds, args.verify_seconds, args.parallel
    depths = [int(x) for x in args.depths.split(",")]
    base = args.dir or Path(tempfile.mkdtemp(prefix="bmad-loop-bench-speculation-"))
    base.mkdir(parents=True, exist_ok=True)

    print(f"# bench/speculation.py — K = {k} independent stories, T = {t} s agent, verify V = {v} s "
          f"(story worktree and candidate), N = {n}, {args.files} filler files")
    print(f"machine: {machine()}")
    print(f"load average at start: {load()}")
    print(f"work folder: {base}\n")

    rows, reference = [], None
    for depth in depths:
        root = build_repo(base / f"depth{depth}", stories(k), files=args.files,
                          policy=policy(n, depth, t, v))
        result = run_loop(root, workers=n)
        if result.state != "completed":
            print(f"depth {depth}: run {result.run_id} in {root} ended {result.state}", file=sys.stderr)
            return 1
        history = trees(root)
        if reference is None:
            reference = history
        print(f"  [verify] parallel = {depth}: makespan {result.makespan:.2f} s, load {load()}",
              file=sys.stderr, flush=True)
        rows.append([depth, f"{result.makespan:.2f}", f"{result.makespan / (k * v):.2f}",
                     most_at_once(result), "yes" if history == reference else "NO"])

    print(f"load average at end: {load()}\n")
    print(table(["[verify] parallel", "makespan s", "÷ K·V", "verifying at once",
                 f"same trees as parallel = {depths[0]}"], rows))
    print(f"\nK·V = {k * v:.1f} s. Aim (issue 16): at K = 8, T = 1 s, V = 3 s, N = 4, makespan "
          f"≤ 0.6 × K·V = {0.6 * k * v:.1f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
