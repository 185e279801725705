"""Which project a folder belongs to, so bmad-loop works from any folder of a repository.

From the folder given (`--project`, default the current one) upwards: the nearest folder that
holds `.bmad-loop/policy.toml` is the project; else the top of the git working tree (the first
folder holding `.git`, a folder in a clone and a file in a linked worktree). A folder in no
repository and under no policy is taken as it is, so the commands' own messages name it.
The walk never climbs above the repository: a policy in a folder that holds the repository is
not this project's.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["find_project_root"]

POLICY = Path(".bmad-loop") / "policy.toml"


def find_project_root(start: Path) -> Path:
    start = Path(start).resolve()
    for folder in (start, *start.parents):
        if (folder / POLICY).is_file() or (folder / ".git").exists():
            return folder
    return start
