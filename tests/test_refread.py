"""Reading branches and HEADs from git's files (refread): the same answer as git, or none."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bmad_loop.git.trees.compose import cas_advance
from bmad_loop.git.runner import clean_env
from bmad_loop.git.refread import UNKNOWN, main_checkout_branch, read_commit_ref
from bmad_loop.git.targets.local import LocalTarget
from bmad_loop.git.worktrees import checkout_of
from support import git_repo, write


@pytest.fixture
def repo(tmp_path):
    """A real repository on `main` with two commits (`first`, then `main`'s tip)."""
    git = git_repo(tmp_path / "repo", {"README": "one\n"})
    first = git.out("rev-parse", "HEAD")
    write(git.repo_dir / "README", "two\n")
    git.run("commit", "-qam", "two", env=git.identity_env())
    return git, first, git.out("rev-parse", "HEAD")


@pytest.fixture
def no_git(monkeypatch, tmp_path):
    """PATH without git: a read that starts git fails, so a passing read started none."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def parsed(git, name, cwd=None):
    return git.out("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", cwd=cwd)


def test_a_loose_branch_is_read_without_starting_git(repo, no_git):
    git, _first, tip = repo
    assert read_commit_ref(git.repo_dir, "refs/heads/main") == tip
    assert git.rev("refs/heads/main") == tip
    assert git.rev("HEAD") == tip


def test_a_packed_branch_is_read_from_packed_refs(repo):
    git, first, tip = repo
    git.run("branch", "old", first)
    git.run("pack-refs", "--all")
    assert not (git.repo_dir / ".git" / "refs" / "heads" / "old").exists()
    assert "refs/heads/old" in (git.repo_dir / ".git" / "packed-refs").read_text()
    assert read_commit_ref(git.repo_dir, "refs/heads/old") == first == parsed(git, "refs/heads/old")
    assert read_commit_ref(git.repo_dir, "HEAD") == tip  # HEAD -> a packed main


def test_a_loose_ref_overrides_the_packed_one(repo):
    git, first, tip = repo
    git.run("pack-refs", "--all")
    git.run("update-ref", "refs/heads/main", first, tip)  # loose again, packed still says tip
    assert tip in (git.repo_dir / ".git" / "packed-refs").read_text()
    assert read_commit_ref(git.repo_dir, "refs/heads/main") == first == parsed(git, "main")


def test_a_worktree_reads_its_own_head_and_the_shared_branches(repo, tmp_path):
    git, first, tip = repo
    linked = tmp_path / "linked"
    git.run("worktree", "add", "-q", "-b", "story", str(linked), first)
    detached = tmp_path / "detached"
    git.run("worktree", "add", "-q", "--detach", str(detached), tip)
    assert read_commit_ref(linked, "HEAD") == first == parsed(git, "HEAD", cwd=linked)
    assert read_commit_ref(detached, "HEAD") == tip == parsed(git, "HEAD", cwd=detached)
    assert read_commit_ref(git.repo_dir, "HEAD") == tip
    git.run("commit", "-q", "--allow-empty", "-m", "in the worktree", cwd=linked,
            env=git.identity_env())
    moved = parsed(git, "HEAD", cwd=linked)
    assert read_commit_ref(linked, "HEAD") == moved != first
    assert read_commit_ref(git.repo_dir, "refs/heads/story") == moved  # refs are shared
    assert read_commit_ref(linked / "sub-folder-that-is-not-there", "HEAD") is UNKNOWN


def test_an_absent_branch_is_none_unless_git_would_find_it_under_another_name(repo):
    git, first, _tip = repo
    assert read_commit_ref(git.repo_dir, "refs/heads/nothing") is None
    assert git.rev("refs/heads/nothing") is None
    # rev-parse also tries refs/tags/<name>: a tag called "refs/heads/nothing" answers for it.
    git.run("update-ref", "refs/tags/refs/heads/nothing", first)
    assert read_commit_ref(git.repo_dir, "refs/heads/nothing") is UNKNOWN
    assert git.rev("refs/heads/nothing") == first == parsed(git, "refs/heads/nothing")


def test_anything_unusual_is_left_to_git(repo, tmp_path):
    git, first, tip = repo
    dotgit = git.repo_dir / ".git"
    assert read_commit_ref(git.repo_dir, "main") is UNKNOWN  # short names: git's rules
    assert read_commit_ref(git.repo_dir, "refs/tags/x") is UNKNOWN  # tags may need peeling
    assert read_commit_ref(git.repo_dir, "refs/heads/../../config") is UNKNOWN
    git.run("symbolic-ref", "refs/heads/alias", "refs/heads/main")
    assert read_commit_ref(git.repo_dir, "refs/heads/alias") is UNKNOWN
    assert git.rev("refs/heads/alias") == tip
    (dotgit / "refs" / "heads" / "junk").write_text("not a sha\n")
    assert read_commit_ref(git.repo_dir, "refs/heads/junk") is UNKNOWN
    (dotgit / "refs" / "heads" / "link").symlink_to(dotgit / "refs" / "heads" / "main")
    assert read_commit_ref(git.repo_dir, "refs/heads/link") is UNKNOWN
    (dotgit / "reftable").mkdir()
    assert read_commit_ref(git.repo_dir, "refs/heads/main") is UNKNOWN
    (dotgit / "reftable").rmdir()
    assert read_commit_ref(tmp_path / "no-such-folder", "HEAD") is UNKNOWN


def test_an_unborn_head_is_git_s_to_judge(tmp_path):
    git = git_repo(tmp_path / "empty")
    assert read_commit_ref(git.repo_dir, "HEAD") is UNKNOWN
    assert git.rev("HEAD") is None


WRITER = """
import os, subprocess, sys
repo, a, b, start, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
while not os.path.exists(start):
    pass
old = a
for i in range(rounds):
    new = b if old == a else a
    subprocess.run(["git", "-C", repo, "update-ref", "refs/heads/main", new, old], check=True)
    if i % 5 == 0:  # move the ref between packed-refs and a loose file as well
        subprocess.run(["git", "-C", repo, "pack-refs", "--all"], check=True)
    old = new
"""


def test_a_ref_written_concurrently_reads_as_the_old_or_the_new_value(repo, tmp_path):
    git, first, tip = repo
    start = tmp_path / "start"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(git.repo_dir), tip, first, str(start), "60"],
        env=clean_env())
    seen = []
    try:
        seen.append(read_commit_ref(git.repo_dir, "refs/heads/main"))
        start.touch()  # the barrier: the writer starts once a first read is done
        while writer.poll() is None:
            seen.append(read_commit_ref(git.repo_dir, "refs/heads/main"))
            seen.append(read_commit_ref(git.repo_dir, "HEAD"))
    finally:
        writer.wait()
    assert writer.returncode == 0
    assert len(seen) > 2
    assert set(seen) <= {first, tip}, {s for s in seen if s not in (first, tip)}


def test_a_stale_read_only_makes_the_compare_and_swap_refuse(repo):
    git, first, tip = repo
    stale = read_commit_ref(git.repo_dir, "refs/heads/main")
    git.run("update-ref", "refs/heads/main", first, tip)  # someone else moves it
    new = git.out("commit-tree", f"{tip}^{{tree}}", "-p", tip, "-m", "candidate",
                  env=git.identity_env())
    assert cas_advance(git, "main", new, stale) is False
    assert parsed(git, "main") == first


def test_the_target_s_checkout_is_found_as_git_lists_it(repo, tmp_path):
    git, first, _tip = repo
    target = LocalTarget(git, "main")
    assert main_checkout_branch(git.repo_dir) == "refs/heads/main"
    assert target.checkout() == checkout_of(git, "main") == git.repo_dir.resolve()
    git.run("switch", "-q", "-c", "elsewhere")
    linked = tmp_path / "linked"
    git.run("worktree", "add", "-q", str(linked), "main")
    assert main_checkout_branch(linked) is None  # a linked worktree: git's list decides
    assert target.checkout() == checkout_of(git, "main") == linked.resolve()
    git.run("switch", "-q", "--detach", first, cwd=linked)
    assert main_checkout_branch(git.repo_dir) == "refs/heads/elsewhere"
    assert target.checkout() is None and checkout_of(git, "main") is None
