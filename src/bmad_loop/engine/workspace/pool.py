"""A run's pool of parked worktrees: a landed story's worktree serves the next new story.

Removing a worktree and checking out the next one costs a full checkout (0.2–1.3 s for 2,000
files on a slow disk); switching a kept worktree to the next story's branch rewrites only the
files that differ. So, in local worktree isolation with one branch per story, the lane *parks*
an integrated story's worktree instead of removing it, and the worker of the next new story
*takes* it.

- **Park** (the lane, after integration; `park`): only when nothing of the story can be lost
  and nothing of it can leak. The worktree is a linked worktree of this repository at the
  run's own story path, still on the story's branch (not detached: no rebase or bisect under
  way), not locked (``worktree list``); `git status` reports it clean (seed files aside: no
  half-done merge or cherry-pick with changes); no per-worktree ``config.worktree`` an agent
  could have planted (its path from ``rev-parse --git-path``, read as the configuration
  fingerprint reads it) and no per-worktree refs (``for-each-ref refs/worktree/
  refs/bisect/``). Then its HEAD is detached (``update-ref --no-deref``, so the branch can be
  deleted) and ``worktree move`` puts it at ``worktrees/<run>/.pool/<n>``, n from 1 to the
  pool's size. Otherwise, or when the pool is full, the caller removes it as before.
- **Take** (the worker, preparing a story that has no branch yet; `take`): ``worktree move``
  of the first parked worktree to the story's path; its HEAD's reflog emptied (the last story's
  history); a plain ``read-tree <base>`` when its index
  carries a flag an agent set (skip-worktree, assume-unchanged: ``reset --hard`` and ``checkout
  -f`` keep them, and with them an edit hidden from git); ``clean -ffdx`` (ignored build output
  of the last story must not reach the next agent), with ``-e /<glob>`` for each ``[scm]
  reuse_keep`` folder; then ``checkout -f --no-track -b <branch> <base>``, which makes the
  branch, leaves exactly the base's tree and drops what a merge or cherry-pick left behind. A kept folder that the new tree does not ignore,
  or that is a symlink, is removed then. A taken worktree is thus indistinguishable from a new
  one, the kept folders aside. Any failure removes
  that worktree and says no, and the caller makes the worktree with ``worktree add`` as before:
  the pool never fails a story. Cleaning before the checkout means an interrupted take leaves
  either a parked worktree, a detached one at the story's path (no branch yet: `prepare`
  removes it, `clear_interrupted_take`), or a finished one.
- **Drain** (the lane, when the run completes, pauses or stops; `drain_pool`): once the parks
  announced in this process are done (one that landed after the drain would outlive the run),
  every parked worktree is removed, so a settled run leaves no worktree behind. ``bmad-loop
  cleanup`` removes the parked worktrees of runs that are not live (a crash between park and
  take).

Choosing and moving a parked worktree happen under the repository lock (`git.repolock.repo_lock`),
as ``worktree add`` and ``remove`` do, so two workers never take the same one and a take never
meets a park half way. ``.pool`` begins with a dot, which git refuses at the start of a branch
name component, so no story key (a branch name's last component) can ever be that folder.

The pool holds at most ``[scm] max_parallel`` worktrees (at most that many stories start at
once, so more would only wait); ``BMAD_LOOP_WORKTREE_POOL=<n>`` in the environment of the
consumers sets another size, and 0 turns reuse off (as ``[scm] reuse_worktrees = false`` does).

**Landed stories' worktrees on a story host** (remote mode): this host's worktrees of the
stories that landed are removed by `sweep_landed`. The lane runs in another clone there and
cannot reach them; the story host sweeps its own after each story task.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from sqlalchemy import select

from ...errors import GitError
from ...git.locks import repo_lock
from ...git.runner import run_deferred_maintenance
from ...git.worktrees import flagged
from ...git.worktrees import (
    delete_branch,
    list_worktrees,
    move_worktree,
    remove_tree,
    remove_worktree,
    worktree_at,
)
from ...git.runner import Git
from ...policy import Policy, ScmPolicy
from ...db.models import Run, Story
from ...states import StoryState
from ..runpaths import Layout
from ..runrows import run_policy

if TYPE_CHECKING:
    from ..project import Project

__all__ = ["POOL_DIR", "POOL_ENV", "pool_dir", "pool_size", "parked", "park", "take",
           "announce_park", "drain_pool", "drain_run_pool", "clear_interrupted_take",
           "sweep_landed"]


log = logging.getLogger(__name__)

POOL_DIR = ".pool"
POOL_ENV = "BMAD_LOOP_WORKTREE_POOL"

# The untracked files every worktree gets, or a callable that lists them on first use.
Seeds = Iterable[str] | Callable[[], Iterable[str]]


def pool_dir(layout: Layout) -> Path:
    """``<state>/worktrees/<run>/.pool``: beside the run's story worktrees."""
    return layout.state_dir / "worktrees" / layout.run_id / POOL_DIR


