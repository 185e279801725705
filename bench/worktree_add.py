#!/usr/bin/env python
"""Four new story worktrees made at once, as the first four stories of a run at max_parallel 4.

    python bench/worktree_add.py [--files 200] [--threads 4] [--repeat 5] [--compare OLD.py]

One repository of F small files (in 10 folders); each round, T threads wait on a barrier and then
each call `ensure_worktree` for a new branch at a new path (the quick path). Printed: the wall
time until all T worktrees are made (median over the rounds) and the median time at which the
first, second … thread finished. `--compare` loads another version of ``worktrees.py`` (say
``git show <rev>:src/bmad_loop/git/worktrees.py > /tmp/old.py``) and alternates rounds of both, each
round in a fresh repository, so both see the same machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bmad_loop.git.runner import Git, clean_env
from bmad_loop.git.worktrees import ensure_worktree


def make_repo(root: Path, files: int) -> Git:
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True, env=clean_env())
    for i in range(files):
        p = root / f"d{i % 10}" / f"f{i}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"file {i}\n" * 20)
    git = Git(root)
    git.run("add", "-A")
    git.run("commit", "-q", "-m", "base", env=git.identity_env())
    return git


def one_round(git: Git, base: str, wts: Path, n: int, threads: int,
              ensure=ensure_worktree) -> tuple[float, list[float]]:
    """Wall time until all `threads` worktrees exist, and each thread's finish, sorted."""
    barrier = threading.Barrier(threads + 1)
    done: list[float] = [0.0] * threads
    errors: list[BaseException] = []

    def work(i: int) -> None:
        barrier.wait()
        try:
            ensure(git, wts / f"r{n}-{i}", f"bench/r{n}-{i}", base, branch_head=None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        done[i] = time.perf_counter()

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return max(done) - start, sorted(d - start for d in done)


def _load(path: str):
    spec = importlib.util.spec_from_file_location("worktrees_compared", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.ensure_worktree


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--compare", help="another worktrees.py to alternate with this one")
    args = ap.parse_args()
    versions = {"this": ensure_worktree}
    if args.compare:
        versions = {"compared": _load(args.compare), "this": ensure_worktree}
    walls: dict[str, list[float]] = {name: [] for name in versions}
    each: dict[str, list[list[float]]] = {name: [] for name in versions}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.repeat):
            order = list(versions.items())
            for name, ensure in order if n % 2 == 0 else reversed(order):
                git = make_repo(Path(tmp) / f"repo-{name}-{n}", args.files)
                wall, finished = one_round(git, git.rev("HEAD"), Path(tmp) / f"wts-{name}-{n}",
                                           n, args.threads, ensure)
                walls[name].append(wall)
                each[name].append(finished)
    for name in versions:
        firsts = [statistics.median(f[i] for f in each[name]) * 1000 for i in range(args.threads)]
        print(f"{name:9s} all done: median {statistics.median(walls[name]) * 1000:6.1f} ms "
              f"({' '.join(f'{w * 1000:.0f}' for w in walls[name])}); threads finished at "
              + " ".join(f"{f:.0f}" for f in firsts) + " ms")
    print(f"{args.files} files, {args.threads} threads, {args.repeat} rounds; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
