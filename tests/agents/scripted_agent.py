"""A scripted agent for tests: a real process that does what a JSON script says.

Usage (as an [adapter] command): python scripted_agent.py SCRIPT.json
The script maps story key -> phase -> list of steps, one per attempt (the last repeats):

  {"1-1-a": {"dev": [{"write": {"src/a.py": "x = 1\n"}, "commit": true, "exit": 0}],
             "review": [{"exit": 1, "say": "needs a docstring"}, {"exit": 0}]}}

Step keys (all optional): write {path: text}, append {path: text}, delete [paths], commit (bool:
commit the writes itself), git [[args...], ...] (run git commands in the worktree, e.g. to try
to move the target), touch [files] (absolute; e.g. a barrier "I am inside dev"), wait_for
(absolute file path: block until it exists), hang (sleep forever), spawn_grandchild (a child
process that sleeps; its pid written to that path), say (printed to stdout), usage (written
as written to $BMAD_LOOP_USAGE_FILE: an object is dumped as JSON, a string written as is),
print_bytes (that many bytes of numbered lines to stdout), exit (code).
Every call is appended to "<SCRIPT>.calls" as one JSON line (phase, key, attempt, env, cwd),
so tests can count sessions and check what each one saw.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def print_numbered(total: int) -> None:
    """`total` bytes of lines `line <n>\\n`-padded to 64 bytes each, written in big chunks."""
    out = sys.stdout.buffer
    written, n = 0, 0
    while written < total:
        chunk = bytearray()
        while len(chunk) < 1 << 20 and written + len(chunk) < total:
            chunk += f"line {n:058d}\n".encode()
            n += 1
        chunk = chunk[: total - written]
        out.write(chunk)
        written += len(chunk)
    out.flush()


def main():
    script_path = Path(sys.argv[1])
    script = json.loads(script_path.read_text())
    key = os.environ["BMAD_LOOP_STORY_KEY"]
    phase = os.environ["BMAD_LOOP_PHASE"]
    attempt = int(os.environ["BMAD_LOOP_ATTEMPT"])
    worktree = Path(os.environ["BMAD_LOOP_WORKTREE"])
    prompt = Path(os.environ["BMAD_LOOP_PROMPT_FILE"]).read_text()
    with open(str(script_path) + ".calls", "a") as calls:
        calls.write(json.dumps({
            "key": key, "phase": phase, "attempt": attempt, "cwd": os.getcwd(),
            "env": {k: v for k, v in os.environ.items() if k.startswith("BMAD_LOOP_") or k == "TMPDIR"},
            "prompt": prompt, "argv": sys.argv[1:],
            # a repair's evidence lives in the session folder, gone once the story lands
            "evidence": (Path(os.environ["BMAD_LOOP_REPAIR_EVIDENCE"]).read_text()
                         if os.environ.get("BMAD_LOOP_REPAIR_EVIDENCE") else None),
        }) + "\n")
    steps = script.get(key, {}).get(phase) or script.get("*", {}).get(phase) or [{"exit": 0}]
    step = steps[min(attempt, len(steps)) - 1]
    for rel, text in (step.get("write") or {}).items():
        path = worktree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for rel, text in (step.get("append") or {}).items():
        path = worktree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as handle:
            handle.write(text)
    for rel in step.get("delete") or []:
        (worktree / rel).unlink()
    for rel, target in (step.get("symlink") or {}).items():  # rel made a link to target
        path = worktree / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()
        os.symlink(target, path)
    identity = ["-c", "user.name=agent", "-c", "user.email=agent@localhost"]
    if step.get("commit"):
        subprocess.run(["git", "add", "-A"], cwd=worktree, check=True)
        subprocess.run(["git", *identity, "commit", "-q", "-m", f"{key}: agent commit"],
                       cwd=worktree, check=True)
    for args in step.get("git") or []:
        proc = subprocess.run(["git", *identity, *args], cwd=worktree, capture_output=True, text=True)
        print(f"git {' '.join(args)} -> {proc.returncode} {proc.stderr.strip()}")
    for name in step.get("touch") or []:
        Path(name).write_text(str(os.getpid()))
    if step.get("wait_for"):
        while not Path(step["wait_for"]).exists():
            time.sleep(0.02)
    if step.get("spawn_grandchild"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(step["spawn_grandchild"]).write_text(str(child.pid))
    if "usage" in step:
        usage = step["usage"]
        Path(os.environ["BMAD_LOOP_USAGE_FILE"]).write_text(
            usage if isinstance(usage, str) else json.dumps(usage))
    if step.get("print_bytes"):
        print_numbered(step["print_bytes"])
    if step.get("say"):
        print(step["say"])
    if step.get("hang"):
        time.sleep(600)
    sys.exit(step.get("exit", 0))


if __name__ == "__main__":
    main()
