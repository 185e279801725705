#!/usr/bin/env python
"""The loop's own cost per story, beside the same git operations run bare.

    python bench/overhead.py [--files 2000] [--stories 10] [--strategy merge] [--no-write]
                             [--agent-s S] [--count [--count-depth N]] [--reuse] [--no-pool]
                             [--probe] [--what-if EXPERIMENT]

Builds a BMAD-shaped repository with `--files` small tracked files and `--stories` independent
stories, then:

1. *bare* (K stories before the loop and K after it, so a drift of the machine shows): for each
   story, the git operations the loop cannot avoid, run by hand on the same repository: ``worktree add -b``, write a file, ``add -A`` + ``commit``, ``merge-tree
   --write-tree``, ``commit-tree``, ``update-ref`` (compare-and-swap, on a scratch branch),
   ``worktree remove``, ``branch -D``;
2. *loop*: one real run (``enqueue`` + ``drive``, in process, real huey consumers on the embedded
   SQLite queue) with ``max_parallel = 1``, ``merge_strategy = "merge"``, review disabled, no
   verify commands, gates ``none``, and an agent that is a tiny Python script: it appends one
   line to ``work/<story>.txt`` (so the worker has something to commit, like the bare sequence)
   and exits 0 (``--no-write``: it writes nothing).

``--count`` adds git processes per story (by subcommand and by the engine function that asked)
and state-database transactions per story (bench/_count.py); ``--reuse`` also runs the bare
sequence the way the loop now does it with its worktree pool (engine/workspace/pool.py): the
first story adds a worktree, each story parks it (``status``, ``update-ref --no-deref HEAD
HEAD``, ``worktree move``), the next takes it (``worktree move``, ``clean -ffdx``, ``checkout
-f -b``), the last park is drained (``worktree remove``), and prints the loop against both
floors; ``--no-pool``
runs the loop without the pool (``BMAD_LOOP_WORKTREE_POOL=0``: add + remove per story, as
before); ``--agent-s 2`` makes the agent take 2 s (issue 15's N = 1 figure).

Prints Markdown tables: per-story time of both, their ratio, CPU time per story of this
process and of its child processes (git, the agents) for the bare sequence and the loop, the loop's time split into phases
from the journal (``events``) and the attempt rows, and each phase beside the bare operations
that do its git work. ``--probe`` adds git calls, database and repository lock waits per step.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BenchStory, build_repo, git, load, machine, mean, median, ms, policy_text, run_loop, table,
)
from bmad_loop.engine.workspace.pool import POOL_ENV  # noqa: E402

AGENT = '''import os, sys, time
time.sleep(float(os.environ.get("BENCH_AGENT_S", "0")))
if os.environ.get("BENCH_WRITE", "1") == "1":
    key = os.environ["BMAD_LOOP_STORY_KEY"]
    with open(os.path.join("work", key + ".txt"), "a") as handle:
        handle.write(key + "\\n")
sys.exit(0)
'''

# (label, from event, to event): consecutive spans of one story at max_parallel = 1.
PHASES = [
    ("dispatch (queued → worker picks it up)", "story.queued", "story.started"),
    ("prepare (worktree take or add, seed)", "story.started", "story.prepared"),
    ("agent set-up (prompt, attempt row)", "story.prepared", "attempt.started"),
    ("agent process (spawn → exit)", "attempt.started", "attempt.finished"),
    ("verify (no commands) + commit + drift", "attempt.finished", "story.ready"),
    ("lane wake-up (ready → lane picks it)", "story.ready", "story.integrating"),
    ("compose (merge-tree, board edit, commit-tree)", "story.integrating", "candidate.composed"),
    ("candidate verify (no commands)", "candidate.composed", "candidate.verified"),
    ("advance (dirty check, CAS, checkout sync)", "candidate.verified", "story.integrated"),
]


# Which bare operations do the git work of which loop phase (the rest is coordination).
MATCH = [
    ("dispatch (queued → worker picks it up)", []),
    ("prepare (worktree take or add, seed)", ["worktree add -b"]),
    ("agent set-up (prompt, attempt row)", []),
    ("agent process (spawn → exit)", ["write a file"]),
    ("verify (no commands) + commit + drift", ["add -A", "commit"]),
    ("lane wake-up (ready → lane picks it)", []),
    ("compose (merge-tree, board edit, commit-tree)", ["merge-tree --write-tree", "commit-tree"]),
    ("candidate verify (no commands)", []),
    ("advance (dirty check, CAS, checkout sync)", ["update-ref (CAS)"]),
    ("clean-up + admission (integrated → next queued)", ["worktree remove", "branch -D"]),
]


def _timed(per_op: dict[str, list[float]], name: str, fn):
    """`fn()`, its wall time appended to `per_op[name]`."""
    t = time.perf_counter()
    out = fn()
    per_op.setdefault(name, []).append(time.perf_counter() - t)
    return out


def cpu_times() -> tuple[float, float]:
    """(this process, its reaped child processes) CPU seconds, user + system."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def cpu_since(start: tuple[float, float]) -> tuple[float, float]:
    now = cpu_times()
    return now[0] - start[0], now[1] - start[1]