def pool_size(scm: ScmPolicy) -> int:
    """How many worktrees a run may keep parked: ``[scm] max_parallel``, or
    ``BMAD_LOOP_WORKTREE_POOL``; none with ``[scm] reuse_worktrees = false``."""
    if not scm.reuse_worktrees:
        return 0
    max_parallel = scm.max_parallel
    raw = os.environ.get(POOL_ENV, "").strip()
    if not raw:
        return max_parallel
    try:
        return max(0, int(raw))
    except ValueError:
        log.warning("%s=%r is not a number; the pool holds %d", POOL_ENV, raw, max_parallel)
        return max_parallel


def parked(layout: Layout) -> list[Path]:
    """The run's parked worktrees, in slot order (no git)."""
    folder = pool_dir(layout)
    try:
        names = [n for n in os.listdir(folder) if n.isdigit()]
    except OSError:
        return []
    return [folder / n for n in sorted(names, key=int)]


def park(git: Git, worktree: Path, branch: str, layout: Layout, *, size: int,
         seeds: Seeds = ()) -> Path | None:
    """Park the landed story's `worktree` (on `branch`) in the run's pool; its slot, or None
    when it is not safe to keep or the pool is full (the caller then removes it). Never raises
    for git's reasons: a failure is logged and answered None. `seeds` (or a callable giving
    them, asked only when the worktree holds untracked files) are the untracked files every
    worktree gets."""
    if size < 1:
        return None
    path = _abs(worktree)
    if path.parent != _abs(layout.state_dir / "worktrees" / layout.run_id) or path.name == POOL_DIR:
        return None  # not one of this run's story worktrees
    try:
        info = worktree_at(git, path)
        if info is None or info.locked or info.branch != branch or _own_state(git, path):
            return None
        if len(parked(layout)) >= size or not _clean(git, path, seeds):
            return None
        with repo_lock(git):
            slot = _free_slot(layout, size)
            if slot is None:
                return None
            # Detach without touching the index or files: HEAD takes the commit it names.
            git.run("update-ref", "--no-deref", "-m", "bmad-loop: park", "HEAD", "HEAD", cwd=path)
            move_worktree(git, path, slot)
        return slot
    except (GitError, OSError) as exc:
        log.warning("could not park %s (%s); it is removed instead", path, exc)
        return None


# Parks announced in this process and not finished yet. A story worker announces its park
# before it wakes the lane and parks right after, so the lane learns of the freed slot without
# waiting for the park; a story dispatched into that slot meanwhile waits for the park
# (`_await_park`) instead of checking out a whole new worktree beside it.
_parks = threading.Condition()
_announced = 0
# A park ends (parked or not) in a `finally` of the worker that announced it, so the wait ends
# with it; the bound only covers a park stuck in git (`status` of a huge checkout takes
# seconds, still less than the checkout the take would otherwise make).
PARK_WAIT_S = 30.0


def announce_park() -> Callable[[], None]:
    """Say a park is coming; call what this returns once it is done (parked or not)."""
    global _announced
    with _parks:
        _announced += 1
    ended = False

    def finished() -> None:
        global _announced
        nonlocal ended
        with _parks:  # ended once, however often (and from whichever thread) it is called
            if ended:
                return
            ended = True
            _announced -= 1
            _parks.notify_all()

    return finished


def _await_park(layout: Layout, wait_s: float) -> bool:
    """With the pool empty: wait while a park announced in this process is under way; True
    once a parked worktree is there."""
    return _await(lambda: parked(layout), wait_s)


