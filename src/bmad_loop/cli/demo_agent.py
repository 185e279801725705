"""The demo's scripted agent: a real program that edits and commits files in its worktree.

It reads the `demo:` block of its story file's front matter:

    demo:
      writes: {"src/greet.py": "def greet(name):\n    return f'Hello, {name}!'\n"}
      append: {"NOTES.md": "- greet added\n"}

dev writes/appends those files (committing the first one itself when it runs unboxed and
leaving the rest for the worker to commit), review approves, fix does nothing. It needs nothing but Python.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from ..states import Phase


def _front_matter(text: str) -> dict:
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    return yaml.safe_load(text[3:end]) or {} if end != -1 else {}


def main(argv: list[str]) -> int:
    phase = Phase(os.environ["BMAD_LOOP_PHASE"])
    worktree = Path(os.environ["BMAD_LOOP_WORKTREE"])
    story_file = Path(os.environ["BMAD_LOOP_STORY_FILE"])
    print(f"demo agent: {phase} for {os.environ['BMAD_LOOP_STORY_KEY']} "
          f"(attempt {os.environ['BMAD_LOOP_ATTEMPT']})")
    if phase != Phase.DEV:
        print("demo agent: looks good" if phase == Phase.REVIEW else "demo agent: nothing to fix")
        return 0
    meta = _front_matter(story_file.read_text()).get("demo", {})
    written = []
    for rel, content in (meta.get("writes") or {}).items():
        path = worktree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append(rel)
    for rel, content in (meta.get("append") or {}).items():
        path = worktree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as handle:
            handle.write(content)
        written.append(rel)
    text = story_file.read_text().replace("Status: ready-for-dev", "Status: review")
    story_file.write_text(text)
    if written and not os.environ.get("BMAD_LOOP_SANDBOX"):
        # Commit the first file like an unboxed agent may; the worker commits the rest. (In
        # bmad-loop's sandbox no branch is writable: the worker commits everything.)
        subprocess.run(["git", "add", "--", written[0]], cwd=worktree, check=True)
        subprocess.run(["git", "-c", "user.name=demo-agent", "-c", "user.email=demo-agent@localhost",
                        "commit", "-q", "-m", f"{os.environ['BMAD_LOOP_STORY_KEY']}: "
                        f"add {written[0]}"], cwd=worktree, check=True)
    print(f"demo agent: wrote {', '.join(written) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