def bare(root: Path, count: int, write: bool, tag: str = "a") -> tuple[list[float], dict[str, list[float]]]:
    """The loop's unavoidable git work, by hand; per-story seconds and per-operation seconds."""
    target = f"bench-bare-target-{tag}"
    git(root, "branch", target, "main")
    folder = root / ".bmad-loop" / "bare-worktrees"
    folder.mkdir(parents=True, exist_ok=True)
    per_story: list[float] = []
    per_op: dict[str, list[float]] = {}
    timed = functools.partial(_timed, per_op)

    for i in range(count):
        branch, wt = f"bench-bare/{tag}{i}", folder / f"{tag}{i}"
        started = time.perf_counter()
        old = git(root, "rev-parse", f"refs/heads/{target}")
        timed("worktree add -b", lambda: git(root, "worktree", "add", "-q", "-b", branch, str(wt), old))
        if write:
            timed("write a file", lambda: (wt / "work" / f"bare-{tag}{i}.txt").write_text(f"{i}\n"))
        else:
            timed("write a file", lambda: None)
        _commit_and_land(timed, root, wt, i, branch, target, old)
        timed("worktree remove", lambda: git(root, "worktree", "remove", str(wt)))
        timed("branch -D", lambda: git(root, "branch", "-D", branch))
        per_story.append(time.perf_counter() - started)
    git(root, "branch", "-D", target)
    return per_story, per_op



def _commit_and_land(timed, root: Path, wt: Path, i: int, branch: str, target: str, old: str) -> None:
    """The bare story's commit, its merge onto the scratch target and the CAS."""
    timed("add -A", lambda: git(wt, "add", "-A"))
    timed("commit", lambda: git(wt, "commit", "-q", "--allow-empty", "-m", f"bare story {i}"))
    head = git(wt, "rev-parse", "HEAD")
    tree = timed("merge-tree --write-tree",
                 lambda: git(root, "merge-tree", "--write-tree", old, head).splitlines()[0])
    new = timed("commit-tree", lambda: git(root, "commit-tree", tree, "-p", old, "-p", head,
                                           input=f"Merge {branch}\n"))
    timed("update-ref (CAS)", lambda: git(root, "update-ref", f"refs/heads/{target}", new, old))

