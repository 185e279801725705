#!/usr/bin/env python
"""Makespan of a synthetic sprint at several `max_parallel`, beside the schedule's lower bound.

    python bench/makespan.py [--stories 16] [--agent-seconds 2] [--parallel 1,2,4]
                             [--sprints independent,mixed[,mixed-adjacent]] [--files 200]
                             [--repeat 1] [--probe] [--what-if EXPERIMENT]
                             [--adjacent-seconds 3] [--no-adjacent]

Two sprints of K stories in one epic, each agent session sleeping T seconds and then appending
one line to its story's file:

- *independent*: every story writes its own file (disjoint footprints);
- *mixed*: 4 pairs of stories write the same file (file conflicts: the second of a pair starts
  only once the first is integrated), 2 stories share the resource ``service:db`` with
  capacity 1 (``[resources] "service:db" = 1``), the rest are independent. The second story of
  each pair sits half a sprint after the first, so the lower bound is reachable;
- *mixed-adjacent* (not run by default): the same, with each pair next to each other in plan
  order, where plan-order integration itself costs a round at N = 4 (see `layout`).

And, by default, the *adjacent-pairs* sprint of issue 15: 8 stories, T = 3 s, N = 4, where
stories 1-2 write one file, 3-4 another, 5-6 share a capacity-1 resource and 7-8 are free. Its
bound with stacked starts is 9 s (stories 2 and 4 start at 3 s on their finished, unintegrated
predecessors; 6 still waits for 5's integration, because resources are held until then);
without stacking the admission rules allow 12 s. Printed: makespan, both schedules, the ratio
(aim: makespan <= 1.2 x the stacked schedule).

Each (sprint, N) is a fresh repository and one real run (``enqueue`` + ``drive`` in process: real
huey consumers on the embedded SQLite queue, real git, real agent processes), ``merge_strategy =
"merge"``, review disabled, no verify commands, gates ``none``.

Printed per (sprint, N): the makespan (wall time from the ``enqueue`` call to ``run.completed``),
the lower bound max(critical path, total work / N) where work per story w = T + o and o is the
per-story overhead measured at N = 1 on the same sprint, o = (makespan(N=1) - K*T) / K; the
ratio makespan / bound; the speed-up over N = 1. For the independent sprint, a rounds model of
this machine (`rounds_model`: the N = 1 run's per-story overhead shared by the cores at each
round's end), so a speed-up aim can be read against what the core count allows. Then where the
time went (from the journal). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BenchStory, build_repo, load, machine, mean, policy_text, run_loop, table,
)

RESOURCE = "service:db"
SPRINTS = ("independent", "mixed", "mixed-adjacent")


def layout(kind: str, k: int) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """1-based plan positions of the 4 file-conflicting pairs and of the 2 resource stories.

    `mixed`: the second of each pair comes half a sprint later (pairs (1, 9), (2, 10), (3, 11),
    (4, 12) and resource stories 5 and 13 for K = 16), so plan-order admission and plan-order
    integration can reach the lower bound at N = 2 and 4: the gap measures the engine.
    `mixed-adjacent`: pairs (1, 2), (5, 6), (9, 10), (13, 14), resource stories 3 and 8: here
    the contract itself (a finished story integrates only after every earlier one) costs a
    round at N = 4, which the plan-order schedule column shows.
    Positions beyond K are dropped; below K = 13 the `mixed` positions overlap (a story then
    belongs to the last pair that names it), so use K >= 13 for the layout as described.
    """
    if kind == "mixed-adjacent":
        return [(1, 2), (5, 6), (9, 10), (13, 14)], (3, 8)
    half = max(k // 2, 1)
    return [(i, i + half) for i in range(1, 5)], (5, 5 + half)


def sprint(kind: str, k: int) -> list[BenchStory]:
    if kind not in SPRINTS:
        raise SystemExit(f"--sprints: unknown sprint {kind!r} (one of {', '.join(SPRINTS)})")
    keys = [f"1-{i}-s{i:02d}" for i in range(1, k + 1)]
    stories = [BenchStory(key, files=[f"work/{key}.txt"], writes=f"work/{key}.txt") for key in keys]
    if kind != "independent":
        pairs, resource_stories = layout(kind, k)
        for n, (a, b) in enumerate(pairs, start=1):
            if b > k:
                continue
            for pos in (a, b):
                stories[pos - 1].files = [f"work/pair-{n}.txt"]
                stories[pos - 1].writes = f"work/pair-{n}.txt"
        for pos in resource_stories:
            if pos <= k:
                stories[pos - 1].resources = [RESOURCE]
    return stories


def conflicts(a: BenchStory, b: BenchStory) -> bool:
    """The bench's stories use literal file paths, so overlap is equality; capacity is 1."""
    return bool(set(a.files) & set(b.files)) or bool(set(a.resources) & set(b.resources))


