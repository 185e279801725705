"""`--probe`: where the engine's coordination time goes, measured from outside the engine.

Wraps (in this process only, by monkeypatching; the engine code is unchanged):

- `Git.run`: every git subprocess, its wall time, attributed to the innermost probed step of the
  calling thread (lane: dispatch / integrate / clean-up / load; worker: prepare / dev / verify /
  commit);
- the state database: the wait for ``BEGIN IMMEDIATE`` (SQLite's write lock, i.e. lock waits),
  and the time of every statement and whole transaction;
- huey's SQLite storage: ``enqueue`` / ``dequeue`` calls and their time (empty dequeues = polls).

Call `install()` before the run, `report()` after: it returns Markdown tables.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import defaultdict

_local = threading.local()
_lock = threading.Lock()
STATS: dict = defaultdict(lambda: [0, 0.0, 0.0])  # key -> [count, total s, max s]
_installed = False


def _add(key, seconds):
    with _lock:
        entry = STATS[key]
        entry[0] += 1
        entry[1] += seconds
        entry[2] = max(entry[2], seconds)


def _stack() -> list:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def _where() -> str:
    stack = _stack()
    return stack[-1][0] if stack else "other"


def _step(label):
    """Time a function as a step: total, and self (minus the probed steps nested in it)."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            stack = _stack()
            frame = [label, 0.0]
            stack.append(frame)
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                total = time.perf_counter() - t
                stack.pop()
                _add(("step", label), total)
                _add(("self", label), total - frame[1])
                if stack:
                    stack[-1][1] += total
        return inner
    return wrap


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    from huey.storage import SqliteStorage
    from sqlalchemy import event

    from bmad_loop.git import locks as repolock, runner as gitcmd
    from bmad_loop.db import database
    from bmad_loop.engine.lane import aftermath, integrate, tick
    from bmad_loop.engine.run import consumers
    from bmad_loop.engine.worker import walk as worker

    original_run = gitcmd.Git.run

    @functools.wraps(original_run)
    def run(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return original_run(self, *args, **kwargs)
        finally:
            sub = str(args[0]) if args else "?"
            if sub == "-c":  # git -c k=v … <subcommand>
                sub = next((str(a) for a in args[2:] if not str(a).startswith("-")
                            and "=" not in str(a)), "?")
            elif sub == "worktree" and len(args) > 1:
                sub = f"worktree {args[1]}"
            dt = time.perf_counter() - t
            _add(("git", _where()), dt)
            _add(("git-sub", f"{_where()}: {sub}"), dt)

    gitcmd.Git.run = run

    # The repository mutation lock (`repo_lock`: flock on <common dir>/bmad-loop.lock): how long
    # each step waits for it and holds it. repolock's own reference to fcntl is replaced, so the
    # other users of fcntl (the migration lock) are not counted.
    import fcntl as real_fcntl
    import types

    def flock(fd, op):
        if op == real_fcntl.LOCK_EX:
            t = time.perf_counter()
            real_fcntl.flock(fd, op)
            now = time.perf_counter()
            _add(("lock-wait", _where()), now - t)
            _local.lock_at = (now, _where())
        elif op == real_fcntl.LOCK_UN:
            at = getattr(_local, "lock_at", None)
            real_fcntl.flock(fd, op)
            if at is not None:
                _add(("lock-held", at[1]), time.perf_counter() - at[0])
                _local.lock_at = None
        else:
            real_fcntl.flock(fd, op)

    repolock.fcntl = types.SimpleNamespace(LOCK_EX=real_fcntl.LOCK_EX, LOCK_UN=real_fcntl.LOCK_UN,
                                         flock=flock)

    # Steps: the lane's and the worker's parts.
    tick.Lane.tick = _step("lane: tick (all)")(tick.Lane.tick)
    tick.LanePass._dispatch = _step("lane: dispatch")(tick.LanePass._dispatch)
    tick.LanePass._load = _step("lane: load rows")(tick.LanePass._load)
    integrate.Integrator._one_composition = _step("lane: compose+verify+advance")(
        integrate.Integrator._one_composition)
    aftermath.Aftermath.clean_after_integration = _step("lane: clean-up")(
        aftermath.Aftermath.clean_after_integration)
    consumers.work = _step("worker: work (all)")(consumers.work)  # the name the consumers call
    worker.StoryWorker.prepare = _step("worker: prepare")(worker.StoryWorker.prepare)
    worker.StoryWorker.phase_dev = _step("worker: dev")(worker.StoryWorker.phase_dev)
    worker.StoryWorker.phase_verify = _step("worker: verify")(worker.StoryWorker.phase_verify)
    worker.StoryWorker.phase_commit = _step("worker: commit")(worker.StoryWorker.phase_commit)

    # State database: BEGIN IMMEDIATE waits and transaction times.
    original_init = database.Database.__init__

    def init(self, url, **kwargs):
        original_init(self, url, **kwargs)

        @event.listens_for(self.engine, "before_cursor_execute")
        def before(conn, cursor, statement, parameters, context, executemany):
            conn.info.setdefault("probe_t", []).append(time.perf_counter())

        @event.listens_for(self.engine, "after_cursor_execute")
        def after(conn, cursor, statement, parameters, context, executemany):
            t = conn.info["probe_t"].pop()
            dt = time.perf_counter() - t
            if statement.startswith("BEGIN"):
                _add(("db-begin", _where()), dt)
            else:
                _add(("db-stmt", _where()), dt)

    database.Database.__init__ = init
    original_tx = database.Database.transaction

    @contextlib.contextmanager
    def transaction(self):
        t = time.perf_counter()
        with original_tx(self) as session:
            yield session
        _add(("db-tx", _where()), time.perf_counter() - t)

    database.Database.transaction = transaction

    # huey queue storage.
    original_enqueue, original_dequeue = SqliteStorage.enqueue, SqliteStorage.dequeue

    def enqueue(self, data, priority=None):
        t = time.perf_counter()
        try:
            return original_enqueue(self, data, priority)
        finally:
            _add(("huey", f"enqueue ({self.name})"), time.perf_counter() - t)

    def dequeue(self):
        t = time.perf_counter()
        out = original_dequeue(self)
        _add(("huey", f"dequeue {'hit' if out is not None else 'empty'} ({self.name})"),
             time.perf_counter() - t)
        return out

    SqliteStorage.enqueue, SqliteStorage.dequeue = enqueue, dequeue


def reset() -> None:
    with _lock:
        STATS.clear()


def report(stories: int) -> str:
    from _common import table

    with _lock:
        stats = {k: list(v) for k, v in STATS.items()}
    out = []
    steps = sorted((k[1], v) for k, v in stats.items() if k[0] == "step")
    rows = []
    for label, (n, total, peak) in steps:
        g = stats.get(("git", label), [0, 0.0, 0.0])
        b = stats.get(("db-begin", label), [0, 0.0, 0.0])
        tx = stats.get(("db-tx", label), [0, 0.0, 0.0])
        own = stats.get(("self", label), [0, 0.0, 0.0])
        lw = stats.get(("lock-wait", label), [0, 0.0, 0.0])
        lh = stats.get(("lock-held", label), [0, 0.0, 0.0])
        rows.append([label, n, f"{1000 * total / stories:.0f}", f"{1000 * own[1] / stories:.0f}",
                     f"{g[0] / stories:.1f}",
                     f"{1000 * g[1] / stories:.0f}", f"{tx[0] / stories:.1f}",
                     f"{1000 * tx[1] / stories:.0f}", f"{1000 * b[1] / stories:.1f}",
                     f"{1000 * b[2]:.0f}", f"{1000 * lw[1] / stories:.0f}",
                     f"{1000 * lh[1] / stories:.0f}"])
    out.append(table(["step", "calls", "total ms/story", "self ms/story", "git calls/story",
                      "git ms/story", "db tx/story", "db tx ms/story", "BEGIN wait ms/story",
                      "max BEGIN wait ms", "repo lock wait ms/story",
                      "repo lock held ms/story"], rows))
    out.append("\ntotal = the step with the probed steps inside it (the lane's clean-up runs "
               "inside compose+verify+advance, every lane step inside tick); self = without "
               "them. git, db and BEGIN wait count only the step's self part. BEGIN wait = time "
               "to get SQLite's write lock (BEGIN IMMEDIATE). repo lock = `repo_lock` "
               "(git/locks.py), which serialises worktree and ref mutations across threads: "
               "wait to take it, and time held (attributed to the step that took it).\n")
    subs = sorted(((k[1], v) for k, v in stats.items() if k[0] == "git-sub"),
                  key=lambda kv: -kv[1][1])[:15]
    out.append("\nMost expensive git subcommands (by total time):\n")
    out.append(table(["where: git subcommand", "calls/story", "ms/story", "ms/call"],
                     [[k, f"{v[0] / stories:.1f}", f"{1000 * v[1] / stories:.0f}",
                       f"{1000 * v[1] / v[0]:.1f}"] for k, v in subs]))
    huey = sorted((k[1], v) for k, v in stats.items() if k[0] == "huey")
    out.append("\nhuey SQLite storage:\n")
    out.append(table(["call", "count", "total ms", "mean ms", "max ms"],
                     [[k, v[0], f"{1000 * v[1]:.0f}", f"{1000 * v[1] / v[0]:.1f}",
                       f"{1000 * v[2]:.0f}"] for k, v in huey]))
    return "\n".join(out)