def bare_pooled(root: Path, count: int, write: bool, tag: str = "p") -> tuple[list[float], dict[str, list[float]]]:
    """`bare` as the loop does it with its worktree pool: one ``worktree add -b`` for the first
    story; after each story the worktree is parked (``status``, ``update-ref --no-deref HEAD
    HEAD``, ``worktree move`` into the pool) and the next story takes it (``worktree move`` to its
    path, ``clean -ffdx``, ``checkout -f --no-track -b <branch> <target>``); the last one is
    drained (``worktree remove``). Per-story seconds and per-operation seconds."""
    target = f"bench-bare-target-{tag}"
    git(root, "branch", target, "main")
    folder = root / ".bmad-loop" / "bare-worktrees"
    folder.mkdir(parents=True, exist_ok=True)
    spare = folder / f"{tag}-pool"
    per_story: list[float] = []
    per_op: dict[str, list[float]] = {}
    timed = functools.partial(_timed, per_op)

    for i in range(count):
        branch, wt = f"bench-bare/{tag}{i}", folder / f"{tag}{i}"
        started = time.perf_counter()
        old = git(root, "rev-parse", f"refs/heads/{target}")
        if i == 0:
            timed("worktree add -b (first story)", lambda: git(root, "worktree", "add", "-q", "-b",
                                                               branch, str(wt), old))
        else:
            timed("take: worktree move", lambda: git(root, "worktree", "move", str(spare), str(wt)))
            timed("take: clean -ffdx", lambda: git(wt, "clean", "-q", "-ffdx"))
            timed("take: checkout -f -b", lambda: git(wt, "checkout", "-q", "-f", "--no-track",
                                                      "-b", branch, old))
        if write:
            (wt / "work" / f"bare-{tag}{i}.txt").write_text(f"{i}\n")
        _commit_and_land(timed, root, wt, i, branch, target, old)
        timed("park: status", lambda: git(wt, "status", "--porcelain", "-z", "--untracked-files=all"))
        timed("park: update-ref --no-deref HEAD", lambda: git(wt, "update-ref", "--no-deref",
                                                              "HEAD", "HEAD"))
        timed("park: worktree move", lambda: git(root, "worktree", "move", str(wt), str(spare)))
        timed("branch -D", lambda: git(root, "branch", "-D", branch))
        if i == count - 1:
            timed("drain: worktree remove (last story)", lambda: git(root, "worktree", "remove", str(spare)))
        per_story.append(time.perf_counter() - started)
    git(root, "branch", "-D", target)
    return per_story, per_op


