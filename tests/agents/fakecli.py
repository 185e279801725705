"""What the three stand-in agent CLIs share: the script, the work, the call log.

A stand-in (fake_claude.py, fake_codex.py, fake_gemini.py) is installed in a test as an
executable named `claude`, `codex` or `gemini` on PATH, and prints what the real CLI prints in
its documented structured format. It reads the JSON script named by `FAKE_CLI_SCRIPT`:

  {"1-1-a": {"dev": [{"fault": "rate-limit"}, {"write": {"src/a.py": "A = 1\\n"}}],
             "review": [{"say": "BMAD-LOOP-VERDICT: APPROVED"}]}}

One step per call of that story and phase, counted in "<SCRIPT>.calls" (the last step repeats),
so a session run again after a pause takes the next step. Step keys (all optional): write
{path: text} (files edited in the worktree), say (the agent's final message; review default:
the APPROVED verdict line), fault (an environment fault the CLI reports in its own way: see each
stand-in), words (the fault's message, instead of the CLI's usual one), usage {input, output,
cache_read, cache_write, cost}, exit (an exit code of a failed story session).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

DEFAULT_USAGE = {"input": 1000, "output": 200, "cache_read": 3000, "cache_write": 500, "cost": 0.25}


def next_step(cli: str) -> dict:
    """This call's step; the call is logged (cli, key, phase, argv, the trust variable)."""
    script_path = Path(os.environ["FAKE_CLI_SCRIPT"])
    script = json.loads(script_path.read_text())
    key = os.environ.get("BMAD_LOOP_STORY_KEY", "")
    phase = os.environ.get("BMAD_LOOP_PHASE", "")
    calls_path = Path(str(script_path) + ".calls")
    previous = [json.loads(line) for line in calls_path.read_text().splitlines()] \
        if calls_path.exists() else []
    n = sum(1 for c in previous if c["key"] == key and c["phase"] == phase)
    with open(calls_path, "a") as calls:
        prompt_file = os.environ.get("BMAD_LOOP_PROMPT_FILE", "")
        prompt = Path(prompt_file).read_text() if prompt_file and Path(prompt_file).is_file() else ""
        calls.write(json.dumps({"cli": cli, "key": key, "phase": phase, "argv": sys.argv[1:],
                                "trust": os.environ.get("GEMINI_CLI_TRUST_WORKSPACE"),
                                "prompt": prompt}) + "\n")
    steps = script.get(key, {}).get(phase) or script.get("*", {}).get(phase) or [{}]
    step = dict(steps[min(n, len(steps) - 1)])
    if phase == "review" and "say" not in step:
        step["say"] = "All acceptance criteria are met.\nBMAD-LOOP-VERDICT: APPROVED"
    return step


def do_writes(step: dict) -> list[str]:
    """Edit the files the step names, in the session's working directory (the worktree)."""
    written = []
    for rel, text in (step.get("write") or {}).items():
        path = Path.cwd() / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(rel)
    return written


def usage_of(step: dict) -> dict:
    return {**DEFAULT_USAGE, **(step.get("usage") or {})}


def emit(event: dict) -> None:
    print(json.dumps(event), flush=True)
