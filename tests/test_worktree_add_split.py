"""A new story's worktree: registered under the repository lock, checked out without it.

`ensure_worktree`'s quick path runs ``worktree add --no-checkout --lock --reason initializing``
under the lock, then the checkout and the unlock; these tests show the checkouts of several
stories run while nobody holds the lock, that the result is the checkout a plain ``worktree add``
makes, and that every interruption in between (a failure, a crash, a real SIGKILL in the middle
of the checkout) is discarded and made again.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bmad_loop.git import worktrees
from bmad_loop.errors import GitError
from bmad_loop.git.locks import LOCK_FILE_NAME
from bmad_loop.git.runner import Git
from bmad_loop.git.worktrees import (
    checkout_of,
    ensure_detached_worktree,
    ensure_worktree,
    list_worktrees,
)
from support import git_repo, wait_until

FILES = {
    "README": "hello\n",
    ".gitignore": "*.log\n",
    "src/app.py": "print('app')\n",
    "src/deep/er/mod.py": "x = 1\n",
    "docs/guide.md": "# guide\n",
}


@pytest.fixture
def git(tmp_path) -> Git:
    repo = git_repo(tmp_path / "repo", FILES)
    # An executable file and a symbolic link: a checkout must reproduce modes and links too.
    (tmp_path / "repo" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (tmp_path / "repo" / "run.sh").chmod(0o755)
    os.symlink("src/app.py", tmp_path / "repo" / "app-link")
    repo.run("add", "-A")
    repo.run("commit", "-q", "-m", "modes", env=repo.identity_env())
    return repo


def _admin(path: Path) -> Path | None:
    """The worktree's admin entry, as its `.git` file names it (the test looks; the code asks git)."""
    try:
        return Path((path / ".git").read_text().split(":", 1)[1].strip())
    except (OSError, IndexError):
        return None


