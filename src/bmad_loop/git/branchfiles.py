"""Deleting a landed story's branch by editing git's files, without starting git.

The lane deletes each story's branch once the story is on the target: a ``git branch -D`` per
story, on the run's one serial path (~2 ms to start, ~3 ms when the workers keep both cores
busy, plus the write-ahead record every mutating step of ours gets). For a branch stored the
plain way, what that command changes is small and fixed:

- the loose ref file ``<common dir>/refs/heads/<name>`` goes, through ``<name>.lock`` (the
  lock every git takes before it changes the ref), and so does its reflog
  ``<common dir>/logs/refs/heads/<name>``;
- the folders that held them go too once empty (``refs/heads/bmad-loop/<run>/`` after the
  run's last branch), as git removes them;
- git also removes a ``[branch "<name>"]`` section from the repository's ``config`` (an
  agent's ``push -u`` writes one) and refuses a branch that a worktree has checked out, or is
  rebasing or bisecting.

`delete_loose_branch` does this only when nothing else is involved: the files ref backend (no
``reftable``), a loose ref holding one full object name and no line for it in
``packed-refs`` (removing one means rewriting that file), no worktree's ``HEAD`` naming it, no
worktree in the middle of a rebase or a bisect, and no mention of the name in the
repository's ``config``. Anything else answers False and the caller runs ``git branch -D``,
which knows every case. Callers hold `gitcmd.repo_lock`, as they do around git's command.
"""

from __future__ import annotations

import os
import re

from .refnames import branch_name_ok
from .refread import UNKNOWN, read_git_file

__all__ = ["delete_loose_branch"]

_SHA = re.compile(rb"(?:[0-9a-f]{40}|[0-9a-f]{64})\n?")
# What a worktree in the middle of a rebase or a bisect keeps: git then counts the branch as
# checked out there even though HEAD is detached.
_BUSY = ("rebase-merge", "rebase-apply", "BISECT_START")

# Test seam: called with the ref file's path once its lock is held.
_after_lock = None


def delete_loose_branch(common_dir, name: str) -> bool:
    """Delete branch `name` of the repository whose git common dir is `common_dir`; True when
    it was done here, False when git must do it: nothing was changed then, or the loose ref
    is gone but a copy a concurrent ``git pack-refs`` made is left for git to delete."""
    if not branch_name_ok(name):
        return False
    common = os.fspath(common_dir)
    if os.path.isdir(os.path.join(common, "reftable")):
        return False
    ref = f"refs/heads/{name}"
    path = os.path.join(common, *ref.split("/"))
    held = read_git_file(path)
    if held is None or held is UNKNOWN or not _SHA.fullmatch(held):
        return False  # absent, a folder, a symbolic ref or unreadable: git's to judge
    if _packed(common, ref) or _in_use(common, ref) or _configured(common, name):
        return False
    lock = f"{path}.lock"
    try:
        os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError:
        return False  # another git holds it (or it cannot be made): git waits or says why
    try:
        if _after_lock is not None:
            _after_lock(path)
        if read_git_file(path) != held:
            return False  # moved before the lock was taken
        os.unlink(path)
    finally:
        os.unlink(lock)
    if _packed(common, ref):
        # A `git pack-refs` that ran meanwhile (it does not take our lock first) copied the ref
        # into packed-refs: git deletes that copy, and the log and folders with it.
        return False
    log = os.path.join(common, "logs", *ref.split("/"))
    try:
        os.unlink(log)
    except FileNotFoundError:
        pass
    _remove_empty_parents(path, os.path.join(common, "refs", "heads"))
    _remove_empty_parents(log, os.path.join(common, "logs", "refs", "heads"))
    return True


def _packed(common: str, ref: str) -> bool:
    """Does ``packed-refs`` hold `ref` (or can it not be read)?"""
    try:
        with open(os.path.join(common, "packed-refs"), "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return (b" " + ref.encode("utf-8", "surrogateescape") + b"\n") in data + b"\n"


def _in_use(common: str, ref: str) -> bool:
    """Is `ref` the HEAD of the main worktree or of a linked one, or is any worktree rebasing
    or bisecting? Unsure (an unreadable HEAD) counts as yes."""
    admins = [common]
    try:
        admins += [os.path.join(common, "worktrees", entry)
                   for entry in os.listdir(os.path.join(common, "worktrees"))]
    except FileNotFoundError:
        pass
    except OSError:
        return True
    wanted = f"ref: {ref}".encode("utf-8", "surrogateescape")
    for admin in admins:
        head = read_git_file(os.path.join(admin, "HEAD"))
        if head is None or head is UNKNOWN or head.strip() == wanted:
            return True
        if any(os.path.lexists(os.path.join(admin, busy)) for busy in _BUSY):
            return True
    return False


def _configured(common: str, name: str) -> bool:
    """Does the repository's ``config`` mention the branch (a ``[branch "<name>"]`` section
    git would remove with it)? Unsure counts as yes."""
    try:
        with open(os.path.join(common, "config"), "rb") as handle:
            return name.encode("utf-8", "surrogateescape") in handle.read()
    except FileNotFoundError:
        return False
    except OSError:
        return True


def _remove_empty_parents(path: str, stop: str) -> None:
    """Remove the folders above `path` that are empty now, up to (not including) `stop`."""
    folder = os.path.dirname(path)
    stop = os.path.normpath(stop)
    while os.path.normpath(folder) != stop and folder.startswith(stop + os.sep):
        try:
            os.rmdir(folder)
        except FileNotFoundError:
            pass
        except OSError:
            return  # not empty (another branch lives there), or not ours to remove
        folder = os.path.dirname(folder)
