"""The lane's candidate commit written beside its tree (bmad_loop/git/trees/commitobject.py), against git.

`commit_body` must give the very bytes `git commit-tree` writes for the same inputs, or None;
composing a story must give the same SHA whichever way the commit was made.
"""

from __future__ import annotations

import subprocess

import pytest

from bmad_loop.git.trees.commitobject import CommitSpec, commit_body
from bmad_loop.git.trees.compose import compose, replace_blob
from bmad_loop.engine.lane.writeback import LaneTreeEdit, lane_tree_edit
from bmad_loop.git.runner import Git
from bmad_loop.git.worktrees import ensure_worktree
from support import git_repo

BOARD = "_bmad-output/sprint-status.yaml"
BOARD_TEXT = ("development_status:\n  epic-1: in-progress\n  1-1-first: review\n"
              "  1-2-second: backlog\n")


def _env(name="bmad-loop", email="bmad-loop@localhost", date="@1700000000 +0100") -> dict:
    return {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date,
            "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email, "GIT_COMMITTER_DATE": date}


@pytest.fixture
def repo(tmp_path) -> Git:
    return git_repo(tmp_path / "repo", {"a.txt": "a\n", BOARD: BOARD_TEXT})


def _git_commit(git: Git, tree: str, spec: CommitSpec) -> str:
    argv = ["commit-tree", "--no-gpg-sign", tree]
    for parent in spec.parents:
        argv += ["-p", parent]
    return git.out(*argv, input=spec.message, env=dict(spec.env))


def _named(git: Git, body: bytes) -> str:
    return git.out("hash-object", "-t", "commit", "--stdin", input=body)


@pytest.mark.parametrize("message,env", [
    ("Merge bmad-loop/run/1-1-first\n\n1.1 First story\n", _env()),
    ("no newline at the end", _env()),
    ("Zoë's story — naïve café ✓\n\nbody\n", _env("Zoë Ångström", "zoe@example.org")),
    ("title\n", _env(date="@1700000000 +0530")),
    ("title\n", _env(date="@1700000000 -0700")),
    ("title\n", _env(date="@987654321 +1400")),
    ("# not a comment to git\n\n  indented\n\n\n", _env()),
])
def test_the_commit_written_here_is_the_one_git_writes(repo, message, env):
    tree = repo.out("rev-parse", "HEAD^{tree}")
    other = repo.out("commit-tree", tree, "-m", "other", env=repo.identity_env())
    for parents in ([], [repo.rev("HEAD")], [repo.rev("HEAD"), other]):
        spec = CommitSpec(parents, message, env)
        body = commit_body(tree, spec)
        assert body is not None
        assert _named(repo, body) == _git_commit(repo, tree, spec)
    # A parent named twice: git keeps one, so git makes that commit.
    assert commit_body(tree, CommitSpec([other, other], message, env)) is None


@pytest.mark.parametrize("message,env", [
    ("title\n", _env(name="Jr.")),  # a trailing dot some gits strip
    ("title\n", _env(name=" padded")),
    ("title\n", _env(email="<angle@example.org>")),
    ("title\n", _env(name="two\nlines")),
    ("title\n", _env(date="2023-11-14T22:13:20+01:00")),  # git would reformat it
    ("title\n", _env(date="@1700000000 -0000")),  # git writes +0000
    ("title\n", _env(date="@1700000000 +2500")),
    ("title \ufffe\n", _env()),  # a non-character git's UTF-8 check re-encodes
    ("bad \udcff byte\n", _env()),  # an undecodable byte carried as a surrogate
    ("title\n", {**_env(), "GIT_AUTHOR_DATE": ""}),
])
def test_what_git_might_write_otherwise_is_left_to_commit_tree(repo, message, env):
    tree = repo.out("rev-parse", "HEAD^{tree}")
    assert commit_body(tree, CommitSpec([repo.rev("HEAD")], message, env)) is None


def _story_head(repo: Git, tmp_path) -> tuple[str, str]:
    base = repo.rev("HEAD")
    wt = tmp_path / "wt"
    ensure_worktree(repo, wt, "story", base)
    (wt / "b.txt").write_text("b\n")
    repo.run("add", "-A", cwd=wt)
    repo.run("commit", "-q", "-m", "story", cwd=wt, env=repo.identity_env("@1700000100 +0100"))
    (repo.repo_dir / "c.txt").write_text("c\n")  # the target moves meanwhile
    repo.run("add", "-A")
    repo.run("commit", "-q", "-m", "target", env=repo.identity_env("@1700000200 +0100"))
    return repo.rev("HEAD"), repo.rev("story")


@pytest.mark.parametrize("strategy", ["merge", "squash", "ff"])
def test_composing_with_the_lane_s_edit_gives_the_sha_commit_tree_gives(repo, tmp_path, strategy):
    target, branch = _story_head(repo, tmp_path)
    edit = lane_tree_edit(repo, key="1-1-first", epic="1", board_rel=BOARD, story_path=None)
    assert isinstance(edit, LaneTreeEdit)
    ours = compose(repo, strategy, target, branch, "1.1 First story", tree_edit=edit,
                   lane_message="bmad-loop: mark 1-1-first done")
    # The same edit as a plain callable: the tree by the edit, the commit by `commit-tree`.
    plain = compose(repo, strategy, target, branch, "1.1 First story",
                    tree_edit=lambda tree: edit(tree),
                    lane_message="bmad-loop: mark 1-1-first done")
    assert ours.sha == plain.sha and ours.tree == plain.tree
    assert "1-1-first: done" in repo.out("show", f"{ours.sha}:{BOARD}")
    assert repo.run("fsck", "--no-progress", "--connectivity-only").returncode == 0
    assert repo.out("cat-file", "-t", ours.sha) == "commit"


def test_a_repository_with_another_commit_encoding_gets_git_s_own_commit(repo, tmp_path):
    repo.run("config", "i18n.commitEncoding", "ISO-8859-1")
    target, branch = _story_head(repo, tmp_path)
    edit = lane_tree_edit(repo, key="1-1-first", epic="1", board_rel=BOARD, story_path=None)
    ours = compose(repo, "merge", target, branch, "Première story", tree_edit=edit)
    header = repo.run("cat-file", "commit", ours.sha, text=False).stdout.split(b"\n\n")[0]
    assert b"\nencoding ISO-8859-1" in header  # git made it: the header only git adds
    plain = compose(repo, "merge", target, branch, "Première story",
                    tree_edit=lambda tree: edit(tree))
    assert ours.sha == plain.sha


def test_a_plain_tree_edit_still_composes_through_commit_tree(repo, tmp_path):
    target, branch = _story_head(repo, tmp_path)
    result = compose(repo, "merge", target, branch, "msg",
                     tree_edit=lambda tree: replace_blob(repo, tree, "d.txt", b"d\n"))
    assert repo.out("show", f"{result.sha}:d.txt") == "d"
    assert subprocess.run(["git", "cat-file", "-e", result.sha], cwd=repo.repo_dir).returncode == 0
