"""Worktrees and branches of one repository: made and removed idempotently, and kept clean.

Every mutation here (worktree add/remove/prune, branch create/delete, ref delete; a new
worktree's checkout aside, see below) runs under `repo_lock`, and the ``worktree list`` read is
kept apart from them (`locked_read`, which creates no lock file): concurrent ``git worktree add``
in one repository fails intermittently otherwise (the branch is created even when the add
fails), and ``worktree list`` fails when it meets an add half way through.

Every ``ensure_*`` function can be re-run after a crash at any point: a half-made worktree — a
folder without ``.git``, a registration whose folder is gone, or a checkout still marked
``locked initializing`` because ``worktree add`` was killed — is removed properly (unlock,
``worktree remove -f -f``, remove the folder, ``prune``) and made again. A complete worktree is
never thrown away by an ``ensure_*`` call: one on another branch raises `GitError` instead, so a
kept (escalated) worktree cannot lose a human's edits by accident.

Everything here is done by git's own commands: bmad-loop never edits or reads a worktree's
admin entry (``<common dir>/worktrees/<id>``) itself. Each operation lists the worktrees at
most once and reuses the listing, creates a missing branch with the ``worktree add -b`` that
registers it, trusts a full SHA it is given instead of re-reading it, and prunes only when a
removal left something behind.

A new story's worktree (the quick path of `ensure_worktree`) holds the lock only to register:
the branch and the admin entry, no files (``worktree add --no-checkout --lock --reason
initializing -b``). The checkout (``read-tree -u --reset HEAD``: the worktree's own index and files, no ref) runs
without the lock, so the first stories of a run check out side by side instead of one after
another; then the ``locked`` file is removed, under the lock again, since
``worktree list`` dies when a ``locked`` file it saw vanishes before it reads it. Until then the
entry is half-made by the rule above: a crash in between is discarded and made again by the next
``ensure_worktree``, never used empty, and ``worktree prune`` (ours or any git's) leaves a
locked entry alone. Nothing discards another story's add in progress: what discards half-made
worktrees does so for one path or one branch, a story's own (one worker holds a story at a time,
one lane a run's candidates); orphan clean-up (engine/run/cleanup.py) decides by ownership, and
every unfinished story of a live run owns its worktree path and branch whether a row names them
yet or not. A pinned ``post-checkout`` hook (``[scm] run_hooks``) keeps the single ``worktree
add``: it runs on that checkout only. A new candidate worktree (`ensure_detached_worktree`) is
made the same way.

Upkeep of a worktree in use is here too. `make_exact` makes an existing worktree exactly one
commit's tree, with git's own commands: a plain ``read-tree <sha>`` drops every index flag
(skip-worktree, assume-unchanged and intent-to-add, which ``checkout -f`` and ``reset --hard``
keep, and with them an edit hidden from git); ``checkout --detach -f <sha>`` writes the files
that index names; ``clean -ffdx`` removes untracked and ignored files. What ran in the worktree
before (a verification a crash cut short) leaves nothing a later one could see.

An agent can run ``git update-index --skip-worktree <path>`` or ``--assume-unchanged <path>``
in its worktree: from then on ``status``, ``diff`` and ``add -A`` treat that file as unchanged,
whatever it holds. Left alone, the story's commit would drop the agent's edit of the file, and
a reused worktree would hand the flag (and the hidden edit) to the next story. `flagged` reads
those flags (``ls-files -v``: ``S``/``s`` skip-worktree, a lower-case tag assume-unchanged);
`clear_flags` takes them off the paths that carry them (``update-index``, one process per kind,
since git applies one such option per call), so the index keeps its stat data and the next
``add -A`` looks at those files again.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GitError
from .locks import locked_read, repo_lock
from .runner import Git, branch_name_ok, is_full_sha

__all__ = [
    "WorktreeInfo", "list_worktrees", "checkout_of", "ensure_worktree", "ensure_detached_worktree",
    "worktree_at", "move_worktree", "remove_worktree", "delete_branch", "delete_ref", "prune",
    "is_full_sha", "remove_tree", "make_exact", "Flagged", "flagged", "clear_flags",
]

_ZERO_SHA = "0" * 40
_INITIALIZING = "initializing"
_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}


@dataclass(frozen=True)
class WorktreeInfo:
    """One entry of ``git worktree list --porcelain``."""

    path: Path
    head: str | None
    branch: str | None  # short name, without refs/heads/
    detached: bool
    locked: bool
    prunable: bool
    bare: bool
    lock_reason: str = ""

    @property
    def half_made(self) -> bool:
        """Registered but not a usable checkout: folder or its .git gone, or an interrupted add."""
        if self.bare:
            return False
        return (
            self.prunable
            or (self.locked and self.lock_reason == _INITIALIZING)
            or not (self.path / ".git").exists()
        )


def list_worktrees(git: Git) -> list[WorktreeInfo]:
    """Every registered worktree, the main one first (parses ``worktree list --porcelain -z``).

    Kept apart from the mutations (`locked_read`): ``worktree list`` fails ("failed to read
    .../commondir") when it meets a ``worktree add`` half way through.
    """
    raw = locked_read(git, lambda: git.run("worktree", "list", "--porcelain", "-z").stdout)
    infos: list[WorktreeInfo] = []
    record: dict[str, str] = {}
    for item in raw.split("\0"):
        if item == "":
            if record:
                infos.append(_info(record))
                record = {}
            continue
        key, _, value = item.partition(" ")
        record[key] = value
    if record:
        infos.append(_info(record))
    return infos


def _info(record: dict[str, str]) -> WorktreeInfo:
    head = record.get("HEAD") or None
    branch = record.get("branch")
    return WorktreeInfo(
        path=Path(record["worktree"]),
        head=None if head in (None, _ZERO_SHA) else head,
        branch=branch.removeprefix("refs/heads/") if branch else None,
        detached="detached" in record,
        locked="locked" in record,
        prunable="prunable" in record,
        bare="bare" in record,
        lock_reason=record.get("locked", ""),
    )


def checkout_of(git: Git, branch: str) -> Path | None:
    """The worktree where `branch` is checked out (a half-made registration does not count)."""
    name = branch.removeprefix("refs/heads/")
    for info in list_worktrees(git):
        if info.branch == name and not info.half_made:
            return info.path
    return None


_UNKNOWN = "unknown"  # `branch_head` not given: ensure_worktree reads it


def ensure_worktree(git: Git, path: Path, branch: str, start_sha: str, *,
                    branch_head: str | None = _UNKNOWN) -> str:
    """Make `path` a worktree on `branch`, creating the branch at `start_sha` if it is absent.

    Idempotent: an existing worktree on that branch at `path` is reused as it is (an existing
    branch is never moved). A half-made one is removed and made again. Returns the branch head.
    `branch_head`: the caller's reading of the branch; None (absent) with nothing at `path`
    allows the quick path (``worktree add -b`` without checkout under the lock, the checkout
    outside it: see the module docstring); any other case reads the branch itself.
    """
    if not branch_name_ok(branch):
        raise GitError(f"git refuses {branch!r} as a branch name")
    path = _abs(path)
    with repo_lock(git):
        if not (branch_head is None and is_full_sha(start_sha) and not os.path.lexists(path)):
            return _ensure_carefully(git, path, branch, start_sha)
        # The common case, a new story: no branch, nothing at `path`. A branch that does not
        # exist is checked out nowhere, so no listing is needed; should git still refuse (a
        # registration whose folder is gone, say), the careful way finds out why.
        apart = _checkout_apart(git)
        try:
            _add(git, path, branch, new_branch_at=start_sha, checkout=not apart)
        except GitError:
            return _ensure_carefully(git, path, branch, start_sha)
    if apart:
        _populate(git, path)
    return start_sha


def _ensure_carefully(git: Git, path: Path, branch: str, start_sha: str) -> str:
    """`ensure_worktree` the rare way (caller holds the lock): list, repair, check, add."""
    ref = f"refs/heads/{branch}"
    listing = list_worktrees(git)
    info = _find_in(listing, path)
    if info is not None and not info.half_made:
        if info.branch == branch:
            return info.head or _rev_or_fail(git, ref)
        where = f"branch {info.branch}" if info.branch else f"detached at {info.head}"
        raise GitError(f"{path} is already a worktree on {where}, not on {branch}")
    if info is not None or os.path.lexists(path):
        _discard(git, path, info, listing)
        listing = list_worktrees(git)
    _free_branch(git, branch, path, listing)
    head = git.rev(ref)  # the careful way reads it again: the rare path, so be sure
    if head is None:
        # One process makes the branch and checks it out (`worktree add -b`).
        _add(git, path, branch, new_branch_at=start_sha)
        return start_sha if is_full_sha(start_sha) else _rev_or_fail(git, ref)
    _add(git, path, branch)
    return head


def ensure_detached_worktree(git: Git, path: Path, sha: str) -> None:
    """Make `path` a worktree with a detached HEAD at `sha` (candidate worktrees).

    Idempotent: an existing detached worktree at `path` is reused, made exactly `sha`'s tree
    first, at the same commit too (`make_exact`: a verification must see nothing an
    earlier one left); one git cannot make so is removed and made again, as a half-made one is.
    A new one is registered under the lock and checked out without it, as a new story's is.
    """
    path = _abs(path)
    with repo_lock(git):
        apart = _checkout_apart(git)
        listing = list_worktrees(git)
        info = _find_in(listing, path)
        if info is not None and not info.half_made:
            if not info.detached:
                raise GitError(f"{path} is a worktree on branch {info.branch}, not detached")
            if make_exact(git, path, sha):
                return
        if info is not None or os.path.lexists(path):
            _discard(git, path, info, listing)
        _add(git, path, sha, detach=True, checkout=not apart)
    if apart:
        _populate(git, path)


def worktree_at(git: Git, path: Path) -> WorktreeInfo | None:
    """The linked worktree of this repository at `path`, as ``worktree list`` tells it; None
    for the main checkout, a plain folder or another repository's worktree."""
    listing = list_worktrees(git)
    info = _find_in(listing[1:], _abs(path))
    return None if info is None or info.bare else info


def move_worktree(git: Git, source: Path, dest: Path) -> None:
    """``worktree move`` `source` to `dest` (a path that must not exist yet): the folder is
    renamed and git's registration follows it, so nothing is checked out again."""
    source, dest = _abs(source), _abs(dest)
    with repo_lock(git):
        dest.parent.mkdir(parents=True, exist_ok=True)
        git.run("worktree", "move", source, dest)


def remove_worktree(git: Git, path: Path) -> None:
    """Remove the worktree at `path`, its folder and its registration. Missing is fine."""
    path = _abs(path)
    with repo_lock(git):
        if os.path.lexists(path):
            # git refuses to remove the main worktree or a folder that is not one of its
            # worktrees; a linked one goes with one `worktree remove`.
            proc = git.run("worktree", "remove", "-f", "-f", path, check=False)
            if proc.returncode == 0 and not os.path.lexists(path):
                return
        listing = list_worktrees(git)
        info = _find_in(listing, path)
        if info is not None and (info.bare or _same(listing[0].path, info.path)):
            raise GitError(f"refusing to remove the main worktree {path}")
        _discard(git, path, info, listing)


def delete_branch(git: Git, name: str) -> None:
    """Delete branch `name`. Missing is fine; a branch checked out in a live worktree is an error.

    ``branch -D`` refuses a branch checked out in any worktree, even a stale one: when it does,
    stale registrations are pruned, half-made checkouts of the branch removed, and it runs again.
    """
    name = name.removeprefix("refs/heads/")
    with repo_lock(git):
        proc = git.run("branch", "-D", "--", name, check=False)
        if proc.returncode == 0:
            return
        _prune(git)
        listing = list_worktrees(git)
        for info in listing:
            if info.branch == name and info.half_made and not _same(listing[0].path, info.path):
                _discard(git, info.path, info, listing)
        proc = git.run("branch", "-D", "--", name, check=False)
        if proc.returncode != 0 and git.rev(f"refs/heads/{name}") is not None:
            raise GitError(
                f"cannot delete branch {name}: {proc.stderr.strip()}",
                returncode=proc.returncode,
                stderr=proc.stderr,
            )


def delete_ref(git: Git, ref: str) -> None:
    """Delete `ref` itself (never what a symbolic ref points to). Missing is fine."""
    with repo_lock(git):
        git.run("update-ref", "--no-deref", "-d", ref)


def prune(git: Git) -> None:
    """``git worktree prune`` under the repository lock."""
    with repo_lock(git):
        _prune(git)


# -- internals (callers hold the lock) ---------------------------------------------------------


def _prune(git: Git) -> None:
    git.run("worktree", "prune")


def _abs(path: Path) -> Path:
    return Path(os.path.abspath(os.fspath(path)))


def _same(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def _find(git: Git, path: Path) -> WorktreeInfo | None:
    return _find_in(list_worktrees(git), path)


def _find_in(listing: list[WorktreeInfo], path: Path) -> WorktreeInfo | None:
    for info in listing:
        if _same(info.path, path):
            return info
    return None


def _rev_or_fail(git: Git, ref: str) -> str:
    sha = git.rev(ref)
    if sha is None:
        raise GitError(f"{ref} vanished while its worktree was being made")
    return sha


def _add(git: Git, path: Path, what: str, *, detach: bool = False,
         new_branch_at: str | None = None, checkout: bool = True) -> None:
    """``worktree add`` of `what` (a branch, or with `detach` a commit); with `new_branch_at`,
    `what` is a branch to create there (``-b``). Without `checkout`, only the registration and
    the branch: no index, no files, and the entry stays locked ``initializing`` (`_populate`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = ["worktree", "add", "--quiet"] + (["--detach"] if detach else [])
    if not checkout:
        argv += ["--no-checkout", "--lock", "--reason", _INITIALIZING]
    where = os.fspath(path)
    argv += ["--no-track", "-b", what, where, new_branch_at] if new_branch_at else [where, what]
    try:
        git.run(*argv)
    except GitError:
        info = _find(git, path)
        if info is not None or os.path.lexists(path):
            _discard(git, path, info)
        raise


def _checkout_apart(git: Git) -> bool:
    """Register first and check out without the lock? Not when a pinned ``post-checkout`` hook
    must run: git runs it on `worktree add`'s own checkout only."""
    return "post-checkout" not in git.run_hooks


# Test seam: called with the path between registration and checkout, outside the lock.
_after_register: Callable[[Path], None] | None = None


def _populate(git: Git, path: Path) -> None:
    """Check out a worktree `_add` registered without a checkout, then unlock it. Runs without
    the repository lock, apart from the unlock: ``worktree list`` dies when a ``locked`` file
    it saw vanishes before it reads it. On failure the half-made worktree is discarded."""
    try:
        if _after_register is not None:
            _after_register(path)
        # Index and files only (no ref is written, unlike the `reset --hard` of git's own add).
        git.run("read-tree", "-u", "--reset", "--no-recurse-submodules", "HEAD", cwd=path)
        with repo_lock(git):
            git.run("worktree", "unlock", path)
    except Exception:
        with repo_lock(git):
            info = _find(git, path)
            if info is not None or os.path.lexists(path):
                _discard(git, path, info)
        raise


def _free_branch(git: Git, branch: str, path: Path, listing: list[WorktreeInfo]) -> None:
    """Make sure `branch` is not checked out anywhere but (possibly) `path`."""
    for info in listing:
        if info.branch != branch or _same(info.path, path):
            continue
        if info.half_made and not _same(listing[0].path, info.path):
            _discard(git, info.path, info, listing)
        else:
            raise GitError(f"branch {branch} is already checked out at {info.path}")


def _discard(git: Git, path: Path, info: WorktreeInfo | None,
             listing: list[WorktreeInfo] | None = None) -> None:
    """Remove whatever is at `path`: registration (even locked), folder, stale admin entries.

    A ``worktree remove`` that succeeds leaves nothing to prune; otherwise (a half-made entry
    git refuses to remove) the folder goes, ``prune`` drops the registration, and a listing
    checks that it is gone.
    """
    _guard(git, path, listing)
    removed = False
    if info is not None:
        if info.locked:
            git.run("worktree", "unlock", info.path, check=False)
        proc = git.run("worktree", "remove", "-f", "-f", info.path, check=False)
        removed = proc.returncode == 0
    if os.path.lexists(path):
        remove_tree(path)
    if info is None or removed:
        return
    _prune(git)
    if _find(git, path) is not None:
        raise GitError(f"could not remove the worktree registered at {path}")


def _guard(git: Git, path: Path, listing: list[WorktreeInfo] | None = None) -> None:
    """Never delete the main working tree, the git directory, or a folder containing either."""
    target = path.resolve()
    protected = [git.common_dir()]
    main = (listing or list_worktrees(git))[0]
    if not main.bare:
        protected.append(main.path.resolve())
    for p in protected:
        if p == target or target in p.parents:
            raise GitError(f"refusing to delete {path}: it holds the repository {p}")


def remove_tree(path: Path) -> None:
    """Remove a file, a symlink (never what it points to) or a folder, read-only ones too."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
        return
    try:
        shutil.rmtree(path)
    except OSError:
        # Read-only folders (a Go module cache, say): make everything writable, then retry.
        os.chmod(path, os.stat(path).st_mode | stat.S_IRWXU)
        for root, dirs, _files in os.walk(path):
            for d in dirs:
                p = os.path.join(root, d)
                if not os.path.islink(p):
                    os.chmod(p, os.stat(p).st_mode | stat.S_IRWXU)
        shutil.rmtree(path)


# -- upkeep of a worktree in use ---------------------------------------------------------------


def make_exact(git: Git, path: Path, sha: str) -> bool:
    """Make the worktree at `path` exactly `sha`'s tree, HEAD detached there; False when git
    could not (a read-only folder ``clean`` cannot empty): the caller makes it again."""
    try:
        git.run("read-tree", sha, cwd=path)
        git.run("checkout", "--quiet", "--detach", "-f", sha, cwd=path)
        git.run("clean", "-ffdxq", cwd=path)
    except GitError:
        return False
    return True


@dataclass(frozen=True)
class Flagged:
    """The paths of a worktree's index that carry a flag hiding their edits from git."""

    skip_worktree: list[str] = field(default_factory=list)
    assume_unchanged: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.skip_worktree or self.assume_unchanged)


def flagged(git: Git, worktree: Path) -> Flagged:
    """The index entries of `worktree` that carry skip-worktree or assume-unchanged."""
    out = git.run("ls-files", "-v", "-z", cwd=worktree).stdout
    skip: list[str] = []
    assume: list[str] = []
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
