#!/usr/bin/env python
"""Peak memory of `bmad-loop run` while its sessions print a lot: it must not grow with output.

    python bench/bounded_memory.py [--mb 1024] [--mb 16 --mb 1024] [--keep] [--dir DIR]

For each size S (MiB), builds a one-story repository and runs `bmad-loop run` as a child
process whose agent prints S MiB in its dev session and S MiB in its review, and whose verify
command prints S MiB (run in the story and again in the candidate): 4·S MiB in all, all of it
going to the session and verify logs. The peak RSS is `ru_maxrss` from `os.wait4` of that child
(taken by a small launcher process, see LAUNCHER), which is the largest of the child and every
process it waited for (the agent, git, the verify shell): an upper bound for bmad-loop's own. Prints a table; exits 1 when a peak is
150 MB or more. tests/test_field_hard.py runs the same with 200 MiB.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchStory, build_repo, machine, policy_text, table  # noqa: E402

MB = 1024 * 1024
LIMIT = 150 * MB
AGENT = """import os, sys
from pathlib import Path
size = int(sys.argv[1])
chunk = (b"x" * 1023 + b"\\n") * 1024
for _ in range(size // len(chunk)):
    sys.stdout.buffer.write(chunk)
if os.environ.get("BMAD_LOOP_PHASE") == "dev":
    Path("work/1-1-loud.txt").write_text("loud\\n")
"""
# wait4 from a small, fresh launcher: Linux counts the high-water mark a forked child inherits
# from its parent (vfork shares it until exec) in the child's ru_maxrss, so measuring straight
# from this (bigger) process would report this process's size as a floor.
LAUNCHER = """import json, os, subprocess, sys
with open(sys.argv[1], "ab") as log:
    proc = subprocess.Popen(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
proc.returncode = code = os.waitstatus_to_exitcode(status)
print(json.dumps({"code": code, "maxrss": usage.ru_maxrss}))
"""


def one(folder: Path, size_mb: int) -> dict:
    agent = folder / "loud_agent.py"
    agent.write_text(AGENT)
    size = size_mb * MB
    argv = [sys.executable, str(agent), str(size)]
    policy = policy_text(parallel=1, agent_argv=argv)
    policy = policy.replace("[review]\nenabled = false", "[review]\nenabled = true")
    policy = policy.replace("commands = []", f"commands = {json.dumps([' '.join(argv)])}")
    root = build_repo(folder / "repo", [BenchStory("1-1-loud", ["work/1-1-loud.txt"])],
                      files=10, policy=policy)
    log = folder / "run.log"
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", LAUNCHER, str(log), sys.executable, "-m", "bmad_loop",
                          "run", "--project", str(root)], capture_output=True, text=True, check=True)
    measured = json.loads(out.stdout)
    rss = measured["maxrss"] * (1 if sys.platform == "darwin" else 1024)
    logs = sum(p.stat().st_size for p in (root / ".bmad-loop" / "logs").rglob("*.log"))
    return {"mb": size_mb, "exit": measured["code"], "rss": rss, "logs": logs,
            "wall": time.monotonic() - started, "log": log}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, action="append", help="MiB per session (repeatable); default 1024")
    parser.add_argument("--dir", type=Path, help="work here instead of a temporary folder")
    parser.add_argument("--keep", action="store_true", help="keep the repositories and logs")
    args = parser.parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="bmad-loop-memory-"))
    rows, failed = [], False
    for size_mb in args.mb or [1024]:
        folder = base / f"mb-{size_mb}"
        folder.mkdir(parents=True)
        result = one(folder, size_mb)
        ok = result["exit"] == 0 and result["rss"] < LIMIT
        failed |= not ok
        if result["exit"] != 0:
            print(result["log"].read_text()[-3000:], file=sys.stderr)
        rows.append([f"{size_mb}", f"{result['logs'] / MB:.0f}", f"{result['rss'] / MB:.1f}",
                     f"{result['wall']:.1f}", str(result["exit"]), "yes" if ok else "NO"])
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"machine: {machine()}")
    print(table(["MiB per session", "MiB logged", "peak RSS (MB)", "wall (s)", "exit", "< 150 MB"], rows))
    if not args.keep and not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