def loop_breakdown(result, keys: list[str]) -> tuple[list[list[str]], dict]:
    """Per-phase mean/median over stories from the journal, plus the gaps between stories."""
    spans: dict[str, list[float]] = {}
    for label, start, end in PHASES:
        values = []
        for key in keys:
            a, b = result.ts(start, key), result.ts(end, key)
            if a is not None and b is not None:
                values.append(b - a)
        spans[label] = values
    # Between stories: from story k integrated to story k+1 queued (clean-up + admission);
    # the last story's clean-up ends at run.completed.
    between = []
    for k, key in enumerate(keys):
        a = result.ts("story.integrated", key)
        b = result.ts("story.queued", keys[k + 1]) if k + 1 < len(keys) else result.ts("run.completed")
        if a is not None and b is not None:
            between.append(b - a)
    spans["clean-up + admission (integrated → next queued)"] = between
    first = result.ts("story.queued", keys[0])
    spans_run = {
        "enqueue (plan, rows) → run.created": [result.ts("run.created") - result.t_enqueue],
        "run start (consumers, first admission)": [first - result.ts("run.created")],
    }
    return spans, spans_run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000, help="tracked filler files [2000]")
    parser.add_argument("--stories", type=int, default=10, help="stories K [10]")
    parser.add_argument("--strategy", default="merge", choices=("ff", "merge", "squash"))
    parser.add_argument("--no-write", action="store_true",
                        help="the agent writes nothing (the worker then commits nothing)")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    parser.add_argument("--probe", action="store_true",
                        help="also measure git calls, database lock waits and queue polls per "
                             "step of the lane and the worker (bench/_probe.py)")
    parser.add_argument("--count", action="store_true",
                        help="also count git processes (by subcommand and caller) and "
                             "state-database transactions per story (bench/_count.py)")
    parser.add_argument("--agent-s", type=float, default=0.0, metavar="S",
                        help="the agent sleeps S seconds before it writes (issue 15 uses 2) [0]")
    parser.add_argument("--reuse", action="store_true",
                        help="also run the bare sequence with the worktree pool (take and park "
                             "instead of worktree add + remove) and compare the loop with it")
    parser.add_argument("--no-pool", action="store_true",
                        help="run the loop without its worktree pool (BMAD_LOOP_WORKTREE_POOL=0)")
    parser.add_argument("--count-depth", type=int, default=1, metavar="N",
                        help="with --count: engine frames named per git call [1]")
    parser.add_argument("--what-if", action="append", default=[], metavar="EXPERIMENT",
                        help="monkeypatch the engine in this process to try a change: "
                             "dispatch-first, poll=SECONDS (bench/_whatif.py); repeatable")
    args = parser.parse_args(argv)
    import _whatif

    banners = [_whatif.apply(spec) for spec in args.what_if]
    write = not args.no_write

    base = args.dir or Path(tempfile.mkdtemp(prefix="bmad-loop-bench-overhead-"))
    base.mkdir(parents=True, exist_ok=True)
    agent = base / "agent.py"
    agent.write_text(AGENT)
    keys = [f"1-{i + 1}-story{i + 1:02d}" for i in range(args.stories)]
    stories = [BenchStory(key, files=[f"work/{key}.txt"]) for key in keys]
    agent_argv = [sys.executable, "-I", "-S", str(agent)]
    policy = policy_text(parallel=1, agent_argv=agent_argv, strategy=args.strategy)
    root = build_repo(base / "repo", stories, files=args.files, policy=policy)
    env = ([] if write else ['BENCH_WRITE = "0"']) + (
        [f'BENCH_AGENT_S = "{args.agent_s}"'] if args.agent_s else [])
    if env:
        (root / ".bmad-loop" / "policy.toml").write_text(
            policy + "\n[adapter.env]\n" + "\n".join(env) + "\n")

    print(f"# bench/overhead.py — {args.stories} stories, {args.files} filler files, "
          f"max_parallel 1, strategy {args.strategy}")
    for banner in banners:
        print(banner)
    print(f"machine: {machine()}")
    print(f"load average at start: {load()}")
    print(f"repository: {root}")
    print(f"agent: {' '.join(agent_argv)} ({'appends one line to work/<story>.txt' if write else 'writes nothing'}), exit 0\n")

    git(root, "status", "--porcelain")  # warm the file-system cache for both sides alike
    cpu_at = cpu_times()
    before, ops_before = bare(root, args.stories, write, "a")
    bare_cpu = cpu_since(cpu_at)
    if args.reuse:
        pooled_before, pooled_ops = bare_pooled(root, args.stories, write, "p")
    if args.no_pool:
        os.environ[POOL_ENV] = "0"  # read by the engine when it parks (this process only)
    if args.probe:
        import _probe

        _probe.install()
    if args.count:
        import _count

        _count.DEPTH = args.count_depth
        _count.install()
    cpu_at = cpu_times()
    result = run_loop(root, workers=1)
    loop_cpu = cpu_since(cpu_at)
    if args.count:
        counted = _count.totals()
    after, ops_after = bare(root, args.stories, write, "b")
    if args.reuse:
        pooled_after, pooled_ops_after = bare_pooled(root, args.stories, write, "q")
    print(f"load average at end: {load()}\n")
    bare_story = before + after
    bare_ops = {name: ops_before[name] + ops_after[name] for name in ops_before}
    if result.state != "completed":
        print(f"run {result.run_id} ended {result.state} (exit {result.exit_code})", file=sys.stderr)
        return 1

    agent_s = [a["duration_s"] for a in result.attempts if a["phase"] == "dev"]
    whole = result.makespan / args.stories
    steady_span = result.ts("story.integrated", keys[-1]) - result.ts("story.queued", keys[0])
    steady = steady_span / args.stories
    bare_mean = mean(bare_story)
    loop_no_agent = whole - mean(agent_s)

    print("## Per story\n")
    print(table(["", "ms / story", "× bare"], [
        ["bare git operations (mean)", ms(bare_mean), "1.0"],
        ["bare git operations (median)", ms(median(bare_story)), f"{median(bare_story) / bare_mean:.1f}"],
        ["  bare, before the loop / after it (means)", f"{ms(mean(before))} / {ms(mean(after))}", ""],
        ["loop, whole run (enqueue → run.completed) / K", ms(whole), f"{whole / bare_mean:.1f}"],
        ["loop, first queued → last integrated / K", ms(steady), f"{steady / bare_mean:.1f}"],
        ["loop, whole run / K, minus the agent process", ms(loop_no_agent),
         f"{loop_no_agent / bare_mean:.1f}"],
        ["  of which the agent process (attempt duration_s)", ms(mean(agent_s)), ""],
    ]))
    print(f"\nloop / bare = {whole / bare_mean:.2f} (whole run), "
          f"{loop_no_agent / bare_mean:.2f} without the agent process")
    print(f"overhead per story (whole run / K minus the agent process): {ms(loop_no_agent)} ms"
          + (f" with a {args.agent_s:g} s agent" if args.agent_s else ""))

    k = args.stories
    print("\nCPU time per story (less noisy than wall time on a shared machine: it does not wait "
          "for the disk):\n")
    print(table(["", "this process ms", "child processes ms", "sum ms"], [
        ["bare git operations (before the loop)", "0", ms(bare_cpu[1] / k), ms(bare_cpu[1] / k)],
        ["loop, whole run (the agents' own CPU included)", ms(loop_cpu[0] / k), ms(loop_cpu[1] / k),
         ms(sum(loop_cpu) / k)],
    ]))

    spans, spans_run = loop_breakdown(result, keys)
    total = sum(mean(v) for v in spans.values())
    print("\n## The loop's time per story, by phase (from the journal)\n")
    rows = [[label, ms(mean(v)), ms(median(v)), f"{100 * mean(v) / total:.0f}%"]
            for label, v in spans.items()]
    rows.append(["sum of phases", ms(total), "", "100%"])
    print(table(["phase", "mean ms", "median ms", "share"], rows))
    print("\nThe same phases beside the bare operations that do that phase's git work:\n")
    rows = []
    for label, ops in MATCH:
        loop_ms = mean(spans[label])
        bare_ms = sum(mean(bare_ops[o]) for o in ops) if ops else 0.0
        rows.append([label, ms(loop_ms), " + ".join(ops) or "(none: coordination)", ms(bare_ms),
                     ms(loop_ms - bare_ms)])
    print(table(["loop phase", "loop ms", "bare operations", "bare ms", "extra ms"], rows,
                align="lrlrr"))
    print("\nOnce per run (not per story):\n")
    print(table(["", "ms"], [[label, ms(v[0])] for label, v in spans_run.items()]))

    print("\n## The bare git operations, per story\n")
    print(table(["operation", "mean ms"], [[name, ms(mean(v))] for name, v in bare_ops.items()]
                + [["total", ms(bare_mean)]]))
    if args.reuse:
        pooled = pooled_before + pooled_after
        ops = {k: pooled_ops[k] + pooled_ops_after[k] for k in pooled_ops}
        runs = 2 * args.stories  # per story: what each operation costs summed over its runs / K
        print("\n## The loop against both bare floors\n")
        print(f"loop {'without' if args.no_pool else 'with'} its worktree pool\n")
        print(table(["", "ms / story", "loop overhead / floor"], [
            ["loop, whole run / K, minus the agent process", ms(loop_no_agent), ""],
            ["bare floor, worktree add + remove per story", ms(bare_mean),
             f"{loop_no_agent / bare_mean:.2f}"],
            ["bare floor, the pool's take + park (one add, one drain)", ms(mean(pooled)),
             f"{loop_no_agent / mean(pooled):.2f}"],
        ]))
        print("\nThe pooled bare sequence, per story (sum over all stories / K):\n")
        print(table(["operation", "ms / story"], [[k, ms(sum(v) / runs)] for k, v in ops.items()]
                    + [["total", ms(mean(pooled))]]))
        fresh = mean(bare_ops["worktree add -b"]) + mean(bare_ops["worktree remove"])
        again = sum(sum(v) / runs for k, v in ops.items() if k.startswith(("take", "park", "worktree add", "drain")))
        print(f"\nworktree work per story: take + park {ms(again)} ms, add + remove {ms(fresh)} ms "
              f"(ratio {again / fresh:.2f})")
    if args.count:
        print("\n## Count: git processes and transactions per story (whole run / K)\n")
        print(f"git processes per story: {counted[0] / args.stories:.1f}; "
              f"transactions per story: {counted[1] / args.stories:.1f}; "
              f"SQL statements per story: {counted[2] / args.stories:.1f}\n")
        print(_count.report(args.stories))
    if args.probe:
        print("\n## Probe: the loop's steps (per story = total / K)\n")
        print(_probe.report(args.stories))
    return 0


if __name__ == "__main__":
    sys.exit(main())
