"""Deleting a branch without git (bmad_loop/git/branchfiles.py), checked against `git branch -D`.

Two repositories get the same branches; git deletes one in the first, the module the same one
in the second, and what is left under `.git` (refs, reflogs, folders) must be the same. Every
case the module leaves to git must leave the repository as it was.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bmad_loop.git.branchfiles import delete_loose_branch
from bmad_loop.git.worktrees import delete_branch
from support import git_repo

BRANCHES = ("bmad-loop/run-1/1-1-a", "bmad-loop/run-1/1-2-b", "bmad-loop/run-2/2-1-c", "solo")


def _git(cwd, *args, check=True) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _repo(root: Path):
    git = git_repo(root, {"a.txt": "a\n"})
    for name in BRANCHES:
        _git(root, "branch", name)
    return git


def _state(root: Path) -> dict[str, str]:
    """Every file and folder under .git/refs and .git/logs, with the refs' contents (the base
    commit's name written as BASE: two repositories made a second apart differ there)."""
    base = _git(root, "rev-parse", "main")
    found = {}
    for top in ("refs", "logs"):
        for folder, dirs, files in os.walk(root / ".git" / top):
            rel = os.path.relpath(folder, root / ".git")
            found[rel + "/"] = ""
            for name in files:
                text = Path(folder, name).read_text()
                # A reflog line carries the time it was written: compare what it records.
                text = text.replace(base, "BASE")
                found[f"{rel}/{name}"] = text if top == "refs" else str(len(text.splitlines()))
    return found


@pytest.mark.parametrize("order", [BRANCHES, BRANCHES[::-1]])
def test_each_deletion_leaves_what_git_branch_d_leaves(tmp_path, order):
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    _repo(theirs)
    git = _repo(ours)
    # Same commit, same branches: the two repositories start alike (reflog times aside).
    assert _state(theirs) == _state(ours)
    for name in order:
        _git(theirs, "branch", "-D", name)
        assert delete_loose_branch(git.common_dir(), name)
        assert _state(theirs) == _state(ours), name
        assert _git(ours, "branch", "--list", name) == ""
        assert _git(ours, "reflog", "exists", f"refs/heads/{name}", check=False) == ""
    # The run folders went with their last branch, as git removes them.
    assert not (ours / ".git" / "refs" / "heads" / "bmad-loop").exists()
    assert not (ours / ".git" / "logs" / "refs" / "heads" / "bmad-loop").exists()
    assert _git(ours, "fsck", "--no-progress") == ""
    assert _git(ours, "for-each-ref", "--format=%(refname)") == "refs/heads/main"


def test_what_git_must_judge_is_left_untouched(tmp_path):
    root = tmp_path / "repo"
    git = _repo(root)
    common = git.common_dir()
    # Checked out in a worktree; packed; named in the config (an agent's `push -u`); locked by
    # another git; missing; a name git refuses.
    _git(root, "worktree", "add", "-q", str(tmp_path / "wt"), "bmad-loop/run-1/1-1-a")
    _git(root, "pack-refs", "--all")  # every branch into packed-refs...
    moved = git.out("commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", "moved", env=git.identity_env())
    _git(root, "branch", "-f", "solo", moved)  # ...and `solo` loose again, packed too
    _git(root, "branch", "loose-configured")
    _git(root, "config", "branch.loose-configured.remote", "origin")
    _git(root, "branch", "loose-locked")
    (common / "refs" / "heads" / "loose-locked.lock").write_text("")
    before = _state(root), (common / "packed-refs").read_text(), (common / "config").read_text()

    for name in ("bmad-loop/run-1/1-1-a", "bmad-loop/run-1/1-2-b", "solo", "loose-configured",
                 "loose-locked", "never-made", "bad..name", "main"):
        assert not delete_loose_branch(common, name), name
    assert (_state(root), (common / "packed-refs").read_text(),
            (common / "config").read_text()) == before


def test_a_worktree_mid_rebase_keeps_its_branch(tmp_path):
    root = tmp_path / "repo"
    git = _repo(root)
    _git(root, "worktree", "add", "-q", "--detach", str(tmp_path / "wt"))
    admin = git.common_dir() / "worktrees" / "wt"
    (admin / "rebase-merge").mkdir()
    (admin / "rebase-merge" / "head-name").write_text("refs/heads/solo\n")
    assert not delete_loose_branch(git.common_dir(), "solo")
    assert _git(root, "rev-parse", "--verify", "refs/heads/solo")


def test_delete_branch_leaves_git_the_cases_it_does_not_edit(tmp_path):
    # The module's refusals reach git through the engine's entry point: a packed branch is
    # deleted by `git branch -D`, its config section too.
    root = tmp_path / "repo"
    git = _repo(root)
    _git(root, "config", "branch.solo.remote", "origin")
    _git(root, "pack-refs", "--all")
    delete_branch(git, "solo")
    delete_branch(git, "bmad-loop/run-1/1-1-a")
    assert _git(root, "branch", "--list", "solo", "bmad-loop/run-1/1-1-a") == ""
    assert "solo" not in (git.common_dir() / "config").read_text()
    assert "refs/heads/solo" not in (git.common_dir() / "packed-refs").read_text()


def test_a_pack_refs_run_meanwhile_leaves_the_copy_to_git(tmp_path, monkeypatch):
    # A real `git pack-refs` runs once our lock on the ref is held (git does not take it
    # first): it copies the ref into packed-refs. The loose ref goes, and git deletes the copy.
    import bmad_loop.git.branchfiles as branchfiles

    root = tmp_path / "repo"
    git = _repo(root)
    name = "bmad-loop/run-1/1-1-a"
    monkeypatch.setattr(branchfiles, "_after_lock",
                        lambda path: _git(root, "pack-refs", "--all", check=False))
    assert not delete_loose_branch(git.common_dir(), name)
    assert f"refs/heads/{name}" in (git.common_dir() / "packed-refs").read_text()
    monkeypatch.setattr(branchfiles, "_after_lock", None)
    delete_branch(git, name)  # what the engine does then: git deletes the packed copy
    assert _git(root, "branch", "--list", name) == ""
    assert f"refs/heads/{name}" not in (git.common_dir() / "packed-refs").read_text()
