"""Did an agent session change anything? The "empty session" check of dev and fix.

An agent that printed an error and exited 0 must not pass as a finished story. Before a dev or
fix session the worker takes a `snapshot` of the story's work: every path that differs from the
story's base commit — committed by the agent or not, tracked or new — with the id of its
content. The same snapshot after the session tells whether the session changed anything;
changes to lane-owned files (the board, ledgers) and the prompt folder do not count, since the
worker reverts or ignores them.

The snapshot asks git, never the agent (in a story's worktree, index flags that hide edits
are taken off first, `indexflags.py`): `diff --name-only <base>` (the worktree against the
base, committed and uncommitted), `ls-files --others --exclude-standard` (new files), and
`hash-object --stdin-paths` for their contents.
"""

from __future__ import annotations

from pathlib import Path

from ...git.worktrees import clear_flags
from ..workspace.base import matches_any

__all__ = ["snapshot", "changed_paths_between"]

_GONE = "-"  # a path that differs from the base by not being there


def snapshot(git, worktree: Path, base_sha: str, *, unflag: bool = False) -> dict[str, str]:
    """Path -> content id of each path of `worktree` that differs from `base_sha`. With
    `unflag` (a story's own worktree, never a person's checkout) index flags are taken off
    first: an edit hidden behind one is a change all the same."""
    if unflag:
        clear_flags(git, worktree)
    tracked = git.run("diff", "--name-only", "-z", "--no-renames", base_sha, "--", cwd=worktree).stdout
    new = git.run("ls-files", "--others", "--exclude-standard", "-z", cwd=worktree).stdout
    paths = sorted({p for p in (tracked + "\0" + new).split("\0") if p})
    present = [p for p in paths if (worktree / p).is_file()]
    ids = []
    if present:
        out = git.run("hash-object", "--stdin-paths", cwd=worktree, input="\n".join(present) + "\n").stdout
        ids = out.split()
    found = dict(zip(present, ids))
    return {p: found.get(p, _GONE) for p in paths}


def changed_paths_between(before: dict[str, str], after: dict[str, str], ignore) -> list[str]:
    """The paths whose content differs between two snapshots, except those matching `ignore`."""
    paths = set(before) | set(after)
    return sorted(p for p in paths
                  if before.get(p) != after.get(p) and not matches_any(p, list(ignore)))
