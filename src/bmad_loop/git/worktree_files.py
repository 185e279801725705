"""Registering, moving and detaching linked worktrees by editing git's files, without git.

The worktree pool moves a worktree twice per story (park, take) and detaches its HEAD once; as
git processes that is three starts (~2 ms each here, more with the write-ahead record every
mutating step gets) on the path between one story's end and the next one's start, and a new
story worktree's ``worktree add --no-checkout -b`` is three more (it starts ``git branch`` and
``git symbolic-ref`` itself), one after another under the repository lock when the first
stories of a run start together. What those commands change is small and fixed:

- ``git worktree move A B`` renames the folder and rewrites one file, the admin entry's
  ``gitdir`` (``<common dir>/worktrees/<id>/gitdir``), to the new ``<B>/.git`` (git writes the
  real path, symlinks resolved). The worktree's own ``.git`` file names the admin entry and
  does not change. git refuses a locked worktree, the main one, and a destination that exists.
- ``git update-ref --no-deref HEAD HEAD`` in a worktree replaces ``<admin>/HEAD``
  (``ref: refs/heads/<b>``) with the commit the branch names, through ``HEAD.lock`` and a rename.
- ``git worktree add --no-checkout --lock --reason R -b <b> <path> <sha>`` makes the branch
  (``git branch``: the ref and its log, "branch: Created from <sha>"), then the admin entry
  ``worktrees/<name>`` (``<name>1``, ``<name>2``… when taken) holding ``locked`` (R), ``gitdir``,
  ``commondir`` (``../..``), ``HEAD`` (``ref: refs/heads/<b>``) and ``logs/HEAD`` (the branch
  log's line without its message), and the folder with its ``.git`` file naming the entry.
  Here the branch is one ``update-ref`` with that message, and the rest file writes.
- ``git worktree add --detach --no-checkout --lock --reason R <path> <sha>`` (the lane's
  candidate worktrees) writes the same entry with ``HEAD`` holding ``<sha>``, through a ``git
  update-ref`` it starts itself; here it is file writes only.

All three are done here only for the plain layout every git writes by default: absolute paths in
the ``.git`` file and in ``gitdir`` (git 2.48's ``worktree.useRelativePaths`` writes relative
ones, which a move would have to rewrite on both sides), no ``locked`` file (moves), no submodule
repositories in the admin entry, and for a registration a plain folder name and a configuration
that asks ``worktree add`` for nothing more (no sparse checkout, whose patterns it copies, no
repository extension: per-worktree configuration, which it copies too, or a reftable ref
store). Anything else answers False, and the caller runs git, which knows every layout. Callers
hold `gitcmd.repo_lock`, as they do around git's own command.

A crash between the rename and the ``gitdir`` write leaves what a killed ``git worktree move``
leaves: a registration naming the old path; the pool then finds no usable worktree there and
``bmad-loop cleanup`` removes it. A crash part way through a registration leaves what a killed
``git worktree add`` leaves: a half-made entry, locked ``initializing``, which the next
``ensure_worktree`` for that path discards and makes again.
"""

from __future__ import annotations

import os
import re
import shutil

from ..errors import GitError
from .runner import is_full_sha

__all__ = ["rename_linked_worktree", "detach_head", "register_new_worktree", "registrable",
           "register_detached_worktree", "register_linked_worktree"]

# A worktree's admin entry is named after its folder; git turns a name that is not a plain
# refname component into one (`sanitize_refname_component`): such names are left to git.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


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
    if any(os.path.lexists(os.path.join(admin, name)) for name in ("locked", "modules")):
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
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                     0o666)
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


# Settings that make `worktree add` copy or write more than the plain registration: sparse-
# checkout patterns copied over, relative links (git 2.48), and any repository extension
# (per-worktree configuration, which git copies too, and the reftable ref store among them).
_ADD_DOES_MORE = ("core.sparsecheckout", "core.sparsecheckoutcone", "worktree.userelativepaths")


def register_new_worktree(git, path, branch: str, start_sha: str, reason: str,
                          settings) -> bool:
    """What ``worktree add --no-checkout --lock --reason <reason> -b <branch> <path>
    <start_sha>`` does, with one git process instead of three (``worktree add`` starts ``git
    branch`` and ``git symbolic-ref`` itself): the branch by ``update-ref`` with the reflog
    message ``git branch`` writes, then `register_linked_worktree`. False, nothing done, where
    git must do it (`registrable`; `settings`: the repository's configuration entries, read by
    the caller before it took `gitcmd.repo_lock`, None when unknown); a GitError when the
    branch could not be made (it exists) or the registration failed part way."""
    common = git.common_dir()
    if not registrable(common, path, settings):
        return False
    git.run("update-ref", "-m", f"branch: Created from {start_sha}", f"refs/heads/{branch}",
            start_sha, "0" * len(start_sha))
    _register(common, path, branch, reason)
    return True


