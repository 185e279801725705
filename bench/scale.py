#!/usr/bin/env python
"""Per-story cost as the sprint grows: does the loop's own work stay flat in K?

    python bench/scale.py [--stories 10,100,300] [--parallel 4,1] [--files 200]
                          [--writes story-file|new-file] [--small-runs 3] [--dir DIR]

For each K (number of stories) and N (`max_parallel`): a fresh BMAD-shaped repository with
`--files` tracked filler files and K independent stories (footprint `work/<key>.txt`, disjoint),
then one real run (``enqueue`` + ``drive`` in process: real huey consumers on the embedded
SQLite queue, real git), ``merge_strategy = "merge"``, review off, no verify commands, gates
``none``, and an *instant* agent (``/bin/sh`` appending one line), so what is measured is the
loop itself.

What the agent writes: `story-file` (default) appends to the story's own file (always part of
its footprint), so the repository keeps its size through the run; `new-file` creates
`work/<key>.txt`, so the tree grows by one file per story and every later checkout
(`worktree add`) is that much bigger: at K = 300 the last stories check out ~800 files
instead of ~500, a cost of the repository's size, not of the loop.

Printed per (K, N): start-up (the ``enqueue`` call until the first ``story.queued``: planning
reads K story files once), makespan (``enqueue`` until ``run.completed``), and the per-story
cost (makespan − start-up) / K; then, per N, the ratio of each K's per-story cost to the
smallest K's, all from this one invocation. The aim (issue 15): K = 300 within 1.2 × K = 10
at N = 4. Not a test: nothing is asserted.

The smallest K is a short run (K = 10: ~1.5 s) whose per-story figure moves by a quarter with
the machine, and a long run heats the machine for what follows it. So the smallest K runs
`--small-runs` times (default 3), once before the larger ones and the rest after them, and
the ratio's denominator is the median of those runs (each is printed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BenchStory, build_repo, load, machine, median, policy_text, run_loop, table,
)

# The agent: one line appended to a file; /bin/sh costs about a millisecond.
AGENTS = {
    "story-file": ["/bin/sh", "-c", 'echo "done by the agent" >> "$BMAD_LOOP_STORY_FILE"'],
    "new-file": ["/bin/sh", "-c", 'echo "$BMAD_LOOP_STORY_KEY" >> "work/$BMAD_LOOP_STORY_KEY.txt"'],
}


def stories(k: int) -> list[BenchStory]:
    keys = [f"1-{i}-s{i:03d}" for i in range(1, k + 1)]
    return [BenchStory(key, files=[f"work/{key}.txt"], writes=f"work/{key}.txt") for key in keys]


def one_run(folder: Path, k: int, n: int, files: int, writes: str):
    policy = policy_text(parallel=n, agent_argv=AGENTS[writes])
    root = build_repo(folder / "repo", stories(k), files=files, policy=policy)
    result = run_loop(root, workers=n)
    if result.state != "completed":
        print(f"K={k} N={n}: run {result.run_id} in {root} ended {result.state} "
              f"(exit {result.exit_code})", file=sys.stderr)
        return None
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stories", default="10,100,300", help="values of K, comma-separated")
    parser.add_argument("--parallel", default="4,1", help="values of N, comma-separated [4,1]")
    parser.add_argument("--files", type=int, default=200, help="tracked filler files [200]")
    parser.add_argument("--writes", choices=sorted(AGENTS), default="story-file",
                        help="what the agent writes [story-file]")
    parser.add_argument("--small-runs", type=int, default=3,
                        help="runs of the smallest K, around the others; their median is the "
                             "ratio's denominator [3]")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    args = parser.parse_args(argv)
    ks = sorted({int(x) for x in args.stories.split(",")})
    ns = [int(x) for x in args.parallel.split(",")]
    base = args.dir or Path(tempfile.mkdtemp(prefix="bmad-loop-bench-scale-"))
    base.mkdir(parents=True, exist_ok=True)

    print(f"# bench/scale.py — K in {ks}, N in {ns}, instant agent writing its {args.writes}, "
          f"{args.files} filler files, independent stories, strategy merge, review off, "
          "no verify commands, gates none")
    print(f"machine: {machine()}")
    print(f"load average at start: {load()}")
    print(f"work folder: {base}\n")

    rows = []
    for n in ns:
        # The smallest K brackets the larger ones: once before them, the other runs after.
        order = [ks[0]] + ks[1:] + [ks[0]] * max(args.small_runs - 1, 0)
        measured: dict[int, list] = {}
        for i, k in enumerate(order):
            result = one_run(base / f"k{k}-n{n}-{i}", k, n, args.files, args.writes)
            if result is None:
                return 1
            up = result.startup
            cost = (result.makespan - up) / k
            measured.setdefault(k, []).append((up, result.makespan, cost))
            print(f"  K={k} N={n}: makespan {result.makespan:.2f} s, start-up {up:.2f} s, "
                  f"{cost * 1000:.0f} ms per story, load {load()}", file=sys.stderr, flush=True)
        small = median(c for _u, _m, c in measured[ks[0]])
        for k in ks:
            for up, span, cost in measured[k]:
                rows.append([k, n, f"{up:.2f}", f"{span:.2f}", f"{cost * 1000:.0f}",
                             f"{cost / small:.2f}"])

    print(f"load average at end: {load()}\n")
    print(table(["K", "N", "start-up s", "makespan s", "per story ms",
                 f"÷ K = {ks[0]} (median)"], rows))
    print(f"\nper story = (makespan − start-up) / K; start-up = enqueue → first story.queued. "
          f"Aim (issue 15): at N = 4, K = {ks[-1]} ≤ 1.2 × K = {ks[0]}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