def take(git: Git, layout: Layout, worktree: Path, branch: str, start_sha: str,
         keep: Iterable[str] = ()) -> bool:
    """Make `worktree` (nothing there yet) a checkout of `start_sha` on the new `branch` from a
    parked worktree, exactly what a new worktree would be but for the ignored `keep` folders
    ([scm] reuse_keep). False when the pool is empty (after waiting for a park announced in this
    process) or anything failed; then nothing is at `worktree` and `branch` was not made, and
    the caller adds a worktree as usual."""
    path = _abs(worktree)
    deadline = time.monotonic() + PARK_WAIT_S
    while True:
        if not parked(layout) and not _await_park(layout, deadline - time.monotonic()):
            return False  # the pool is empty and nothing is on its way (no lock, no git)
        with repo_lock(git):
            source = _first_usable(git, layout)
            if source is not None:
                try:
                    move_worktree(git, source, path)
                except (GitError, OSError) as exc:
                    log.warning("could not take parked worktree %s (%s); adding one instead",
                                source, exc)
                    _quietly_remove(git, source)
                    _quietly_remove(git, path)
                    return False
                break
        # Another take got there first (one park woke several), or what was parked is unfit:
        # wait again while parks announced in this process are still on their way.
    try:
        # Reset first: what the last story left goes before the branch exists, so a take cut
        # short here is a detached worktree prepare removes.
        _reset_for_next(git, path, start_sha, keep)
        # The last story's HEAD history goes (HEAD's reflog is the worktree's own).
        git.run("reflog", "expire", "--expire=all", "--expire-unreachable=all", "HEAD", cwd=path)
        with repo_lock(git):
            git.run("checkout", "-q", "-f", "--no-track", "-b", branch, start_sha, cwd=path)
        if keep:
            _drop_unfit_kept(git, path)
    except (GitError, OSError) as exc:
        log.warning("could not switch parked worktree %s to %s (%s); adding one instead",
                    path, branch, exc)
        _quietly_remove(git, path)
        _quietly_delete_branch(git, branch, start_sha)
        return False
    return True


def _reset_for_next(git: Git, path: Path, start_sha: str, keep: Iterable[str]) -> None:
    """Everything of the last story goes: index flags (skip-worktree, assume-unchanged, and
    intent-to-add with them: a plain ``read-tree`` of the next base drops every flag, and the
    ``checkout -f`` that follows writes the files its index now names), then untracked and
    ignored files (``clean -ffdx``), but for the `keep` folders ([scm] reuse_keep)."""
    if flagged(git, path):
        git.run("read-tree", start_sha, cwd=path)
    git.run("clean", "-q", "-ffdx", *_keep_args(keep), cwd=path)


def _keep_args(keep: Iterable[str]) -> list[str]:
    """``clean -e`` patterns for the kept folders, each anchored at the worktree's root."""
    args = []
    for pattern in keep:
        args += ["-e", pattern if pattern.startswith("/") else "/" + pattern]
    return args


def _drop_unfit_kept(git: Git, path: Path) -> None:
    """A kept folder stays only as a real folder that the new branch's own ignore rules ignore
    (``check-ignore`` of the folder itself, so a ``.gitignore`` planted inside it does not
    count): one they do not cover (the next agent would commit what is planted there), or a
    symlink (pointing anywhere), goes."""
    left = [e.rstrip("/") for e in git.run("ls-files", "-o", "--directory", "-z",
                                            cwd=path).stdout.split("\0") if e]
    if not left:
        return
    proc = git.run("check-ignore", "-z", "--stdin", cwd=path, input="\0".join(left) + "\0",
                   check=False)
    if proc.returncode not in (0, 1):
        raise GitError(f"cannot tell which kept folders {path} ignores", stderr=proc.stderr)
    ignored = set(filter(None, proc.stdout.split("\0")))
    for entry in left:
        where = path / entry
        if entry not in ignored or where.is_symlink() or not where.is_dir():
            remove_tree(where)


def _quietly_delete_branch(git: Git, branch: str, start_sha: str) -> None:
    """A take that failed after making the branch: the branch goes too (it holds only the base),
    so the caller makes the story's worktree as for any new story."""
    if git.rev(f"refs/heads/{branch}") != start_sha:
        return
    try:
        delete_branch(git, branch)
    except (GitError, OSError) as exc:
        log.warning("could not delete branch %s after a failed take (%s)", branch, exc)


def clear_interrupted_take(git: Git, worktree: Path) -> None:
    """A detached worktree at a story's path whose branch does not exist yet is a take that was
    cut short (a story's own worktree is always on its branch): remove it, so the story's
    worktree is made again."""
    path = _abs(worktree)
    if not os.path.lexists(path):
        return
    info = worktree_at(git, path)
    if info is not None and info.detached:
        remove_worktree(git, path)


def drain_pool(git: Git, layout: Layout) -> list[str]:
    """Remove every parked worktree of the run (it settled), then run the git maintenance its
    commits skipped (`maintenance`). Returns the removed paths. Never raises: what it could not
    remove, ``bmad-loop cleanup`` does."""
    _await_announced(PARK_WAIT_S)  # a park under way would land after the drain
    removed = []
    for slot in parked(layout):
        if _quietly_remove(git, slot):
            removed.append(str(slot))
    try:
        pool_dir(layout).rmdir()
    except OSError:
        pass  # absent (no pool), or something is left for cleanup
    run_deferred_maintenance(git)
    return removed


