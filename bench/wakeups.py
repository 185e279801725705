#!/usr/bin/env python
"""Wake-up latencies: how long a message waits for its consumer, in one process and across three.

    python bench/wakeups.py [--stories 6] [--agent-seconds 1] [--parallel 1] [--files 50]
                            [--modes in-process,processes] [--backend sqlite|redis]
                            [--trees before=/tmp/before/src,after=src] [--rounds 1]

One sprint of K independent stories, each agent session sleeping T seconds (long enough for an
idle consumer to reach its longest back-off) and then appending one line to its own file. Run
once per mode, each on a fresh repository:

- *in-process*: `enqueue` + `drive` in this process, as `bmad-loop run` does (the stories pool
  and the lane are threads of one process);
- *processes*: `bmad-loop worker --queue integration` and `bmad-loop worker --queue stories
  -w N` as two separate processes, the run enqueued from this (third) process, as in the
  docker-compose topology on one machine.

Printed per mode, from the journal's timestamps (median / max over the stories), and then the
run's makespan (`makespan <mode>: S s`, for `bench/alternate.py --metric`):

- **dispatch**: `story.queued` → `story.started` (the lane queued a story; a story consumer
  took it);
- **ready → integrating**: `story.ready` → `story.integrating` (a worker finished; the lane
  took the wake-up and began to integrate). At N = 1 no earlier story is ever waited for;
- **slot refill**: `story.ready` → the next `story.queued` (a slot freed; the lane filled it).
  At N = 1 the lane integrates the finished story before it starts the next one (same bases as
  the sequential loop), so this includes the integration itself, shown as **(integrating)**:
  `story.integrating` → `story.integrated`.
- in-process only, **(wake: story queue)** and **(wake: lane queue)**: the bare wake-up, from
  an enqueue that finds every consumer of its queue idle to its task body starting (patched
  around the run in this process); dispatch and ready → integrating are this plus the database
  and git work of the task before it journals its event.

`--trees LABEL=SRC,...` compares code trees in one invocation: each (tree, mode) runs in a child
process with `PYTHONPATH=SRC` (e.g. a `git worktree` of the commit before a change), the trees
interleaved `--rounds` times, and the table gets a column per tree and their ratio.

Not a test: nothing is asserted. `--backend redis` puts both queues on the local Redis
(`BMAD_TEST_REDIS_URL` or redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BenchStory, RunResult, build_repo, load, machine, median, ms, policy_text, run_loop, table,
)

MODES = ("in-process", "processes")


def latencies(result: RunResult) -> dict[str, list[float]]:
    """Per-story waits between the journal events that a wake-up separates."""
    events = result.events
    first: dict[tuple[str, str], float] = {}
    for e in events:
        first.setdefault((e["kind"], e["story"]), e["ts"])
    keys = [s["key"] for s in result.stories]
    out = {"dispatch": [], "ready → integrating": [], "slot refill": [], "(integrating)": []}
    for key in keys:
        queued, started = first.get(("story.queued", key)), first.get(("story.started", key))
        ready, integrating = first.get(("story.ready", key)), first.get(("story.integrating", key))
        if queued is not None and started is not None:
            out["dispatch"].append(started - queued)
        if ready is not None and integrating is not None:
            out["ready → integrating"].append(integrating - ready)
        integrated = first.get(("story.integrated", key))
        if integrating is not None and integrated is not None:
            out["(integrating)"].append(integrated - integrating)
        if ready is not None:
            later = [e["ts"] for e in events if e["kind"] == "story.queued" and e["ts"] >= ready]
            if later:
                out["slot refill"].append(later[0] - ready)
    return out


def _policy(n: int, t: float, folder: Path, stories: list[BenchStory], backend: str) -> str:
    script = f'sleep {t:g}; echo "$BMAD_LOOP_STORY_KEY" >> "work/$BMAD_LOOP_STORY_KEY.txt"'
    text = policy_text(parallel=n, agent_argv=["/bin/sh", "-c", script])
    if backend == "redis":
        url = os.environ.get("BMAD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
        text += f'\n[queue]\nbackend = "redis"\nurl = "{url}"\n'
    return text


def _cli(root: Path, *args: str, log: Path | None = None) -> subprocess.Popen:
    out = open(log, "wb") if log else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", "bmad_loop", *args, "--project", str(root)],
                            cwd=root, stdout=out, stderr=subprocess.STDOUT)


def run_processes(root: Path, *, workers: int, timeout: float = 600) -> RunResult:
    """Lane and story consumers as two processes; the run enqueued from this one."""
    from bmad_loop.db.models import Run
    from bmad_loop.engine.run.planning import Selection, enqueue
    from bmad_loop.engine.project import Project
    from bmad_loop.policy import load_policy
    from bmad_loop.states import RUN_SETTLED
    from bmad_loop.queue.tasks import Tasks

    project = Project(root=root.resolve(), policy=load_policy(root))
    project.db
    tasks = Tasks(project)
    tasks.stories, tasks.integration  # the queue database exists before the consumers start
    lane = _cli(root, "worker", "--queue", "integration", log=root.parent / "lane.log")
    pool = _cli(root, "worker", "--queue", "stories", "-w", str(workers),
                log=root.parent / "stories.log")
    try:
        time.sleep(2.0)  # both consumers up and idle at their longest back-off
        t0 = time.time()
        run_id, _plan = enqueue(project, tasks, project.policy, Selection())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with project.db.transaction() as s:
                if s.get(Run, run_id).state in RUN_SETTLED:
                    break
            time.sleep(0.1)
        t1 = time.time()
    finally:
        for proc in (lane, pool):
            proc.send_signal(signal.SIGTERM)
        for proc in (lane, pool):
            proc.wait(timeout=60)
    project.close()
    return _rows(root, run_id, t0, t1)


def _rows(root: Path, run_id: str, t0: float, t1: float) -> RunResult:
    from _common import _epoch
    from bmad_loop.db.models import Run, Story
    from bmad_loop.engine.journal import events_after
    from bmad_loop.engine.project import Project
    from bmad_loop.policy import load_policy
    from sqlalchemy import select

    project = Project(root=root.resolve(), policy=load_policy(root))
    with project.db.transaction() as s:
        run = s.get(Run, run_id)
        events = [{"seq": e.seq, "ts": _epoch(e.ts), "kind": e.kind, "story": e.story,
                   "data": e.data or {}} for e in events_after(s, run_id, 0)]
        stories = [{"id": x.id, "key": x.key, "seq": x.seq, "state": x.state}
                   for x in s.scalars(select(Story).where(Story.run_id == run_id)
                                      .order_by(Story.seq))]
        state = run.state
    project.close()
    return RunResult(run_id, 0, state, t0, t1, events, stories, [], [])


def measure(args, mode: str, work: Path) -> dict[str, list[float]] | None:
    """One fresh repository and one run in `mode`; the latencies, None if it did not complete."""
    keys = [f"1-{i}-w{i:02d}" for i in range(1, args.stories + 1)]
    stories = [BenchStory(k, files=[f"work/{k}.txt"], writes=f"work/{k}.txt") for k in keys]
    folder = work / mode
    folder.mkdir(parents=True)
    policy = _policy(args.parallel, args.agent_seconds, folder, stories, args.backend)
    root = build_repo(folder / "repo", stories, files=args.files, policy=policy)
    hops: dict[str, list[float]] = {}
    if mode == "in-process":
        with queue_hops(hops):
            result = run_loop(root, workers=args.parallel)
    else:
        result = run_processes(root, workers=args.parallel)
    if result.state != "completed":
        print(f"{mode}: run {result.run_id} in {root} ended {result.state}", file=sys.stderr)
        return None
    return {**latencies(result), **hops, "makespan": [result.makespan]}


@contextlib.contextmanager
def queue_hops(out: dict[str, list[float]]):
    """The bare wake-up in this process: from an enqueue that finds every consumer of its queue
    idle to its task body starting (huey queues are FIFO, so the n-th start answers the n-th
    enqueue; an enqueue while a consumer is busy waits for that task, which is not a wake-up).
    Patched around one run."""
    from bmad_loop.queue.tasks import Tasks

    saved = {name: getattr(Tasks, name) for name in
             ("enqueue_story", "enqueue_lane", "_run_story", "_run_lane")}
    pending = {"story": [], "lane": []}  # (enqueued at, every consumer idle then)
    busy = {"story": 0, "lane": 0}
    lock = threading.Lock()

    def enqueued(kind, original):
        def wrapper(self, *a):
            with lock:
                pending[kind].append((time.perf_counter(), busy[kind] == 0))
            return original(self, *a)
        return wrapper

    def started(kind, original):
        def wrapper(self, *a):
            with lock:
                if pending[kind]:
                    at, idle = pending[kind].pop(0)
                    if idle:
                        out.setdefault(f"(wake: {kind} queue)", []).append(time.perf_counter() - at)
                busy[kind] += 1
            try:
                return original(self, *a)
            finally:
                with lock:
                    busy[kind] -= 1
        return wrapper

    Tasks.enqueue_story = enqueued("story", saved["enqueue_story"])
    Tasks.enqueue_lane = enqueued("lane", saved["enqueue_lane"])
    Tasks._run_story = started("story", saved["_run_story"])
    Tasks._run_lane = started("lane", saved["_run_lane"])
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(Tasks, name, fn)


def _child(args, label: str, src: str, mode: str, work: Path) -> dict[str, list[float]] | None:
    env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
    out = work / f"{label}-{mode}.json"
    argv = [sys.executable, __file__, "--stories", str(args.stories), "--agent-seconds",
            str(args.agent_seconds), "--parallel", str(args.parallel), "--files", str(args.files),
            "--backend", args.backend, "--modes", mode, "--dir", str(work / label),
            "--json", str(out)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        print(f"{label} {mode} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(out.read_text())[mode]


def compare(args, trees: list[tuple[str, str]], modes: list[str], work: Path) -> None:
    found: dict[tuple[str, str], dict[str, list[float]]] = {}
    for n in range(args.rounds):
        for mode in modes:
            for label, src in trees:
                got = _child(args, label, src, mode, work / f"round{n}")
                for name, values in (got or {}).items():
                    found.setdefault((label, mode), {}).setdefault(name, []).extend(values)
    headers = ["mode", "latency"] + [f"{label} median / max ms" for label, _ in trees]
    if len(trees) == 2:
        headers.append(f"median {trees[1][0]} / {trees[0][0]}")
    rows = []
    for mode in modes:
        for name in ("dispatch", "ready → integrating", "slot refill", "(integrating)",
                     "(wake: story queue)", "(wake: lane queue)"):
            row = [mode, name]
            medians = []
            for label, _ in trees:
                values = found.get((label, mode), {}).get(name, [])
                medians.append(median(values))
                row.append(f"{ms(median(values))} / {ms(max(values))}" if values else "-")
            if all(cell == "-" for cell in row[2:]):
                continue  # e.g. the bare wake-ups, measured in-process only
            if len(trees) == 2:
                row.append(f"{medians[1] / medians[0]:.2f}" if medians[0] else "-")
            rows.append(row)
    print(table(headers, rows, "ll" + "r" * (len(headers) - 2)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stories", type=int, default=6, help="stories K [6]")
    parser.add_argument("--agent-seconds", type=float, default=1.0, help="agent session T [1]")
    parser.add_argument("--parallel", type=int, default=1, help="N [1]")
    parser.add_argument("--files", type=int, default=50, help="tracked filler files [50]")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--backend", choices=("sqlite", "redis"), default="sqlite")
    parser.add_argument("--trees", default="", help="LABEL=SRC,... code trees to compare")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds with --trees [1]")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"--modes: unknown mode {mode!r} (one of {', '.join(MODES)})")
    work = args.dir or Path(tempfile.mkdtemp(prefix="bmad-wakeups-"))
    if args.json:  # a child of --trees: measure, write, no table
        results = {mode: measure(args, mode, work) for mode in modes}
        args.json.write_text(json.dumps({m: r for m, r in results.items() if r is not None}))
        return 0
    print(f"# wake-up latencies\n\n{machine()}; load average {load()} at start; work in {work}")
    print(f"K = {args.stories}, T = {args.agent_seconds:g} s, N = {args.parallel}, "
          f"{args.files} files, queue back-end {args.backend}\n")
    if args.trees:
        trees = [tuple(part.split("=", 1)) for part in args.trees.split(",")]
        if any(len(t) != 2 for t in trees):
            raise SystemExit("--trees: LABEL=SRC,LABEL=SRC")
        compare(args, trees, modes, work)
    else:
        rows, makespans = [], []
        for mode in modes:
            found = measure(args, mode, work) or {}
            makespans += [f"makespan {mode}: {s:.3f} s" for s in found.pop("makespan", [])]
            for name, values in found.items():
                rows.append([mode, name, str(len(values)), ms(median(values)),
                             ms(max(values)) if values else "-"])
        print(table(["mode", "latency", "n", "median ms", "max ms"], rows, "llrrr"))
        print("\n" + "\n".join(makespans))
    print(f"\nload average {load()} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
