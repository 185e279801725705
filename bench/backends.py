#!/usr/bin/env python
"""The embedded back-end beside the scale-out one: dispatch latency and lane throughput.

    python bench/backends.py [--stories 16] [--agent-seconds 0.5] [--parallel 2]
                             [--lane-parallel 4] [--files 200] [--repeat 3]
                             [--backends sqlite,redis-pg]

Back-ends (columns):

- *SQLite*: the default of ``bmad-loop run``, a SQLite state database and huey's SQLite queue
  under ``.bmad-loop/`` (the consumers poll the queue, back-off 0.05 → 0.5 s);
- *Redis+PostgreSQL*: ``[queue] backend = "redis"``, ``url = "redis://…"`` (huey's Redis storage:
  blocking ``BRPOP``) and ``[database] url = "postgresql+psycopg://…"``.

Each run is a fresh repository (200 filler files) with K independent stories in one epic (each
writes its own file), built and driven as bench/makespan.py does (``enqueue`` + ``drive`` in
process: real huey consumers, real git, real agent processes), ``merge_strategy = "merge"``,
review disabled, no verify commands, gates ``none``. On Redis+PostgreSQL every run gets a new
PostgreSQL database (``CREATE DATABASE``, dropped ``WITH (FORCE)`` afterwards) and, because the
engine names the Redis queues after a hash of the project root (``bmad_loop.queue.tasks.queue_config``),
a new Redis namespace, whose keys are deleted afterwards. Per back-end, two runs:

1. *dispatch*: agents sleep T (0.5 s) at max_parallel N (2), so stories are dispatched while
   others work. Dispatch latency per story: ``story.queued`` (the lane admitted the story and
   sent its message) → ``story.started`` (a worker thread took the message and claimed the row),
   and → ``attempt.started`` (the agent session begins, after the worktree is prepared).
2. *lane*: agents return at once (T = 0) at max_parallel 4, so finished stories pile up and the
   single lane thread is the bottleneck. Throughput = (K − 1) intervals / (last − first
   ``story.integrated``), per minute; per integration ``story.integrating`` → ``story.integrated``
   (split into compose → ``candidate.composed``, verify → ``candidate.verified``, advance: CAS +
   checkout sync → ``story.integrated``), and the lane's gap between integrations
   (``story.integrated`` → next ``story.integrating``: clean-up of the worktree, admission).

Latencies are pooled over all stories of all ``--repeat`` runs (median, p90); throughput and
makespan are the median over runs. A run that does not reach ``run.completed`` with every story
integrated is an error (exit 1). If Redis or PostgreSQL is unreachable only SQLite is printed.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BenchStory, build_repo, load, machine, median, policy_text, run_loop, table,
)

LABELS = {"sqlite": "SQLite", "redis-pg": "Redis+PostgreSQL"}
REDIS_URL = os.environ.get("BMAD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_ADMIN_URLS = tuple(filter(None, (  # as tests/backends.py: a user who may CREATE DATABASE
    os.environ.get("BMAD_TEST_POSTGRES_URL"),
    "postgresql+psycopg://root@127.0.0.1:5432/postgres",
    "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
)))


class RunFailed(Exception):
    pass


# --- the services ----------------------------------------------------------------------------


def _admin(url: str):
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    return create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool,
                         connect_args={"connect_timeout": 5})


def find_services() -> tuple[str | None, str | None, str]:
    """(redis url, postgres admin url, why not) — the URLs are None when unreachable."""
    import redis
    from sqlalchemy import text

    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
        client.ping()
        client.close()
    except Exception as exc:
        return None, None, f"Redis at {REDIS_URL}: {type(exc).__name__}: {exc}"
    last = None
    for url in PG_ADMIN_URLS:
        engine = _admin(url)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return REDIS_URL, url, ""
        except Exception as exc:
            last = exc
        finally:
            engine.dispose()
    return None, None, f"PostgreSQL ({', '.join(PG_ADMIN_URLS)}): {type(last).__name__}: {last}"


def create_database(admin_url: str) -> tuple[str, str]:
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    name = f"bmad_bench_{uuid.uuid4().hex[:12]}"
    _admin_execute(admin_url, text(f'CREATE DATABASE "{name}"'))
    return name, make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def drop_database(admin_url: str, name: str) -> None:
    from sqlalchemy import text

    _admin_execute(admin_url, text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _admin_execute(admin_url: str, statement) -> None:
    engine = _admin(admin_url)
    try:
        with engine.connect() as conn:
            conn.execute(statement)
    finally:
        engine.dispose()


def drop_redis_keys(url: str, root: Path) -> int:
    """Delete the keys huey made for this project's queues (named after its root path)."""
    import redis
    from bmad_loop.engine.project import Project
    from bmad_loop.queue.tasks import queue_config

    clean = re.sub("[^A-Za-z0-9_]", "", queue_config(Project.open(root)).prefix)
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"huey.*.{clean}*", count=1000))
        if keys:
            client.delete(*keys)
        return len(keys)
    finally:
        client.close()