# -- internals ----------------------------------------------------------------------------------


def _await_announced(wait_s: float) -> None:
    """Wait (at most `wait_s`) until no park announced in this process is under way."""
    _await(lambda: not _announced, wait_s)


def _await(done: Callable[[], object], wait_s: float) -> bool:
    """Wait (at most `wait_s`), woken as each announced park ends, until `done()` or no park
    announced in this process is under way; whether `done()` came true."""
    deadline = time.monotonic() + wait_s
    with _parks:
        while not done():
            remaining = deadline - time.monotonic()
            if not _announced or remaining <= 0:
                return False
            _parks.wait(remaining)
    return True


def _free_slot(layout: Layout, size: int) -> Path | None:
    """The first free numbered slot of the run's pool of `size` (the caller holds the lock)."""
    folder = pool_dir(layout)
    return next((folder / str(n) for n in range(1, size + 1)
                 if not os.path.lexists(folder / str(n))), None)


def _abs(path: Path) -> Path:
    return Path(os.path.abspath(os.fspath(path)))


def _own_state(git: Git, path: Path) -> bool:
    """Anything of the worktree's own that the next story must not inherit: a per-worktree
    configuration (its path from git, read as the configuration fingerprint reads it), or
    per-worktree refs."""
    config = git.out("rev-parse", "--git-path", "config.worktree", cwd=path)
    if os.path.lexists(Path(path, config)):
        return True
    return bool(git.out("for-each-ref", "--count=1", "--format=%(refname)", "refs/worktree/",
                        "refs/bisect/", cwd=path))


def _clean(git: Git, path: Path, seeds: Seeds) -> bool:
    """`git status` shows nothing but untracked seed files (copied in, never committed)."""
    out = git.run("status", "--porcelain", "-z", "--untracked-files=all", cwd=path).stdout
    records = [r for r in out.split("\0") if r]
    if any(not r.startswith("?? ") for r in records):
        return False
    if not records:
        return True
    names = [s.rstrip("/") for s in (seeds() if callable(seeds) else seeds)]
    prefixes = tuple(n + "/" for n in names)
    return all(r[3:] in names or r[3:].startswith(prefixes) for r in records)


def _first_usable(git: Git, layout: Layout) -> Path | None:
    """The first parked worktree still fit to take (caller holds the lock); unfit ones go."""
    listing = {info.path.resolve(): info for info in list_worktrees(git)}
    for slot in parked(layout):
        info = listing.get(slot.resolve())
        if info is not None and not info.locked and info.detached and not _own_state(git, slot):
            return slot
        _quietly_remove(git, slot)
    return None


def _quietly_remove(git: Git, path: Path) -> bool:
    try:
        remove_worktree(git, path)
        return True
    except (GitError, OSError) as exc:
        log.warning("could not remove worktree %s (%s); `bmad-loop cleanup` will", path, exc)
        return False


def drain_run_pool(project: Project, run_id: str, policy: Policy) -> list[str]:
    """`drain_pool` for a run known by id (the lane's error path, which has no lane object)."""
    try:
        git = project.git(policy)
    except Exception:  # the lane is failing already; cleanup removes what is left
        log.warning("could not drain the worktree pool of run %s", run_id, exc_info=True)
        return []
    return drain_pool(git, Layout(project.state_dir, run_id))


def sweep_landed(project: Project, run_id: str) -> list[str]:
    """Remote mode, on a story host: remove this host's worktrees of the run's stories that
    landed (the lane, in another clone, cannot). Returns the paths removed."""
    state = project.state_dir.resolve()
    removed = []
    with project.db.transaction() as s:
        run = s.get(Run, run_id)
        assert run is not None  # a run's host sweeps only a run it serves
        policy = run_policy(run)
        rows = [(st.worktree, st.branch) for st in s.scalars(select(Story).where(
            Story.run_id == run_id, Story.state.in_((StoryState.INTEGRATED, StoryState.SKIPPED)),
            Story.host == project.host, Story.worktree.is_not(None)))]
    git = project.git(policy)
    for worktree, branch in rows:
        path = Path(cast(str, worktree))  # the query reads only rows with a worktree
        if not path.is_dir() or not _under(path.resolve(), state):
            continue
        remove_worktree(git, path)
        removed.append(str(path))
        if policy.scm.delete_branch and branch:
            delete_branch(git, branch)
    return removed


def _under(path: Path, base: Path) -> bool:
    try:
        path.relative_to(base.resolve())
        return True
    except ValueError:
        return False