def register_detached_worktree(git, path, sha: str, reason: str, settings) -> bool:
    """What ``worktree add --detach --no-checkout --lock --reason <reason> <path> <sha>`` does,
    without git (which starts ``git update-ref`` itself for the HEAD): `register_linked_worktree`
    with HEAD at `sha` itself, and no HEAD log (git's has one line without a message, which
    nothing reads). False, nothing done, where git must do it (`registrable`); a GitError when
    the registration failed part way."""
    common = git.common_dir()
    if not (is_full_sha(sha) and registrable(common, path, settings)):
        return False
    _register(common, path, None, reason, head=sha)
    return True


def _register(common, path, branch: str | None, reason: str, *, head: str | None = None) -> None:
    """`register_linked_worktree`, a refusal part way said as a GitError (what `worktree add`
    failing would raise), so callers fall back to git's careful way."""
    try:
        register_linked_worktree(common, path, branch, reason, head=head)
    except OSError as exc:
        raise GitError(f"cannot register the worktree {path}: {exc}") from exc


def registrable(common_dir, path, config_entries) -> bool:
    """Can `register_linked_worktree` make a worktree at `path`? No when `path` exists or its
    name is not a plain one, the repository is a reftable one, or its configuration
    (`config_entries`: (scope, origin, key, value), None when unknown) asks git for more."""
    name = os.path.basename(os.path.abspath(path))
    common = os.path.realpath(common_dir)
    if (config_entries is None or os.path.lexists(path) or not _PLAIN_NAME.fullmatch(name)
            or name.endswith(".lock") or os.path.isdir(os.path.join(common, "reftable"))
            or os.path.lexists(os.path.join(common, "info", "sparse-checkout"))):
        return False
    for _scope, _origin, key, value in config_entries:
        if key.startswith("extensions.") or (
                key in _ADD_DOES_MORE and value.strip().lower() not in ("false", "no", "off", "0")):
            return False
    return True


def register_linked_worktree(common_dir, path, branch: str | None, reason: str, *,
                             head: str | None = None) -> None:
    """Register a new linked worktree at `path` on `branch` (which must exist), or with `branch`
    None detached at `head`, locked with `reason`, without checking anything out: what ``git
    worktree add --no-checkout --lock --reason <reason> <path> <branch>`` writes. Only where
    `registrable` says so; the caller holds `gitcmd.repo_lock`. An OSError part way takes back
    what was made and is raised; only a kill part way leaves a half-made worktree, locked, as a
    killed ``git worktree add`` does.

    The order is git's: the admin entry (``worktrees/<name>``, or ``<name>1``, ``<name>2``…
    when taken) with its ``locked`` file first, so no ``worktree prune`` removes it half-made,
    then the folder and the two links, ``commondir`` and ``HEAD``."""
    path = os.path.abspath(path)
    name = os.path.basename(path)
    worktrees = os.path.join(os.path.realpath(common_dir), "worktrees")
    os.makedirs(worktrees, exist_ok=True)
    admin, counter = os.path.join(worktrees, name), 0
    while True:
        try:
            os.mkdir(admin)
            break
        except FileExistsError:
            counter += 1
            admin = os.path.join(worktrees, f"{name}{counter}")
    made = False
    try:
        _write(os.path.join(admin, "locked"), reason + "\n")
        os.makedirs(path)
        made = True
        _write(os.path.join(admin, "gitdir"), os.path.join(os.path.realpath(path), ".git") + "\n")
        _write(os.path.join(path, ".git"), f"gitdir: {admin}\n")
        _write(os.path.join(admin, "commondir"), "../..\n")
        _write(os.path.join(admin, "HEAD"),
               f"ref: refs/heads/{branch}\n" if branch else f"{head}\n")
    except OSError:
        # A write refused (a full disk, a permission): take back what was made, so no locked
        # entry without a worktree is left that no `worktree prune` would ever remove.
        shutil.rmtree(admin, ignore_errors=True)
        if made:  # (a folder someone else put there meanwhile is theirs)
            shutil.rmtree(path, ignore_errors=True)
        raise
    if not branch:
        return
    # git logs HEAD's creation in the worktree as it logged the branch's (same identity and
    # time, no message); where the branch has no log (core.logAllRefUpdates off) neither has HEAD.
    created = _creation_entry(os.path.join(os.path.realpath(common_dir), "logs", "refs", "heads",
                                           *branch.split("/")))
    if created is not None:
        os.makedirs(os.path.join(admin, "logs"), exist_ok=True)
        _write(os.path.join(admin, "logs", "HEAD"), created + "\n")


def _creation_entry(log: str) -> str | None:
    """The branch log's creation line (``0…0 <sha> <identity> <time> <zone>``) without its
    message; None when there is none."""
    lines = (_read(log) or "").splitlines()
    if len(lines) != 1 or not re.match(r"0{40}(?:0{24})? [0-9a-f]{40}", lines[0]):
        return None
    return lines[0].split("\t", 1)[0]


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
