#!/usr/bin/env python
"""One bench, two checkouts, run in alternated pairs in one invocation: old against new.

    python bench/alternate.py --old DIR --new DIR [--pairs 5] \
        --metric NAME=REGEX [--metric ...] -- BENCH.py [BENCH ARGS...]

Each pair runs ``DIR/bench/BENCH.py ARGS`` from the old checkout, then from the new one (the
order flips every pair, so a machine that drifts favours neither), each with its own ``src`` on
``PYTHONPATH``, so each bench drives the engine of its own tree. Every ``--metric`` is a regular
expression whose first group is a number in the bench's output (searched across lines); the
medians of each, their ratio new / old, and the load average before and after are printed.
Not a test: nothing is asserted. ``--json`` prints the same as one object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path


def run_once(tree: Path, bench: str, args: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    proc = subprocess.run([sys.executable, str(tree / "bench" / bench), *args], cwd=tree,
                          env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{tree}/bench/{bench} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return proc.stdout


def measure(text: str, metrics: dict[str, re.Pattern]) -> dict[str, float]:
    found = {}
    for name, pattern in metrics.items():
        match = pattern.search(text)
        if match is None:
            raise SystemExit(f"metric {name}: /{pattern.pattern}/ not found in the output:\n{text}")
        found[name] = float(match.group(1))
    return found


def parse_metrics(items: list[str]) -> dict[str, re.Pattern]:
    metrics = {}
    for item in items:
        name, sep, regex = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--metric {item!r}: expected NAME=REGEX")
        metrics[name] = re.compile(regex, re.S)
    return metrics


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the checkout before the change")
    parser.add_argument("--new", type=Path, required=True, help="the checkout after it")
    parser.add_argument("--pairs", type=int, default=5, help="alternated pairs [5]")
    parser.add_argument("--metric", action="append", required=True, metavar="NAME=REGEX")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("bench", help="the bench script's file name, e.g. makespan.py")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    metrics = parse_metrics(args.metric)
    load_start = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for pair in range(args.pairs):
        order = ("old", "new") if pair % 2 == 0 else ("new", "old")
        for side in order:
            tree = args.old if side == "old" else args.new
            runs[side].append(measure(run_once(tree, args.bench, args.bench_args), metrics))
            if not args.json:
                print(f"pair {pair + 1} {side}: {runs[side][-1]}", flush=True)
    medians = {side: {name: statistics.median(r[name] for r in rows) for name in metrics}
               for side, rows in runs.items()}
    ratios = {name: medians["new"][name] / medians["old"][name] for name in metrics}
    result = {"bench": args.bench, "args": args.bench_args, "pairs": args.pairs, "runs": runs,
              "median": medians, "ratio_new_over_old": ratios,
              "load_average": {"start": load_start, "end": os.getloadavg()}}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"\n# {args.bench} {' '.join(args.bench_args)} — {args.pairs} alternated pairs")
    print(f"load average: start {load_start}, end {result['load_average']['end']}")
    for name in metrics:
        print(f"{name}: old median {medians['old'][name]:.3f}, new median "
              f"{medians['new'][name]:.3f}, new / old = {ratios[name]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
