"""A night with conflicts and flakes: stories landed unattended, sessions spent, makespan, N=4 vs N=1.

The sprint (12 stories, one epic, gates and review off): eight independent stories; two
rename/caller pairs (story A renames a function in its module and updates every caller in its
tree; a later story B adds a module that calls the function) and one textual conflict (two stories
edit the same line of a file outside both footprints). The check imports every module and is
flaky: it fails the first time it runs on a tree whose digest starts with 0 or 1, whatever the N
(keyed by command, tree and n-th run, its memory outside the tree, so verify runs unboxed).

The agent re-reads the code each time it is called, as a real one does: a caller calls whatever
name its worktree's module defines; a repair session resolves conflict markers by keeping both
sides. Each session takes `--session-s` seconds of "thinking". Run: `python bench/night.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BOARD = Path("_bmad-output/implementation-artifacts")

AGENT = r'''
import os, re, sys, time
from pathlib import Path
key, phase = os.environ["BMAD_LOOP_STORY_KEY"], os.environ["BMAD_LOOP_PHASE"]
wt = Path(os.environ["BMAD_LOOP_WORKTREE"])
with open(sys.argv[1], "a") as calls:
    calls.write(f"{key} {phase}\n")
time.sleep(float(sys.argv[2]))
kind, _, arg = key.split("-", 2)[2].partition("_")
def name_in(module):
    return re.search(r"^def (\w+)", (wt / "app" / f"{module}.py").read_text(), re.M).group(1)
if phase == "repair":
    for path in wt.rglob("*.txt"):
        text = path.read_text()
        if "<<<<<<<" in text:
            keep = [l for l in text.splitlines() if not l.startswith(("<<<<<<<", "=======", ">>>>>>>"))]
            path.write_text("\n".join(keep) + "\n")
if kind == "rename":
    (wt / "app" / f"{arg}.py").write_text(f"def new_{arg}():\n    return 1\n")
    (wt / "app" / f"use_{arg}.py").write_text(f"from app.{arg} import new_{arg}\n\nV = new_{arg}()\n")
elif kind == "caller":
    name = name_in(arg)
    (wt / "app" / f"call_{arg}.py").write_text(f"from app.{arg} import {name}\n\nV = {name}()\n")
elif kind == "conf" and phase == "dev":
    (wt / "app" / f"{arg}.py").write_text(f"X = '{arg}'\n")
    (wt / "conf" / "settings.txt").write_text(f"mode = {arg}\n")
elif phase == "dev":
    (wt / "app" / f"{kind}{arg}.py").write_text(f"X = '{key}'\n")
'''

CHECK = r'''
import hashlib, importlib, os, pkgutil, sys
from pathlib import Path
digest = hashlib.sha256()
for path in sorted(Path("app").glob("*.py")):
    digest.update(path.name.encode() + path.read_bytes())
tree = digest.hexdigest()
memory = Path(os.environ["NIGHT_MEMORY"]) / tree
runs = int(memory.read_text()) + 1 if memory.exists() else 1
memory.write_text(str(runs))
if tree[0] in "01" and runs == 1:
    sys.exit("flaked (first run of this tree)")
sys.path.insert(0, ".")
import app
for m in pkgutil.iter_modules(app.__path__):
    importlib.import_module("app." + m.name)
'''

# (key, footprint files): the two pairs, the conflict pair, the independent rest.
STORIES = [
    ("1-1-rename_alpha", ["app/alpha.py", "app/use_alpha.py"]),
    ("1-2-ind_1", ["app/ind1.py"]),
    ("1-3-conf_left", ["app/left.py"]),
    ("1-4-ind_2", ["app/ind2.py"]),
    ("1-5-caller_alpha", ["app/call_alpha.py"]),
    ("1-6-rename_beta", ["app/beta.py", "app/use_beta.py"]),
    ("1-7-ind_3", ["app/ind3.py"]),
    ("1-8-ind_4", ["app/ind4.py"]),
    ("1-9-caller_beta", ["app/call_beta.py"]),
    ("1-10-ind_5", ["app/ind5.py"]),
    ("1-11-conf_right", ["app/right.py"]),
    ("1-12-ind_6", ["app/ind6.py"]),
]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=b@localhost", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def build(root: Path, n: int, session_s: float) -> Path:
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    (root / BOARD).mkdir(parents=True)
    (root / "app").mkdir()
    (root / "conf").mkdir()
    (root / "app" / "__init__.py").write_text("")
    for module in ("alpha", "beta"):
        (root / "app" / f"{module}.py").write_text(f"def old_{module}():\n    return 1\n")
        (root / "app" / f"use_{module}.py").write_text(
            f"from app.{module} import old_{module}\n\nV = old_{module}()\n")
    (root / "conf" / "settings.txt").write_text("mode = base\n")
    (root / "check.py").write_text(CHECK)
    (root.parent / "agent.py").write_text(AGENT)
    lines = ["development_status:", "  epic-1: in-progress"]
    for key, files in STORIES:
        lines.append(f"  {key}: ready-for-dev")
        front = {"title": key, "footprint": {"files": files}}
        (root / BOARD / f"{key}.md").write_text(f"---\n{json.dumps(front)}\n---\n# {key}\n\nStatus: ready-for-dev\n")
    (root / BOARD / "sprint-status.yaml").write_text("\n".join(lines) + "\n")
    (root / ".gitignore").write_text(".bmad-loop/\n__pycache__/\n")
    memory = root.parent / "memory"
    memory.mkdir()
    agent = [sys.executable, str(root.parent / "agent.py"), str(root.parent / "calls"), str(session_s)]
    (root / ".bmad-loop").mkdir()
    (root / ".bmad-loop" / "policy.toml").write_text(
        f'[scm]\nmax_parallel = {n}\n[gates]\nmode = "none"\n[review]\nenabled = false\n'
        f'[verify]\ncommands = ["{sys.executable} check.py"]\nsandbox = "off"\n'
        f'[adapter]\ncommand = {json.dumps(agent)}\ntimeout_s = 120\nsandbox = "off"\n'
        f'[adapter.env]\nNIGHT_MEMORY = "{memory}"\n')
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return root


def night(root: Path, n: int) -> dict:
    env = {**os.environ, "NIGHT_MEMORY": str(root.parent / "memory")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bmad_loop", "run", "--project", str(root)],
                          capture_output=True, text=True, env=env)
    makespan = time.monotonic() - started
    status = json.loads(subprocess.run(
        [sys.executable, "-m", "bmad_loop", "status", "--project", str(root), "--json"],
        capture_output=True, text=True, check=True).stdout)
    calls = (root.parent / "calls").read_text().splitlines()
    git(root, "checkout", "-q", "main")
    check = subprocess.run([sys.executable, "-c", CHECK.replace('runs == 1', 'False')], cwd=root,
                           env=env).returncode
    landed = sum(1 for s in status["stories"] if s["state"] == "integrated")
    return {"n": n, "exit": proc.returncode, "landed": landed, "sessions": len(calls),
            "repairs": sum(1 for c in calls if c.endswith(" repair")),
            "flakes": len(status.get("flakes", [])), "makespan_s": round(makespan, 2),
            "final_check": "pass" if check == 0 else "FAIL", "tail": proc.stdout[-600:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session-s", type=float, default=1.0)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="night-") as tmp:
        for n in (4, 1):
            rows.append(night(build(Path(tmp) / f"n{n}" / "repo", n, args.session_s), n))
    print(f"load {os.getloadavg()[0]:.2f}; {len(STORIES)} stories; session {args.session_s}s")
    print(f"{'N':>2} {'exit':>4} {'landed':>6} {'sessions':>8} {'repairs':>7} {'flakes':>6} "
          f"{'makespan':>9} final check")
    for r in rows:
        print(f"{r['n']:>2} {r['exit']:>4} {r['landed']:>4}/12 {r['sessions']:>8} {r['repairs']:>7} "
              f"{r['flakes']:>6} {r['makespan_s']:>8}s {r['final_check']}")
    for r in rows:
        if r["exit"] != 0:
            print(f"--- N={r['n']} ended {r['exit']}:\n{r['tail']}")


if __name__ == "__main__":
    main()