# --- one run -----------------------------------------------------------------------------------


def one_run(folder: Path, backend: str, services, *, k: int, t: float, n: int, files: int):
    """A fresh repository (and database) and one run; the RunResult, or RunFailed."""
    keys = [f"1-{i}-s{i:02d}" for i in range(1, k + 1)]
    stories = [BenchStory(key, files=[f"work/{key}.txt"]) for key in keys]
    script = (f"sleep {t:g}; " if t > 0 else "") + \
        'echo "$BMAD_LOOP_STORY_KEY" >> "work/$BMAD_LOOP_STORY_KEY.txt"'
    policy = policy_text(parallel=n, agent_argv=["/bin/sh", "-c", script])
    redis_url, pg_admin = services
    db_name = root = None
    try:
        if backend == "redis-pg":
            db_name, db_url = create_database(pg_admin)
            policy += (f'[queue]\nbackend = "redis"\nurl = "{redis_url}"\n\n'
                       f'[database]\nurl = "{db_url}"\n')
        root = build_repo(folder / "repo", stories, files=files, policy=policy)
        result = run_loop(root, workers=n)
    finally:
        if backend == "redis-pg":
            if root is not None:
                drop_redis_keys(redis_url, root)
            if db_name is not None:
                drop_database(pg_admin, db_name)
    integrated = sum(1 for s in result.stories if s["state"] == "integrated")
    if result.state != "completed" or integrated != k or result.ts("run.completed") is None:
        raise RunFailed(f"{LABELS[backend]}: run {result.run_id} in {root} ended {result.state} "
                        f"(exit {result.exit_code}, {integrated}/{k} integrated)")
    return result


# --- measures ----------------------------------------------------------------------------------


def spans(result, a: str, b: str) -> list[float]:
    """Per story: first `a` → first `b` event of that story (stories with both)."""
    out = []
    for s in result.stories:
        ta, tb = result.ts(a, s["key"]), result.ts(b, s["key"])
        if ta is not None and tb is not None:
            out.append(tb - ta)
    return out


def p90(xs) -> float:
    xs = sorted(xs)
    if len(xs) < 2:
        return xs[0] if xs else float("nan")
    return statistics.quantiles(xs, n=10, method="inclusive")[8]


def lane_measures(result) -> dict:
    done = sorted(e["ts"] for e in result.events if e["kind"] == "story.integrated")
    span = done[-1] - done[0]
    integrating = sorted((e["ts"], e["story"]) for e in result.events
                         if e["kind"] == "story.integrating")
    # the lane between integrations: story.integrated → the next story.integrating
    gaps = [nxt - prev for prev, (nxt, _) in zip(done, integrating[1:])]
    busy = sum(x for x in spans(result, "story.integrating", "story.integrated")[1:])
    return {"span": span, "rate": 60 * (len(done) - 1) / span if span > 0 else float("nan"),
            "gaps": gaps, "busy": busy / span if span > 0 else float("nan")}


def ms2(xs) -> str:
    """median / p90 in ms"""
    return f"{1000 * median(xs):.0f} / {1000 * p90(xs):.0f}" if xs else "–"


