"""Make an existing worktree exactly one commit's tree, with git's own commands.

A plain ``read-tree <sha>`` drops every index flag (skip-worktree, assume-unchanged and
intent-to-add, which ``checkout -f`` and ``reset --hard`` keep, and with them an edit hidden
from git); ``checkout --detach -f <sha>`` writes the files that index names; ``clean -ffdx``
removes untracked and ignored files. What ran in the worktree before (a verification a crash cut
short) leaves nothing a later one could see.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import GitError

__all__ = ["make_exact"]


def make_exact(git, path: Path, sha: str) -> bool:
    """Make the worktree at `path` exactly `sha`'s tree, HEAD detached there; False when git
    could not (a read-only folder ``clean`` cannot empty): the caller makes it again."""
    try:
        git.run("read-tree", sha, cwd=path)
        git.run("checkout", "--quiet", "--detach", "-f", sha, cwd=path)
        git.run("clean", "-ffdxq", cwd=path)
    except GitError:
        return False
    return True
