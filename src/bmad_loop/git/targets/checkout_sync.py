"""Keeping the checkout that has the target checked out in step with each advance.

The lane holds the checkout's index lock (`indexlock.IndexLock`) from before the compare-and-
swap until the checkout follows; `sync_held_checkout` does the following under that lock.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..trees.diff import changed_status
from ...errors import GitError
from ..runner import Git, is_full_sha
from ..locks import git_dirs

__all__ = ["index_path", "sync_held_checkout"]


def index_path(git: Git, checkout: Path) -> Path:
    """The index file of `checkout` (a linked worktree has its own under the common dir)."""
    if os.path.lexists(Path(checkout) / ".git"):  # its own top level: found without git
        dirs = git_dirs(Path(checkout))
        if dirs is not None and (dirs[0] / "HEAD").is_file():
            return dirs[0] / "index"  # GIT_INDEX_FILE, which could move it, is never passed on
    raw = git.out("rev-parse", "--git-path", "index", cwd=checkout)
    path = Path(raw)
    return path if path.is_absolute() else (Path(checkout) / path)


def sync_held_checkout(git: Git, checkout: Path, lock, old: str, new: str) -> None:
    """Bring `checkout`, whose index lock the caller holds, from `old` to `new`.

    Only the paths the advance changes are touched: they are checked out from `new` (or removed)
    in a copy of the index, which then replaces the index in one rename. Unrelated local
    changes, staged or not, survive. Idempotent: run again after a crash half-way (files
    written, index not yet replaced), it ends in the same state. Refuses (GitError, nothing
    changed) when the checkout's HEAD is not `new`.
    """
    head = git.rev("HEAD", cwd=checkout)
    if head != (new if is_full_sha(new) else git.rev(new)):  # a full SHA needs no look-up
        raise GitError(f"{checkout} is at {head}, not at {new}: it is not on the advanced branch")
    # One diff names what changes and what goes (the dirty check before the CAS asked the same).
    status = changed_status(git, old, new)
    if not status:
        return
    gone = [p for p, letter in status.items() if letter == "D"]
    kept = set(status) - set(gone)
    scratch = lock.index.with_name(lock.index.name + ".bmad-loop-sync")
    if lock.index.exists():
        shutil.copyfile(lock.index, scratch)
    else:
        scratch.unlink(missing_ok=True)
    env = {"GIT_INDEX_FILE": str(scratch)}
    try:
        if gone:
            git.run("rm", "-q", "-r", "-f", "--ignore-unmatch", "--pathspec-from-file=-",
                    "--pathspec-file-nul", cwd=checkout, env=env, input=_nul_list(gone))
        if kept:
            git.run("checkout", "--quiet", new, "--pathspec-from-file=-", "--pathspec-file-nul",
                    cwd=checkout, env=env, input=_nul_list(sorted(kept)))
        lock.install(scratch)
    finally:
        scratch.unlink(missing_ok=True)


def _nul_list(paths) -> str:
    return "".join(f"{p}\0" for p in paths)
