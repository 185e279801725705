"""Worktrees and branches: idempotent creation, recovery from half-made ones, concurrent use."""

from __future__ import annotations

import multiprocessing
import shutil
import time
from pathlib import Path

import pytest

from bmad_loop.errors import GitError
from bmad_loop.git.runner import Git
from bmad_loop.git.worktrees import (
    checkout_of,
    delete_branch,
    delete_ref,
    ensure_detached_worktree,
    ensure_worktree,
    list_worktrees,
    prune,
    remove_worktree,
)
from support import git_repo

# HOME without git config: the autouse `isolated_home` fixture of conftest.py.


@pytest.fixture
def git(tmp_path) -> Git:
    """A real repository on `main` with one commit, in its own tmp folder."""
    return git_repo(tmp_path / "repo", {"README": "hello\n", ".gitignore": "*.log\n"})


@pytest.fixture
def base(git) -> str:
    return git.rev("HEAD")


def _commit_in(git: Git, wt: Path, name: str, text: str) -> str:
    (wt / name).write_text(text)
    git.run("add", "-A", cwd=wt)
    git.run("commit", "-q", "-m", name, cwd=wt, env=git.identity_env())
    return git.rev("HEAD", cwd=wt)


def _registered(git: Git, path: Path):
    return [w for w in list_worktrees(git) if w.path.resolve() == path.resolve()]


def test_ensure_worktree_creates_the_branch_at_the_start_sha_and_checks_it_out(git, base, tmp_path):
    wt = tmp_path / "wts" / "1-1-login"
    head = ensure_worktree(git, wt, "story/1-1-login", base)
    assert head == base
    assert git.rev("refs/heads/story/1-1-login") == base
    assert (wt / "README").read_text() == "hello\n"
    assert git.current_branch(cwd=wt) == "story/1-1-login"
    assert checkout_of(git, "story/1-1-login").resolve() == wt.resolve()


def test_ensure_worktree_twice_reuses_the_worktree_and_keeps_its_work(git, base, tmp_path):
    wt = tmp_path / "wt"
    ensure_worktree(git, wt, "s1", base)
    moved = _commit_in(git, wt, "a.txt", "a\n")
    (wt / "scratch.txt").write_text("uncommitted\n")
    assert ensure_worktree(git, wt, "s1", base) == moved  # the branch is not reset to base
    assert (wt / "scratch.txt").read_text() == "uncommitted\n"
    assert len(_registered(git, wt)) == 1


def test_ensure_worktree_reuses_an_existing_branch_without_moving_it(git, base, tmp_path):
    wt = tmp_path / "wt"
    ensure_worktree(git, wt, "s1", base)
    head = _commit_in(git, wt, "a.txt", "a\n")
    remove_worktree(git, wt)
    assert ensure_worktree(git, wt, "s1", base) == head
    assert (wt / "a.txt").exists()


def test_ensure_worktree_replaces_a_plain_folder_left_at_its_path(git, base, tmp_path):
    wt = tmp_path / "wt"
    (wt / "junk").mkdir(parents=True)
    (wt / "junk" / "file").write_text("left over\n")
    assert ensure_worktree(git, wt, "s1", base) == base
    assert not (wt / "junk").exists()
    assert (wt / "README").exists()


def test_ensure_worktree_recovers_from_an_add_killed_while_locked_initializing(git, base, tmp_path):
    wt = tmp_path / "wt"
    git.run("branch", "s1", base)
    git.run("worktree", "add", "-q", wt, "s1")
    git.run("worktree", "lock", "--reason", "initializing", wt)
    for child in wt.iterdir():  # a half checkout: .git and files gone
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    assert _registered(git, wt)[0].half_made
    assert ensure_worktree(git, wt, "s1", base) == base
    [info] = _registered(git, wt)
    assert not info.locked and info.branch == "s1"
    assert (wt / "README").exists()


def test_ensure_worktree_recovers_a_locked_initializing_checkout_that_still_has_its_git_file(
    git, base, tmp_path
):
    wt = tmp_path / "wt"
    git.run("branch", "s1", base)
    git.run("worktree", "add", "-q", wt, "s1")
    git.run("worktree", "lock", "--reason", "initializing", wt)
    (wt / "README").unlink()
    ensure_worktree(git, wt, "s1", base)
    assert (wt / "README").exists()
    assert not _registered(git, wt)[0].locked