def _tree(root: Path) -> dict[str, tuple]:
    """Every file under `root` but ``.git``: content (or link target) and executable bit."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            p = Path(folder) / name
            rel = p.relative_to(root).as_posix()
            if rel == ".git":
                continue
            if p.is_symlink():
                found[rel] = ("link", os.readlink(p))
            else:
                found[rel] = (p.read_bytes(), os.access(p, os.X_OK))
    return found


def _assert_complete(git: Git, path: Path, branch: str, head: str, reference: Path) -> None:
    """`path` is a usable checkout of `branch` at `head`, file for file like `reference`."""
    info = next(i for i in list_worktrees(git) if i.path.resolve() == path.resolve())
    assert not info.half_made and not info.locked and info.lock_reason == ""
    assert info.branch == branch and info.head == head
    admin = _admin(path)
    assert admin is not None and not (admin / "locked").exists()
    assert git.current_branch(cwd=path) == branch
    assert git.out("status", "--porcelain", "--untracked-files=all", cwd=path) == ""
    assert _tree(path) == _tree(reference)
    assert checkout_of(git, branch).resolve() == path.resolve()


@pytest.fixture
def reference(git, tmp_path) -> Path:
    """What a plain ``git worktree add`` checks out, to compare with."""
    path = tmp_path / "plain"
    git.run("worktree", "add", "--quiet", "--detach", path, "HEAD")
    return path


def test_four_new_worktrees_check_out_while_nobody_holds_the_repository_lock(
        git, tmp_path, reference, monkeypatch):
    base = git.rev("HEAD")
    lock_file = git.common_dir() / LOCK_FILE_NAME
    lock_was_free = []

    def all_registered() -> None:
        # Runs once, when all four threads wait before their checkout: the lock must be free.
        fd = os.open(lock_file, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises when someone holds it
            fcntl.flock(fd, fcntl.LOCK_UN)
            lock_was_free.append(True)
        finally:
            os.close(fd)

    barrier = threading.Barrier(4, action=all_registered, timeout=30)
    seen_half_made = []

    def before_checkout(path: Path) -> None:
        # Each worktree is registered, locked "initializing", without files yet.
        info = next(i for i in list_worktrees(git) if i.path.resolve() == path.resolve())
        seen_half_made.append(info.half_made and info.lock_reason == "initializing"
                              and not (path / "README").exists())
        barrier.wait()  # all four past registration before any checks out

    monkeypatch.setattr(worktrees, "_after_register", before_checkout)
    errors: list[BaseException] = []
    paths = [tmp_path / "wts" / f"1-{i}-s{i}" for i in range(4)]

    def make(i: int) -> None:
        try:
            assert ensure_worktree(git, paths[i], f"bmad-loop/r/s{i}", base,
                                   branch_head=None) == base
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert lock_was_free == [True] and seen_half_made == [True] * 4
    for i, path in enumerate(paths):
        _assert_complete(git, path, f"bmad-loop/r/s{i}", base, reference)


@pytest.mark.parametrize("caller_reads", [False, True], ids=["unknown-head", "prepare"])
def test_a_crash_between_registration_and_checkout_is_made_again(
        git, tmp_path, reference, caller_reads):
    base = git.rev("HEAD")
    path, branch = tmp_path / "wts" / "1-1-s1", "bmad-loop/r/s1"
    path.parent.mkdir()
    # What a crash right after the first step leaves: registered, locked, no files.
    git.run("worktree", "add", "--quiet", "--no-checkout", "--lock", "--reason",
            "initializing", "--no-track", "-b", branch, path, base)
    info = next(i for i in list_worktrees(git) if i.path.resolve() == path.resolve())
    assert info.half_made and info.locked and info.lock_reason == "initializing"
    assert checkout_of(git, branch) is None  # never taken for a usable checkout
    git.run("worktree", "prune")
    assert _admin(path) is not None  # locked: prune leaves it for ensure_worktree
    # The worker's prepare reads the branch (now present) and hands its head on.
    kwargs = {"branch_head": git.rev(f"refs/heads/{branch}")} if caller_reads else {}
    assert ensure_worktree(git, path, branch, base, **kwargs) == base
    _assert_complete(git, path, branch, base, reference)


def test_a_failed_checkout_discards_the_half_made_worktree_and_raises(
        git, tmp_path, reference, monkeypatch):
    base = git.rev("HEAD")
    path, branch = tmp_path / "wts" / "1-1-s1", "bmad-loop/r/s1"

    def break_it(p: Path) -> None:
        (p / ".git").unlink()  # the checkout then finds no repository there

    monkeypatch.setattr(worktrees, "_after_register", break_it)
    with pytest.raises(GitError):
        ensure_worktree(git, path, branch, base, branch_head=None)
    assert not os.path.lexists(path)
    assert [i.path for i in list_worktrees(git) if i.path.resolve() == path.resolve()] == []
    named = [(e / "gitdir").read_text().strip() for e in (git.common_dir() / "worktrees").iterdir()]
    assert str(path / ".git") not in named  # no admin entry left behind, locked or not
    monkeypatch.setattr(worktrees, "_after_register", None)
    # The branch was made; the next try takes it (the worker's prepare reads it).
    assert ensure_worktree(git, path, branch, base,
                           branch_head=git.rev(f"refs/heads/{branch}")) == base
    _assert_complete(git, path, branch, base, reference)


_CHILD = """
import sys
from pathlib import Path
from bmad_loop.git.runner import Git
from bmad_loop.git.worktrees import ensure_worktree
ensure_worktree(Git(Path(sys.argv[1])), Path(sys.argv[2]), sys.argv[3], sys.argv[4],
                branch_head=None)
