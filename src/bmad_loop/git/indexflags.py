"""Index flags that hide a worktree's edits from git, found and cleared by git's own commands.

An agent can run ``git update-index --skip-worktree <path>`` or ``--assume-unchanged <path>``
in its worktree: from then on ``status``, ``diff`` and ``add -A`` treat that file as unchanged,
whatever it holds. Left alone, the story's commit would drop the agent's edit of the file, and
a reused worktree would hand the flag (and the hidden edit) to the next story. ``reset --hard``
keeps both flags; ``read-tree <tree>`` (without ``-m``) drops them, and intent-to-add entries too.

`flagged` reads them (``ls-files -v``: ``S``/``s`` skip-worktree, a lower-case tag
assume-unchanged); `clear_flags` takes them off the paths that carry them (``update-index``,
one process per kind, since git applies one such option per call), so the index keeps its stat
data and the next ``add -A`` looks at those files again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .runner import Git

__all__ = ["Flagged", "flagged", "clear_flags"]

_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}


@dataclass(frozen=True)
class Flagged:
    skip_worktree: list[str] = field(default_factory=list)
    assume_unchanged: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.skip_worktree or self.assume_unchanged)


def flagged(git: Git, worktree: Path) -> Flagged:
    """The index entries of `worktree` that carry skip-worktree or assume-unchanged."""
    out = git.run("ls-files", "-v", "-z", cwd=worktree).stdout
    skip, assume = [], []
    for entry in filter(None, out.split("\0")):
        tag, path = entry[:1], entry[2:]
        if tag in ("S", "s"):
            skip.append(path)
        if tag.islower():
            assume.append(path)
    return Flagged(skip, assume)


def clear_flags(git: Git, worktree: Path) -> Flagged:
    """Take skip-worktree and assume-unchanged off every entry of `worktree`'s index that has
    either; what was flagged (empty: nothing was, and only one git process ran)."""
    found = flagged(git, worktree)
    for option, paths in (("--no-skip-worktree", found.skip_worktree),
                          ("--no-assume-unchanged", found.assume_unchanged)):
        if paths:
            git.run("update-index", option, "-z", "--stdin", cwd=worktree,
                    input="\0".join(paths) + "\0", env=_LITERAL)
    return found
