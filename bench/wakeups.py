#!/usr/bin/env python
"""Wake-up latencies: how long a message waits for its consumer, in one process and across three.

    python bench/wakeups.py [--stories 6] [--agent-seconds 1] [--parallel 1] [--files 50]
                            [--modes in-process,processes] [--backend sqlite|redis]

One sprint of K independent stories, each agent session sleeping T seconds (long enough for an
idle consumer to reach its longest back-off) and then appending one line to its own file. Run
once per mode, each on a fresh repository:

- *in-process*: `enqueue` + `drive` in this process, as `bmad-loop run` does (the stories pool
  and the lane are threads of one process);
- *processes*: `bmad-loop worker --queue integration` and `bmad-loop worker --queue stories
  -w N` as two separate processes, the run enqueued from this (third) process, as in the
  docker-compose topology on one machine.

Printed per mode, from the journal's timestamps (median / max over the stories):

- **dispatch**: `story.queued` → `story.started` (the lane queued a story; a story consumer
  took it);
- **ready → integrating**: `story.ready` → `story.integrating` (a worker finished; the lane
  took the wake-up and began to integrate). At N = 1 no earlier story is ever waited for;
- **slot refill**: `story.ready` → the next `story.queued` (a slot freed; the lane filled it).
  At N = 1 the lane integrates the finished story before it starts the next one (same bases as
  the sequential loop), so this includes the integration itself, shown as **(integrating)**:
  `story.integrating` → `story.integrated`.

Not a test: nothing is asserted. `--backend redis` puts both queues on the local Redis
(`BMAD_TEST_REDIS_URL` or redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
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
    from bmad_loop.engine.planning import Selection, enqueue
    from bmad_loop.engine.project import Project
    from bmad_loop.policy import load_policy
    from bmad_loop.states import RUN_SETTLED
    from bmad_loop.tasks import Tasks

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stories", type=int, default=6, help="stories K [6]")
    parser.add_argument("--agent-seconds", type=float, default=1.0, help="agent session T [1]")
    parser.add_argument("--parallel", type=int, default=1, help="N [1]")
    parser.add_argument("--files", type=int, default=50, help="tracked filler files [50]")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--backend", choices=("sqlite", "redis"), default="sqlite")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"--modes: unknown mode {mode!r} (one of {', '.join(MODES)})")
    work = args.dir or Path(tempfile.mkdtemp(prefix="bmad-wakeups-"))
    print(f"# wake-up latencies\n\n{machine()}; load average {load()} at start; work in {work}")
    print(f"K = {args.stories}, T = {args.agent_seconds:g} s, N = {args.parallel}, "
          f"{args.files} files, queue back-end {args.backend}\n")
    keys = [f"1-{i}-w{i:02d}" for i in range(1, args.stories + 1)]
    stories = [BenchStory(k, files=[f"work/{k}.txt"], writes=f"work/{k}.txt") for k in keys]
    rows = []
    for mode in modes:
        folder = work / mode
        folder.mkdir(parents=True)
        policy = _policy(args.parallel, args.agent_seconds, folder, stories, args.backend)
        root = build_repo(folder / "repo", stories, files=args.files, policy=policy)
        if mode == "in-process":
            result = run_loop(root, workers=args.parallel)
        else:
            result = run_processes(root, workers=args.parallel)
        if result.state != "completed":
            print(f"{mode}: run {result.run_id} in {root} ended {result.state}", file=sys.stderr)
            continue
        for name, values in latencies(result).items():
            rows.append([mode, name, str(len(values)), ms(median(values)),
                         ms(max(values)) if values else "-"])
    print(table(["mode", "latency", "n", "median ms", "max ms"], rows, "llrrr"))
    print(f"\nload average {load()} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