def critical_path(stories: list[BenchStory]) -> int:
    """Longest chain (in stories) of the conflict order: an edge from each earlier story to
    every later one it conflicts with (the later one cannot start before the earlier lands)."""
    longest = []
    for i, s in enumerate(stories):
        longest.append(1 + max((longest[j] for j in range(i) if conflicts(stories[j], s)), default=0))
    return max(longest, default=0)


def plan_order_schedule(stories: list[BenchStory], n: int, w: float) -> float:
    """What the admission rules allow with zero coordination latency: each story takes w,
    integration is instant but in plan order, slots go to the earliest eligible story."""
    k = len(stories)
    finish: list[float | None] = [None] * k
    integrated: list[float | None] = [None] * k
    started = [False] * k
    now, running = 0.0, []  # running: (finish time, index)
    while True:
        # integrate in plan order whatever has finished by now
        for i in range(k):
            if integrated[i] is not None:
                continue
            if finish[i] is None or finish[i] > now:
                break
            integrated[i] = now
        running = [(f, i) for f, i in running if f > now]
        for i, s in enumerate(stories):
            if len(running) >= n:
                break
            if started[i]:
                continue
            blocked = any(conflicts(stories[j], s) and (integrated[j] is None or integrated[j] > now)
                          for j in range(i))
            # resources are held until the holder is integrated: later holders count too
            blocked = blocked or any(started[j] and integrated[j] is None and
                                     set(stories[j].resources) & set(s.resources)
                                     for j in range(i + 1, k))
            if blocked:
                continue
            started[i] = True
            finish[i] = now + w
            running.append((finish[i], i))
        if all(x is not None for x in integrated):
            return max(integrated)
        pending = [f for f in finish if f is not None and f > now]
        now = min(pending)


