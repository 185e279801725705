"""An agent that plants code in the repository's git configuration, for tests.

Usage (as an [adapter] command): python planting_agent.py VECTOR MARKER [FILE]
It writes its story's file (FILE, default src/alpha.py), then plants VECTOR, whose code appends
one line to MARKER whenever it runs, and exits 0 without running any other git:

  hook        executable hooks in the common hooks folder (pre-commit, commit-msg, post-commit,
              reference-transaction, post-checkout, post-merge, post-index-change, pre-auto-gc)
  hooks-path  core.hooksPath in .git/config, naming a folder of such hooks
  fsmonitor   core.fsmonitor in .git/config, naming a script
  filter      filter.planted.clean/smudge in .git/config and `* filter=planted` in .gitattributes
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

HOOKS = ("pre-commit", "commit-msg", "post-commit", "reference-transaction", "post-checkout",
         "post-merge", "post-index-change", "pre-auto-gc")


def script(path: Path, marker: str, what: str, tail: str = "exit 0") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{what} ran in $$ $(pwd)" >> "{marker}"\n{tail}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def git(worktree: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=worktree, check=True, capture_output=True,
                          text=True).stdout.strip()


def plant(vector: str, marker: str, worktree: Path) -> None:
    common = Path(git(worktree, "rev-parse", "--path-format=absolute", "--git-common-dir"))
    lair = Path(marker).parent / "planted"
    if vector == "hook":
        for name in HOOKS:
            script(common / "hooks" / name, marker, name, "cat >/dev/null; exit 0")
    elif vector == "hooks-path":
        for name in HOOKS:
            script(lair / "hooks" / name, marker, name, "cat >/dev/null; exit 0")
        git(worktree, "config", "core.hooksPath", str(lair / "hooks"))
    elif vector == "fsmonitor":
        git(worktree, "config", "core.fsmonitor", script(lair / "fsmonitor", marker, "fsmonitor",
                                                        "exit 1"))
    elif vector == "filter":
        clean = script(lair / "filter", marker, "filter", "cat")
        git(worktree, "config", "filter.planted.clean", clean)
        git(worktree, "config", "filter.planted.smudge", clean)
        (worktree / ".gitattributes").write_text("* filter=planted\n")
    else:
        raise SystemExit(f"unknown vector {vector}")


def main() -> None:
    vector, marker = sys.argv[1], sys.argv[2]
    rel = sys.argv[3] if len(sys.argv) > 3 else "src/alpha.py"
    worktree = Path(os.environ["BMAD_LOOP_WORKTREE"])
    path = worktree / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"NAME = {os.environ['BMAD_LOOP_STORY_KEY']!r}\n")
    if os.environ["BMAD_LOOP_PHASE"] == "dev":
        plant(vector, marker, worktree)


if __name__ == "__main__":
    main()