def test_ensure_worktree_recovers_a_registered_worktree_whose_folder_is_gone(git, base, tmp_path):
    wt = tmp_path / "wt"
    ensure_worktree(git, wt, "s1", base)
    git.run("worktree", "lock", wt)  # even a locked one, which prune alone would skip
    shutil.rmtree(wt)
    assert _registered(git, wt)[0].half_made
    assert ensure_worktree(git, wt, "s1", base) == base
    assert (wt / "README").exists()


def test_ensure_worktree_frees_its_branch_from_a_stale_worktree_elsewhere(git, base, tmp_path):
    old = tmp_path / "old"
    ensure_worktree(git, old, "s1", base)
    shutil.rmtree(old)
    new = tmp_path / "new"
    ensure_worktree(git, new, "s1", base)
    assert checkout_of(git, "s1").resolve() == new.resolve()
    assert _registered(git, old) == []


def test_ensure_worktree_never_discards_a_complete_worktree_on_another_branch(git, base, tmp_path):
    wt = tmp_path / "wt"
    ensure_worktree(git, wt, "s1", base)
    (wt / "edit.txt").write_text("a human's edit\n")
    with pytest.raises(GitError, match="s1"):
        ensure_worktree(git, wt, "s2", base)
    assert (wt / "edit.txt").exists()
    with pytest.raises(GitError, match="already checked out"):
        ensure_worktree(git, tmp_path / "elsewhere", "s1", base)


def test_ensure_worktree_refuses_a_branch_name_git_refuses(git, base, tmp_path):
    with pytest.raises(GitError):
        ensure_worktree(git, tmp_path / "wt", "bad..name", base)
    assert not (tmp_path / "wt").exists()


def test_ensure_detached_worktree_creates_reuses_and_resets_to_another_sha(git, base, tmp_path):
    story = tmp_path / "story"
    ensure_worktree(git, story, "s1", base)
    second = _commit_in(git, story, "b.txt", "b\n")
    cand = tmp_path / "cand"
    ensure_detached_worktree(git, cand, base)
    [info] = _registered(git, cand)
    assert info.detached and info.head == base and info.branch is None
    (cand / "build.log").write_text("ignored output\n")
    (cand / "stray.txt").write_text("untracked\n")
    # Same sha, reused (a verification repeated after a crash): made exactly that tree again.
    (cand / "README").write_text("changed and hidden\n")
    git.run("update-index", "--skip-worktree", "README", cwd=cand)
    ensure_detached_worktree(git, cand, base)
    assert not (cand / "stray.txt").exists() and not (cand / "build.log").exists()
    assert (cand / "README").read_text() == "hello\n"
    assert git.out("ls-files", "-v", cwd=cand) == "H .gitignore\nH README"
    (cand / "stray.txt").write_text("untracked\n")
    ensure_detached_worktree(git, cand, second)
    assert _registered(git, cand)[0].head == second
    assert (cand / "b.txt").read_text() == "b\n"
    assert not (cand / "build.log").exists() and not (cand / "stray.txt").exists()


def test_ensure_detached_worktree_recovers_a_half_made_one(git, base, tmp_path):
    cand = tmp_path / "cand"
    git.run("worktree", "add", "-q", "--detach", cand, base)
    git.run("worktree", "lock", "--reason", "initializing", cand)
    (cand / ".git").unlink()
    ensure_detached_worktree(git, cand, base)
    [info] = _registered(git, cand)
    assert info.detached and not info.locked and (cand / ".git").exists()


def test_remove_worktree_removes_folder_and_registration_and_missing_is_fine(git, base, tmp_path):
    wt = tmp_path / "wt"
    ensure_worktree(git, wt, "s1", base)
    (wt / "dirty.txt").write_text("x\n")
    (wt / "ro").mkdir()
    (wt / "ro" / "f").write_text("read-only\n")
    (wt / "ro").chmod(0o500)
    remove_worktree(git, wt)
    assert not wt.exists()
    assert _registered(git, wt) == []
    assert git.rev("refs/heads/s1") == base  # the branch stays
    remove_worktree(git, wt)  # again: nothing to do
    remove_worktree(git, tmp_path / "never-existed")


def test_remove_worktree_refuses_the_main_worktree(git):
    with pytest.raises(GitError, match="main worktree"):
        remove_worktree(git, git.repo_dir)
    assert (git.repo_dir / "README").exists()