def rounds_model(k: int, n: int, t: float, start_s: float, o: float, cores: int) -> float:
    """Independent stories in synchronized rounds on `cores` CPUs: what the N = 1 run's own
    per-story overhead `o` allows at N. Every agent of a round sleeps T and ends together, so
    the work between rounds (commit, integrate, dispatch, prepare: CPU-bound, `o` per story
    at N = 1) of min(n, k) stories shares the cores: a round costs T + o x max(1, n / cores).
    Not a lower bound of the engine, a model of the machine: on as many cores as slots it is
    the plain work / N."""
    rounds = -(-k // n)
    return start_s + rounds * (t + o * max(1.0, min(n, k) / cores))


def adjacent_pairs() -> list[BenchStory]:
    """Issue 15's adjacent-pairs sprint: 1-2 share a file, 3-4 another, 5-6 a resource."""
    keys = [f"1-{i}-p{i}" for i in range(1, 9)]
    stories = [BenchStory(key, files=[f"work/{key}.txt"], writes=f"work/{key}.txt") for key in keys]
    for a, b, shared in ((0, 1, "work/pair-12.txt"), (2, 3, "work/pair-34.txt")):
        for i in (a, b):
            stories[i].files, stories[i].writes = [shared], shared
    for i in (4, 5):
        stories[i].resources = [RESOURCE]
    return stories


def stacked_schedule(stories: list[BenchStory], n: int, w: float) -> float:
    """What the admission rules with stacked starts allow with zero coordination latency: a
    story waits for an earlier conflicting one only until it has *finished* (it then starts on
    a stacked base), for a resource until its holder is integrated; integration is instant and
    in plan order; slots go to the earliest eligible story."""
    k = len(stories)
    finish: list[float | None] = [None] * k
    integrated: list[float | None] = [None] * k
    now, running = 0.0, 0
    while True:
        for i in range(k):  # plan-order integration of whatever has finished
            if integrated[i] is None:
                if finish[i] is None or finish[i] > now:
                    break
                integrated[i] = now
        running = sum(1 for f in finish if f is not None and f > now)
        for i, s in enumerate(stories):
            if running >= n:
                break
            if finish[i] is not None:
                continue
            files_blocked = any(set(stories[j].files) & set(s.files)
                                and (finish[j] is None or finish[j] > now) for j in range(i))
            held = any(finish[j] is not None and integrated[j] is None and
                       set(stories[j].resources) & set(s.resources) for j in range(k) if j != i)
            if files_blocked or held:
                continue
            finish[i] = now + w
            running += 1
        if all(x is not None for x in integrated):
            return max(integrated)
        now = min(f for f in finish if f is not None and f > now)


def run_adjacent(base: Path, t: float, files: int) -> int:
    """The adjacent-pairs case at N = 4: makespan against its stacked schedule."""
    stories, n = adjacent_pairs(), 4
    result = one_run(base / "adjacent-pairs-n4", stories, n, t, files)
    if result is None:
        return 1
    bound, unstacked = stacked_schedule(stories, n, t), plan_order_schedule(stories, n, t)
    stacked = sum(1 for e in result.events if e["kind"] == "story.queued"
                  and (e.get("data") or {}).get("stacked_on"))
    print("\n## Adjacent pairs (issue 15): 8 stories, N = 4\n")
    print(table(["T s", "makespan s", "stacked schedule s", "makespan / stacked schedule",
                 "schedule without stacking s", "stacked starts"],
                [[f"{t:g}", f"{result.makespan:.2f}", f"{bound:.2f}",
                  f"{result.makespan / bound:.2f}", f"{unstacked:.2f}", stacked]], align="rrrrrr"))
    print("\nAim (issue 15): makespan / stacked schedule <= 1.2. Schedules with zero "
          "coordination latency, each story taking T; stacked starts = stories queued on a "
          f"stacked base in this run. load average: {load()}")
    return 0


def spans(result, keys: list[str]) -> dict[str, float]:
    """Mean per story of the journal spans that tell where coordination time goes."""
    pairs = {
        "dispatch": ("story.queued", "story.started"),
        "prepare": ("story.started", "story.prepared"),
        "agent": ("attempt.started", "attempt.finished"),
        "commit": ("attempt.finished", "story.ready"),
        "wait to integrate": ("story.ready", "story.integrating"),
        "integrate": ("story.integrating", "story.integrated"),
    }
    out = {}
    for name, (a, b) in pairs.items():
        out[name] = mean([(result.ts(b, key) - result.ts(a, key))
                          for key in keys if result.ts(a, key) and result.ts(b, key)])
    return out


def lane_busy(result, keys: list[str]) -> float:
    """Seconds the lane spent integrating (integrating → integrated), summed over stories."""
    return sum(result.ts("story.integrated", k) - result.ts("story.integrating", k) for k in keys
               if result.ts("story.integrated", k) and result.ts("story.integrating", k))


def refill(result) -> tuple[list[float], list[float]]:
    """Slot refill: each story.ready frees a worker slot; matched first-in first-out with the
    next story.queued events while stories are still pending. Returns, per refill, its
    latency (ready → queued) and how much of it the lane spent integrating
    (story.integrating → story.integrated of any story) instead of dispatching."""
    events = sorted(result.events, key=lambda e: e["seq"])
    busy = []
    for e in events:
        if e["kind"] == "story.integrating":
            end = result.ts("story.integrated", e["story"])
            if end is not None:
                busy.append((e["ts"], end))
    queued_total = sum(1 for e in events if e["kind"] == "story.queued")
    queued_seen, freed, latencies, integrating = 0, [], [], []
    for e in events:
        if e["kind"] == "story.queued":
            queued_seen += 1
            if freed:
                r = freed.pop(0)
                latencies.append(e["ts"] - r)
                integrating.append(sum(max(0.0, min(b, e["ts"]) - max(a, r)) for a, b in busy))
        elif e["kind"] == "story.ready" and queued_seen < queued_total:
            freed.append(e["ts"])
    return latencies, integrating


def max_in_flight(result) -> int:
    level, peak = 0, 0
    for e in result.events:
        if e["kind"] == "story.started":
            level += 1
        elif e["kind"] == "story.ready":
            level -= 1
        peak = max(peak, level)
    return peak


def one_run(folder: Path, stories: list[BenchStory], n: int, t: float, files: int):
    """A fresh repository and one run of the sprint at max_parallel n; None if it did not complete."""
    folder.mkdir(parents=True)
    map_file = folder / "agent-writes.map"
    map_file.write_text("".join(f"{s.key} {s.writes}\n" for s in stories))
    # The agent: sleep T, then append its key to its story's file; /bin/sh costs ~1 ms.
    script = (f'sleep {t:g}; f=$(sed -n "s/^$BMAD_LOOP_STORY_KEY //p" {map_file}); '
              'echo "$BMAD_LOOP_STORY_KEY" >> "$f"')
    policy = policy_text(parallel=n, agent_argv=["/bin/sh", "-c", script], resources={RESOURCE: 1})
    root = build_repo(folder / "repo", stories, files=files, policy=policy)
    result = run_loop(root, workers=n)
    if result.state != "completed":
        print(f"N={n}: run {result.run_id} in {root} ended {result.state} "
              f"(exit {result.exit_code})", file=sys.stderr)
        return None
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stories", type=int, default=16, help="stories K [16]")
    parser.add_argument("--agent-seconds", type=float, default=2.0, help="agent session T [2]")
    parser.add_argument("--parallel", default="1,2,4", help="values of N, comma-separated [1,2,4]")
    parser.add_argument("--sprints", default="independent,mixed")
    parser.add_argument("--files", type=int, default=200, help="tracked filler files [200]")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per (sprint, N), interleaved; the fastest is reported, all "
                             "are listed [1]")
    parser.add_argument("--probe", action="store_true",
                        help="also measure git calls, database lock waits and queue polls per "
                             "step of the lane and the workers (bench/_probe.py)")
    parser.add_argument("--what-if", action="append", default=[], metavar="EXPERIMENT",
                        help="monkeypatch the engine in this process to try a change: "
                             "dispatch-first, poll=SECONDS (bench/_whatif.py); repeatable")
    parser.add_argument("--adjacent-seconds", type=float, default=3.0,
                        help="agent T of the adjacent-pairs case [3]")
    parser.add_argument("--no-adjacent", action="store_true",
                        help="leave out the adjacent-pairs case (8 stories, N = 4)")
    args = parser.parse_args(argv)
    import _whatif

    banners = [_whatif.apply(spec) for spec in args.what_if]
    if args.probe:
        import _probe

        _probe.install()
        _probe.reset()
    ns = sorted({int(x) for x in args.parallel.split(",")})
    if 1 not in ns:
        ns = [1] + ns  # the bound and the speed-up need the N = 1 run
    kinds = [x.strip() for x in args.sprints.split(",") if x.strip()]
    k, t = args.stories, args.agent_seconds
    base = args.dir or Path(tempfile.mkdtemp(prefix="bmad-loop-bench-makespan-"))
    base.mkdir(parents=True, exist_ok=True)

    print(f"# bench/makespan.py — K = {k} stories, agent T = {t:g} s, N in {ns}, "
          f"{args.files} filler files, strategy merge, review off, no verify commands, gates none")
    for banner in banners:
        print(banner)
    print(f"machine: {machine()}")
    print(f"load average at start: {load()}")
    print(f"work folder: {base}\n")
    probes = []

    rows, detail_rows, model_rows, cores_rows = [], [], [], []
    # The CPUs this process may run on (a container's share, where the OS says so).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for kind in kinds:
        stories = sprint(kind, k)
        keys = [s.key for s in stories]
        cp = critical_path(stories)
        by_n, spread = {}, {}
        for rep in range(args.repeat):
            for n in ns:
                result = one_run(base / f"{kind}-n{n}-r{rep + 1}", stories, n, t, args.files)
                if result is None:
                    return 1
                print(f"  {kind:<14} N={n} run {rep + 1}: makespan {result.makespan:6.2f} s, "
                      f"load {load()}", file=sys.stderr, flush=True)
                spread.setdefault(n, []).append(result.makespan)
                if n not in by_n or result.makespan < by_n[n].makespan:
                    by_n[n] = result
                if args.probe:
                    probes.append((kind, n, rep + 1, _probe.report(k)))
                    _probe.reset()
        seq = by_n[1].makespan
        o = (seq - k * t) / k
        w = t + o
        if kind == "independent":
            start_s = by_n[1].startup
            o_run = (seq - start_s - k * t) / k  # the per-story part, start-up taken out
            for n in ns:
                model = rounds_model(k, n, t, start_s, o_run, cores)
                cores_rows.append([n, f"{start_s * 1000:.0f}", f"{o_run * 1000:.0f}",
                                   f"{model:.2f}", f"{seq / model:.2f}",
                                   f"{by_n[n].makespan:.2f}", f"{by_n[n].makespan / model:.2f}",
                                   f"{seq / by_n[n].makespan:.2f}"])
        for n in ns:
            result = by_n[n]
            bound_cp, bound_work = cp * w, k * w / n
            bound = max(bound_cp, bound_work)
            sim = plan_order_schedule(stories, n, w)
            runs = ", ".join(f"{x:.2f}" for x in spread[n]) if args.repeat > 1 else ""
            rows.append([kind, n, f"{result.makespan:.2f}" + (f" ({runs})" if runs else ""),
                         f"{bound:.2f}",
                         "critical path" if bound_cp > bound_work else "work / N",
                         f"{result.makespan / bound:.2f}", f"{seq / result.makespan:.2f}",
                         f"{100 * (seq / result.makespan / n):.0f}%"])
            sp = spans(result, keys)
            agent_s = mean([a["duration_s"] for a in result.attempts if a["phase"] == "dev"])
            lat, integ = refill(result)
            detail_rows.append([kind, n, max_in_flight(result), f"{agent_s:.3f}",
                                *(f"{sp[x] * 1000:.0f}" for x in
                                  ("dispatch", "prepare", "commit", "wait to integrate", "integrate")),
                                f"{lane_busy(result, keys):.2f}",
                                f"{1000 * mean(lat):.0f} / {1000 * max(lat, default=0):.0f}",
                                f"{sum(lat):.2f} ({sum(integ):.2f})"])
            model_rows.append([kind, n, f"{t:g} + {o:.3f} = {w:.3f}", f"{cp} × w = {bound_cp:.2f}",
                               f"{k} × w / {n} = {bound_work:.2f}", f"{sim:.2f}",
                               f"{result.makespan / sim:.2f}"])

    print(f"\nload average at end: {load()}")
    print("\n## Makespan against the lower bound\n")
    print(table(["sprint", "N", "makespan s", "lower bound s", "bound set by", "makespan / bound",
                 "speed-up vs N=1", "efficiency"], rows, align="lrrrlrrr"))
    print("\nefficiency = speed-up / N. Aims (issue 3): independent at N = 4 within 10 % of 4× "
          "(speed-up ≥ 3.6); mixed within 10 % of the lower bound (makespan / bound ≤ 1.10).")

    print("\n## How the bound was computed\n")
    print("w = T + o, with o = (makespan at N=1 − K·T) / K measured on the same sprint (so the "
          "N = 1 ratio is 1.00 by construction). Critical path = longest chain of the conflict "
          "order (file overlap or a shared capacity-1 resource) × w. 'plan-order schedule' = "
          "the makespan the admission rules give with zero coordination latency (slots to the "
          "earliest eligible story, a conflicting story starts once the earlier one is "
          "integrated, integration instant and in plan order), each story taking w.\n")
    print(table(["sprint", "N", "w = T + o (s)", "critical path s", "work / N s",
                 "plan-order schedule s", "makespan / schedule"], model_rows, align="lrlllrr"))

    if cores_rows:
        print(f"\n## The independent sprint in rounds on this machine's {cores} core(s)\n")
        print(table(["N", "start-up ms", "o per story ms", "rounds model s",
                     "model speed-up", "makespan s", "makespan / model", "speed-up"],
                    cores_rows))
        print("\nstart-up = enqueue → first story.queued of the N = 1 run; o = (its makespan − "
              "start-up − K·T) / K. Rounds model = start-up + ⌈K/N⌉ × (T + o × max(1, N / "
              "cores)): every agent of a round ends together, and the CPU-bound work between "
              "rounds of N stories shares the cores. 'model speed-up' is what the model expects of "
              "this machine with this N = 1 overhead (a model, not a bound: part of o may be "
              "waiting rather than CPU); on as many cores as slots it is N.")

    print("\n## Where the time went (means per story, from the journal)\n")
    print(table(["sprint", "N", "max in flight", "agent s", "dispatch ms", "prepare ms",
                 "commit ms", "ready → integrating ms", "integrate ms", "lane busy s (sum)",
                 "refill mean / max ms", "refill sum s (lane integrating)"],
                detail_rows))
    print("\ndispatch = story.queued → story.started (huey poll of the stories queue); prepare = "
          "worktree add + seed; commit = agent exit → story.ready; ready → integrating = waiting "
          "for the lane (its poll of the integration queue, earlier stories, the lane's other "
          "work); integrate = compose + candidate verify + CAS + checkout sync. refill = a slot "
          "freed by story.ready until the lane queues the next story (story.queued), matched "
          "first in, first out while stories are pending; in brackets the part of it the lane "
          "spent integrating (integrating → integrated) before it dispatched. In the mixed "
          "sprints a refill may also wait for a conflict to clear.")
    if args.repeat > 1:
        print("\nmakespan = the fastest of the runs in brackets; the bound uses the fastest "
              "N = 1 run.")
    for kind, n, rep, text in probes:
        print(f"\n## Probe: {kind}, N = {n}, run {rep} (per story = total / K)\n")
        print(text)
    if not args.no_adjacent:
        return run_adjacent(base, args.adjacent_seconds, args.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