"""


def test_a_sigkill_in_the_middle_of_the_checkout_leaves_what_the_next_call_repairs(tmp_path):
    files = {f"d{i % 30:02d}/f{i:04d}.txt": f"file {i}\n" for i in range(1000)}
    files["zz/stall.txt"] = "last\n"  # checked out after every d*/ file (index order)
    git = git_repo(tmp_path / "repo", files)
    base = git.rev("HEAD")
    path, branch = tmp_path / "wts" / "1-1-s1", "bmad-loop/r/s1"
    reached, block = tmp_path / "reached", tmp_path / "block"
    os.mkfifo(block)
    # A smudge filter on the last file: says it was reached, then waits on a FIFO nobody
    # writes, so the checkout is stopped for sure half way (earlier files written, index not).
    git.run("config", "filter.stall.smudge", f"sh -c 'touch {reached}; cat {block}'")
    attributes = git.common_dir() / "info" / "attributes"
    attributes.parent.mkdir(exist_ok=True)
    attributes.write_text("zz/stall.txt filter=stall\n")
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(git.repo_dir), str(path), branch,
                              base], start_new_session=True)
    try:
        wait_until(lambda: reached.exists() or child.poll() is not None, timeout=120,
                   what="the checkout to reach the stalled file")
        assert child.poll() is None, "the child ended before the checkout stalled"
        admin = _admin(path)
        assert admin is not None
        assert (admin / "locked").read_text().strip() == "initializing"
        assert (path / "d00" / "f0000.txt").exists() and not (path / "zz" / "stall.txt").exists()
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the child, its git and the filter: its own group
        child.wait()
    info = next(i for i in list_worktrees(git) if i.path.resolve() == path.resolve())
    assert info.half_made
    attributes.write_text("")  # the filter stalls no more
    # The next worker's prepare: the branch exists now, so it hands its head on.
    assert ensure_worktree(git, path, branch, base,
                           branch_head=git.rev(f"refs/heads/{branch}")) == base
    info = next(i for i in list_worktrees(git) if i.path.resolve() == path.resolve())
    assert not info.half_made and not info.locked and info.branch == branch
    assert git.out("status", "--porcelain", "--untracked-files=all", cwd=path) == ""
    assert (path / "zz" / "stall.txt").read_text() == "last\n"
    assert sum(1 for _ in (path).rglob("f*.txt")) == 1000


def test_a_new_candidate_worktree_is_checked_out_without_the_lock_too(
        git, tmp_path, reference, monkeypatch):
    sha = git.rev("HEAD")
    path = tmp_path / "candidates" / "1-1-s1" / "1"
    lock_file = git.common_dir() / LOCK_FILE_NAME
    seen = []

    def before_checkout(p: Path) -> None:
        info = next(i for i in list_worktrees(git) if i.path.resolve() == p.resolve())
        fd = os.open(lock_file, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises when the lock is held
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        seen.append((info.half_made, info.detached, info.lock_reason))

    monkeypatch.setattr(worktrees, "_after_register", before_checkout)
    ensure_detached_worktree(git, path, sha)
    assert seen == [(True, True, "initializing")]
    info = next(i for i in list_worktrees(git) if i.path.resolve() == path.resolve())
    assert not info.half_made and not info.locked and info.detached and info.head == sha
    assert git.out("status", "--porcelain", "--untracked-files=all", cwd=path) == ""
    assert _tree(path) == _tree(reference)


def test_a_pinned_post_checkout_hook_still_runs_on_a_new_worktree(git, tmp_path, monkeypatch):
    # git runs post-checkout on `worktree add`'s own checkout only, so with the hook pinned the
    # worktree is made by one `worktree add` under the lock, as before.
    marker = tmp_path / "marker"
    hook = git.common_dir() / "hooks" / "post-checkout"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text(f'#!/bin/sh\necho "post-checkout $3 $(pwd)" >> "{marker}"\n')
    hook.chmod(0o755)
    hooked = Git(git.repo_dir, run_hooks=("post-checkout",))
    monkeypatch.setattr(worktrees, "_after_register",
                        lambda p: pytest.fail("checked out apart with a post-checkout hook"))
    path = tmp_path / "wts" / "1-1-s1"
    ensure_worktree(hooked, path, "bmad-loop/r/s1", git.rev("HEAD"), branch_head=None)
    assert marker.read_text() == f"post-checkout 1 {path}\n"
    assert git.out("status", "--porcelain", cwd=path) == ""