def test_delete_branch_of_a_branch_in_a_prunable_worktree(git, base, tmp_path):
    wt = tmp_path / "wt"
    ensure_worktree(git, wt, "s1", base)
    shutil.rmtree(wt)  # the folder is gone, the registration is not: branch -D alone refuses
    assert git.run("branch", "-D", "s1", check=False).returncode != 0
    delete_branch(git, "s1")
    assert git.rev("refs/heads/s1") is None
    delete_branch(git, "s1")  # missing is fine


def test_delete_branch_of_a_branch_in_a_locked_half_made_worktree(git, base, tmp_path):
    wt = tmp_path / "wt"
    ensure_worktree(git, wt, "s1", base)
    git.run("worktree", "lock", "--reason", "initializing", wt)
    shutil.rmtree(wt)
    delete_branch(git, "s1")
    assert git.rev("refs/heads/s1") is None
    assert _registered(git, wt) == []


def test_remove_worktree_then_delete_branch_leaves_nothing_behind(git, base, tmp_path):
    wt = tmp_path / "wt"
    ensure_worktree(git, wt, "s1", base)
    remove_worktree(git, wt)
    delete_branch(git, "s1")
    assert [w.path.resolve() for w in list_worktrees(git)] == [git.repo_dir.resolve()]
    assert git.out("branch", "--list", "s1") == ""


def test_delete_branch_refuses_a_branch_checked_out_in_a_live_worktree(git, base, tmp_path):
    ensure_worktree(git, tmp_path / "wt", "s1", base)
    with pytest.raises(GitError, match="s1"):
        delete_branch(git, "s1")
    assert git.rev("refs/heads/s1") == base


def test_list_worktrees_reports_main_branches_detached_locked_and_prunable(git, base, tmp_path):
    ensure_worktree(git, tmp_path / "a", "feature/a", base)
    ensure_detached_worktree(git, tmp_path / "b", base)
    git.run("worktree", "lock", "--reason", "kept for review", tmp_path / "a")
    ensure_detached_worktree(git, tmp_path / "c", base)
    shutil.rmtree(tmp_path / "c")
    main, a, b, c = list_worktrees(git)
    assert main.path.resolve() == git.repo_dir.resolve() and main.branch == "main"
    assert a.branch == "feature/a" and a.locked and a.lock_reason == "kept for review"
    assert not a.half_made and a.head == base
    assert b.detached and b.branch is None and not b.locked
    assert c.prunable and c.half_made
    prune(git)
    assert len(list_worktrees(git)) == 3


def test_delete_ref_deletes_it_and_missing_is_fine(git, base):
    git.run("update-ref", "refs/bmad-loop/candidates/1", base)
    delete_ref(git, "refs/bmad-loop/candidates/1")
    assert git.rev("refs/bmad-loop/candidates/1") is None
    delete_ref(git, "refs/bmad-loop/candidates/1")


def _stress_worker(args) -> list[str]:
    """One process of the stress test: its own worktrees, made, re-made, removed, deleted."""
    repo, root, n, count = args
    git = Git(Path(repo))
    base = git.rev("main")
    failures = []
    for i in range(count):
        path = Path(root) / f"p{n}-w{i}"
        branch = f"stress/p{n}-{i}"
        try:
            ensure_worktree(git, path, branch, base)
            ensure_worktree(git, path, branch, base)
            assert checkout_of(git, "main") is not None  # reads meet adds half way through
            if i % 2:
                ensure_detached_worktree(git, Path(root) / f"p{n}-c{i}", base)
                remove_worktree(git, Path(root) / f"p{n}-c{i}")
            remove_worktree(git, path)
            delete_branch(git, branch)
        except Exception as exc:  # noqa: BLE001 - every failure is the test's finding
            failures.append(f"{branch}: {exc}")
    return failures


def test_six_processes_making_and_removing_worktrees_at_once_never_fail(git, tmp_path):
    root = tmp_path / "stress"
    root.mkdir()
    ctx = multiprocessing.get_context("spawn")
    started = time.monotonic()
    with ctx.Pool(6) as pool:
        results = pool.map(_stress_worker, [(str(git.repo_dir), str(root), n, 8) for n in range(6)])
    failures = [f for r in results for f in r]
    assert failures == []
    assert [w.path.resolve() for w in list_worktrees(git)] == [git.repo_dir.resolve()]
    assert git.out("branch", "--list", "stress/*") == ""
    assert list(root.iterdir()) == []
    assert time.monotonic() - started < 60
