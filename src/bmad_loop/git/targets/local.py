"""The target in the project's own repository: `update-ref` CAS, the checkout kept in step.

The lane holds the index lock of the checkout that has the target checked out (`IndexLock`)
from before the compare-and-swap until the checkout follows; `sync_held_checkout` does the
following under that lock.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ...errors import GitError
from ..locks import IndexLock, git_dirs
from ..runner import Git, is_full_sha
from ..trees.compose import cas_advance
from ..trees.diff import changed_status
from ..worktrees import checkout_of, delete_branch
from .base import Target

__all__ = ["LocalTarget", "index_path", "sync_held_checkout"]


class LocalTarget(Target):
    """The target branch `branch` of `git`'s repository; `checkout`: the folder the run was
    planned from (story files are read there)."""

    def __init__(self, git: Git, branch: str, *, checkout: Path | None = None) -> None:
        super().__init__(git, branch)
        self._held: tuple[Path, IndexLock] | None = None  # inside checkout_held()
        self._planning_checkout = Path(checkout) if checkout is not None else git.repo_dir

    @property
    def ref(self) -> str:
        return f"refs/heads/{self.branch}"

    def sha(self, *, fetch: bool = True) -> str | None:
        return self.git.rev(self.ref)

    def advance(self, new: str, old: str) -> bool:
        return cas_advance(self.git, self.branch, new, old)

    def checkout(self) -> Path | None:
        return checkout_of(self.git, self.branch)

    @contextmanager
    def checkout_held(self, *, wait_s: float = 30, on_wait: Callable[[str], None] | None = None,
                      on_stale: Callable[[str], None] | None = None) -> Iterator[Path | None]:
        checkout = self.checkout()
        if checkout is None:
            yield None
            return
        lock = IndexLock(index_path(self.git, checkout), wait_s=wait_s, on_wait=on_wait,
                         on_stale=on_stale)
        with lock:
            self._held = (checkout, lock)
            try:
                yield checkout
            finally:
                self._held = None

    def sync_checkout(self, checkout: Path, old: str, new: str) -> None:
        held = self._held
        if held is None or held[0] != checkout:
            raise RuntimeError(f"sync_checkout({checkout}) outside checkout_held()")
        sync_held_checkout(self.git, checkout, held[1], old, new)

    def story_source(self, worktree: Path) -> Path:
        # The run was planned from this checkout's story files.
        return self._planning_checkout

    def story_head(self, branch: str) -> str | None:
        return self.git.rev(f"refs/heads/{branch}")

    def delete_story_branch(self, branch: str) -> None:
        delete_branch(self.git, branch)


# -- the checkout that follows the target ------------------------------------------------------


def index_path(git: Git, checkout: Path) -> Path:
    """The index file of `checkout` (a linked worktree has its own under the common dir)."""
    if os.path.lexists(Path(checkout) / ".git"):  # its own top level: found without git
        dirs = git_dirs(Path(checkout))
        if dirs is not None and (dirs[0] / "HEAD").is_file():
            return dirs[0] / "index"  # GIT_INDEX_FILE, which could move it, is never passed on
    raw = git.out("rev-parse", "--git-path", "index", cwd=checkout)
    path = Path(raw)
    return path if path.is_absolute() else (Path(checkout) / path)


def sync_held_checkout(git: Git, checkout: Path, lock: IndexLock, old: str, new: str) -> None:
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


def _nul_list(paths: Iterable[str]) -> str:
    return "".join(f"{p}\0" for p in paths)