def rows_for(dispatch: list, lane: list) -> dict[str, str]:
    """One column of the table: metric name → value, for one back-end's runs."""
    def pooled(runs, a, b):
        return [x for r in runs for x in spans(r, a, b)]

    lm = [lane_measures(r) for r in lane]
    split = [median(pooled(lane, a, b)) for a, b in (
        ("story.integrating", "candidate.composed"), ("candidate.composed", "candidate.verified"),
        ("candidate.verified", "story.integrated"))]
    return {
        "dispatch run: makespan s": f"{median([r.makespan for r in dispatch]):.2f}",
        "queued → story.started ms (median / p90)":
            ms2(pooled(dispatch, "story.queued", "story.started")),
        "queued → attempt.started ms (median / p90)":
            ms2(pooled(dispatch, "story.queued", "attempt.started")),
        "  of which story.started → attempt.started ms":
            ms2(pooled(dispatch, "story.started", "attempt.started")),
        "lane run: makespan s": f"{median([r.makespan for r in lane]):.2f}",
        "integrated / min (first → last story.integrated)":
            f"{median([m['rate'] for m in lm]):.1f}",
        "integrating → integrated ms (median / p90)":
            ms2(pooled(lane, "story.integrating", "story.integrated")),
        "  compose / verify / advance ms (medians)": " / ".join(f"{1000 * x:.0f}" for x in split),
        "integrated → next integrating ms (median / p90)": ms2([g for m in lm for g in m["gaps"]]),
        "ready → integrating ms (median / p90)":
            ms2(pooled(lane, "story.ready", "story.integrating")),
        "lane busy integrating (share of the span)":
            f"{100 * median([m['busy'] for m in lm]):.0f}%",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stories", type=int, default=16, help="stories K per run [16]")
    parser.add_argument("--agent-seconds", type=float, default=0.5,
                        help="agent session T in the dispatch run [0.5]")
    parser.add_argument("--parallel", type=int, default=2,
                        help="max_parallel of the dispatch run [2]")
    parser.add_argument("--lane-parallel", type=int, default=4,
                        help="max_parallel of the lane run (agents T = 0) [4]")
    parser.add_argument("--files", type=int, default=200, help="tracked filler files [200]")
    parser.add_argument("--repeat", type=int, default=3, help="runs per back-end and kind, "
                        "interleaved across back-ends [3]")
    parser.add_argument("--backends", default="sqlite,redis-pg", help="[sqlite,redis-pg]")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or set(backends) - set(LABELS):
        parser.error(f"--backends: one or more of {', '.join(LABELS)}")
    for var in [v for v in os.environ if v.startswith(("BMAD_LOOP_QUEUE_", "BMAD_LOOP_DATABASE_"))]:
        del os.environ[var]  # they would override the policy's [queue] / [database]
    k, t = args.stories, args.agent_seconds
    base = args.dir or Path(tempfile.mkdtemp(prefix="bmad-loop-bench-backends-"))
    base.mkdir(parents=True, exist_ok=True)

    print(f"# bench/backends.py — K = {k} independent stories, {args.files} filler files, "
          "strategy merge, review off, no verify commands, gates none")
    print(f"dispatch run: agent T = {t:g} s, max_parallel {args.parallel}; lane run: agent T = 0, "
          f"max_parallel {args.lane_parallel}; {args.repeat} run(s) of each per back-end")
    print(f"machine: {machine()}")
    print(f"load average at start: {load()}")
    print(f"work folder: {base}")
    services = (None, None)
    if "redis-pg" in backends:
        redis_url, pg_admin, why = find_services()
        if redis_url is None:
            print(f"Redis+PostgreSQL skipped, not reachable: {why}")
            backends.remove("redis-pg")
        else:
            services = (redis_url, pg_admin)
            print(f"Redis {redis_url}, PostgreSQL {pg_admin} (a new database per run)")
    if not backends:
        return 1
    print()

    runs = {b: {"dispatch": [], "lane": []} for b in backends}
    plans = {"dispatch": (t, args.parallel), "lane": (0.0, args.lane_parallel)}
    try:
        for rep in range(1, args.repeat + 1):
            for kind, (agent_t, n) in plans.items():
                for b in backends:
                    r = one_run(base / f"{b}-{kind}-r{rep}", b, services, k=k, t=agent_t, n=n,
                                files=args.files)
                    runs[b][kind].append(r)
                    rate = (f", {lane_measures(r)['rate']:.0f} integrated/min"
                            if kind == "lane" else "")
                    print(f"  {LABELS[b]:<16} {kind:<8} run {rep}: makespan {r.makespan:6.2f} s"
                          f"{rate}, load {load()}", file=sys.stderr, flush=True)
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    columns = [rows_for(runs[b]["dispatch"], runs[b]["lane"]) for b in backends]
    print(f"load average at end: {load()}\n")
    print(table(["metric", *(LABELS[b] for b in backends)],
                [[name, *(c[name] for c in columns)] for name in columns[0]]))
    print(f"\ndispatch run = T {t:g} s, N = {args.parallel}; lane run = T 0, N = "
          f"{args.lane_parallel}. queued → story.started = the queue hop (lane sends the message, "
          "a worker thread takes it and claims the row); story.started → attempt.started = "
          "worktree add + seed. Throughput = (K − 1) / (last − first story.integrated) × 60; "
          "advance = CAS on the target + checkout sync; integrated → next integrating = the "
          "lane's clean-up of the integrated story and its other work; lane busy = the share of "
          "that span spent between story.integrating and story.integrated.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
