"""Moving a linked worktree and detaching its HEAD by editing git's files, without starting git.

The worktree pool moves a worktree twice per story (park, take) and detaches its HEAD once; as
git processes that is three starts (~2 ms each here, more with the write-ahead record every
mutating step gets) on the path between one story's end and the next one's start. What those
commands change is small and fixed:

- ``git worktree move A B`` renames the folder and rewrites one file, the admin entry's
  ``gitdir`` (``<common dir>/worktrees/<id>/gitdir``), to the new ``<B>/.git`` (git writes the
  real path, symlinks resolved). The worktree's own ``.git`` file names the admin entry and
  does not change. git refuses a locked worktree, the main one, and a destination that exists.
- ``git update-ref --no-deref HEAD HEAD`` in a worktree replaces ``<admin>/HEAD``
  (``ref: refs/heads/<b>``) with the commit the branch names, through ``HEAD.lock`` and a rename.

Both are done here only for the plain layout every git writes by default: absolute paths in the
``.git`` file and in ``gitdir`` (git 2.48's ``worktree.useRelativePaths`` writes relative ones,
which a move would have to rewrite on both sides), no ``locked`` file, no submodule
repositories in the admin entry. Anything else answers False, and the caller runs git, which
knows every layout. Callers hold `gitcmd.repo_lock`, as they do around git's own command.

A crash between the rename and the ``gitdir`` write leaves what a killed ``git worktree move``
leaves: a registration naming the old path; the pool then finds no usable worktree there and
``bmad-loop cleanup`` removes it.
"""

from __future__ import annotations

import os

from bmad_loop.gitcmd import is_full_sha

__all__ = ["rename_linked_worktree", "detach_head"]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def _replace(path: str, text: str) -> None:
    """Write `path` whole or not at all (a temporary file beside it, then a rename)."""
    tmp = f"{path}.bmad-loop.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _admin_of(worktree: str, common_dir: str) -> str | None:
    """The admin entry the worktree's ``.git`` file names, if it is absolute and one of
    `common_dir`'s; None otherwise."""
    text = _read(os.path.join(worktree, ".git"))
    if text is None or not text.startswith("gitdir:"):
        return None
    admin = text[len("gitdir:"):].strip()
    if not os.path.isabs(admin):
        return None
    worktrees = os.path.join(os.path.realpath(common_dir), "worktrees")
    if os.path.dirname(os.path.realpath(admin)) != worktrees or not os.path.isdir(admin):
        return None
    return admin


def rename_linked_worktree(source, dest, common_dir) -> bool:
    """Move the linked worktree at `source` to `dest` (absent, its folder made) as ``git
    worktree move`` would; False, with nothing changed, when the layout is not the plain one."""
    source, dest = os.path.abspath(source), os.path.abspath(dest)
    admin = _admin_of(source, common_dir)
    if admin is None or os.path.lexists(dest) or os.path.islink(source):
        return False
    if os.path.lexists(os.path.join(admin, "locked")) or os.path.lexists(os.path.join(admin, "modules")):
        return False
    registered = (_read(os.path.join(admin, "gitdir")) or "").strip()
    if not os.path.isabs(registered) or os.path.realpath(registered) != os.path.realpath(
            os.path.join(source, ".git")):
        return False
    os.rename(source, dest)
    _replace(os.path.join(admin, "gitdir"), os.path.join(os.path.realpath(dest), ".git") + "\n")
    return True


def detach_head(admin, sha: str) -> bool:
    """Point the worktree's HEAD (admin entry `admin`) at `sha` itself instead of a branch, as
    ``update-ref --no-deref HEAD <sha>`` does; False when HEAD's lock is taken (someone is
    writing it: leave it to them) or `sha` is not a full object name."""
    if not is_full_sha(sha):
        return False
    head = os.path.join(admin, "HEAD")
    lock = head + ".lock"
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(sha + "\n")
        os.replace(lock, head)
    except BaseException:
        try:
            os.unlink(lock)
        except OSError:
            pass
        raise
    return True
