"""The git CLI wrapper: clean environment, identity, reads, branch names and the repository lock."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from bmad_loop.errors import GitError
from bmad_loop.git.locks import repo_lock
from bmad_loop.git.runner import Git, Identity, branch_name_ok, clean_env
from support import git_repo

# HOME without git config: the autouse `isolated_home` fixture of conftest.py.


@pytest.fixture
def git(tmp_path) -> Git:
    """A real repository on `main` with one commit, which refuses to guess an identity."""
    return git_repo(tmp_path / "repo", {"README": "hello\n"})


def test_commits_work_without_any_git_identity_configured(git):
    refused = git.run("commit", "--allow-empty", "-q", "-m", "x", check=False)
    assert refused.returncode != 0  # the machine really has no identity for git to use
    git.run("commit", "--allow-empty", "-q", "-m", "x", env=git.identity_env())
    assert git.out("log", "-1", "--format=%an <%ae> / %cn <%ce>") == (
        "bmad-loop <bmad-loop@localhost> / bmad-loop <bmad-loop@localhost>"
    )


def test_a_custom_identity_names_author_and_committer(git):
    g = Git(git.repo_dir, Identity("Lane", "lane@example.org"))
    g.run("commit", "--allow-empty", "-q", "-m", "x", env=g.identity_env("@1700000000 +0000"))
    assert g.out("log", "-1", "--format=%an %ae %cn %ce %at %ct") == (
        "Lane lane@example.org Lane lane@example.org 1700000000 1700000000"
    )


def test_rev_gives_the_full_sha_or_none(git):
    sha = git.rev("main")
    assert sha is not None and len(sha) == 40
    assert git.rev("HEAD") == sha
    assert git.rev("no-such-branch") is None
    assert git.rev("-x") is None


def test_a_failing_command_raises_git_error_with_its_stderr_and_exit_code(git):
    with pytest.raises(GitError) as caught:
        git.run("rev-parse", "--verify", "no-such-ref")
    assert caught.value.returncode == 128
    assert "fatal" in caught.value.stderr
    assert "rev-parse" in str(caught.value)
    assert git.run("rev-parse", "--verify", "no-such-ref", check=False).returncode == 128


def test_bytes_in_gives_bytes_out_and_out_strips_text(git):
    proc = git.run("hash-object", "--stdin", input=b"\x00\xff")
    assert isinstance(proc.stdout, bytes)
    assert git.out("hash-object", "--stdin", input=b"\x00\xff") == proc.stdout.decode().strip()
    assert git.out("rev-parse", "--abbrev-ref", "HEAD") == "main"


def test_inherited_git_variables_cannot_redirect_commands(git, tmp_path, monkeypatch):
    other = tmp_path / "other"
    subprocess.run(["git", "init", "-q", "-b", "other", str(other)], check=True, env=clean_env())
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "bogus-index"))
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(tmp_path / "bogus-objects"))
    assert git.current_branch() == "main"
    assert git.rev("HEAD") is not None
    env = clean_env({"GIT_INDEX_FILE": "mine"})
    assert "GIT_DIR" not in env and env["GIT_INDEX_FILE"] == "mine" and env["LC_ALL"] == "C"


def test_common_dir_and_toplevel_are_absolute_and_shared_by_worktrees(git, tmp_path):
    wt = tmp_path / "wt"
    git.run("worktree", "add", "-q", "--detach", wt, "HEAD")
    assert git.common_dir() == (git.repo_dir / ".git").resolve()
    assert Git(wt).common_dir() == git.common_dir()
    assert git.toplevel().resolve() == git.repo_dir.resolve()
    assert Git(wt).toplevel().resolve() == wt.resolve()


def test_current_branch_is_none_when_head_is_detached(git, tmp_path):
    assert git.current_branch() == "main"
    git.run("checkout", "-q", "--detach")
    assert git.current_branch() is None


def test_is_ancestor_follows_history(git):
    first = git.rev("HEAD")
    git.run("commit", "--allow-empty", "-q", "-m", "second", env=git.identity_env())
    second = git.rev("HEAD")
    assert git.is_ancestor(first, second)
    assert git.is_ancestor(second, second)
    assert not git.is_ancestor(second, first)


def test_commit_date_can_be_fed_back_as_a_committer_date(git):
    date = "@1700000000 +0530"
    git.run("commit", "--allow-empty", "-q", "-m", "dated", env=git.identity_env(date))
    sha = git.rev("HEAD")
    assert git.commit_date(sha) == date
    tree = git.out("rev-parse", "HEAD^{tree}")
    again = git.out("commit-tree", tree, "-m", "x", env=git.identity_env(git.commit_date(sha)))
    assert git.commit_date(again) == date


@pytest.mark.parametrize(
    "name, ok",
    [
        ("1-2-login", True),
        ("bmad/run-1/1-2a-login", True),
        ("", False),
        ("-x", False),
        ("HEAD", False),
        ("a..b", False),
        ("a b", False),
        ("a~1", False),
        ("x.lock", False),
        ("@{-1}", False),
        ("a/", False),
    ],
)
def test_branch_name_ok_accepts_only_names_git_accepts(name, ok):
    assert branch_name_ok(name) is ok


def test_repo_lock_excludes_other_threads(git):
    inside = []
    overlaps = []

    def worker():
        for _ in range(20):
            with repo_lock(git):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(1)
                time.sleep(0.001)
                inside.pop()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    assert (git.common_dir() / "bmad-loop.lock").exists()


def test_repo_lock_is_reentrant_within_one_thread(git):
    with repo_lock(git):
        with repo_lock(git):
            pass
        # still held by us: another thread cannot take it
        got = threading.Event()

        def other():
            with repo_lock(git):
                got.set()

        t = threading.Thread(target=other)
        t.start()
        assert not got.wait(0.2)
    t.join(5)
    assert got.is_set()


def test_repo_lock_held_by_a_killed_process_is_released_by_the_kernel(git, tmp_path):
    ready = tmp_path / "ready"
    script = textwrap.dedent(
        f"""
        import pathlib, time
        from bmad_loop.git.locks import repo_lock
        from bmad_loop.git.runner import Git
        with repo_lock(Git(pathlib.Path({str(git.repo_dir)!r}))):
            pathlib.Path({str(ready)!r}).write_text("1")
            time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.02)
        got = threading.Event()

        def take():
            with repo_lock(git):
                got.set()

        t = threading.Thread(target=take, daemon=True)
        t.start()
        assert not got.wait(0.3)  # the other process holds it
        child.kill()
        assert got.wait(10)
    finally:
        child.kill()
        child.wait()


def test_git_is_looked_up_once_and_a_git_planted_later_or_writable_by_others_is_never_run(
        git, tmp_path, monkeypatch):
    """The git executable is looked up once (issue 45, planted programs): a git planted
    afterwards in a folder that comes first on PATH (an agent writing ~/.local/bin/git) is never
    run by a process already running; a git in a folder others may write is passed over; with
    no git at all, a clear error."""
    import os
    import shutil
    from pathlib import Path

    real = shutil.which("git")

    def shim(folder: Path, calls: Path) -> None:
        (folder / "git").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {real} "$@"\n')
        (folder / "git").chmod(0o755)

    original = os.environ["PATH"]
    early, planted = tmp_path / "early", tmp_path / "planted.log"
    early.mkdir()
    monkeypatch.setenv("PATH", f"{early}{os.pathsep}{original}")
    assert git.out("rev-parse", "--abbrev-ref", "HEAD") == "main"  # the real git, found once
    shim(early, planted)
    assert git.out("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert not planted.exists()  # planted after the lookup: never run

    open_folder, others = tmp_path / "open", tmp_path / "others.log"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    shim(open_folder, others)
    monkeypatch.setenv("PATH", f"{open_folder}{os.pathsep}{original}")
    assert git.out("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert not others.exists()  # anyone could have written it: passed over

    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no git at all: a clear error
    with pytest.raises(GitError, match="cannot run git"):
        git.run("status")


def test_a_folder_on_path_reached_through_a_symlink_a_box_could_repoint_is_never_searched(
        git, tmp_path, monkeypatch):
    """`~/bin -> ~/tools/bin` on PATH: the box binds the target read-only but not the link, so
    an agent could point the link at a folder of its own for the next bmad-loop process. Such a
    folder (a link in the home or a temp folder) is passed over for git and bwrap; the same
    folder reached without a link is searched."""
    import os
    import shutil

    from bmad_loop.sandbox.programs import redirectable_folder, trusted_program

    real = shutil.which("git")
    home = tmp_path / "home"
    tools = home / "tools" / "bin"
    tools.mkdir(parents=True)
    calls = tmp_path / "calls.log"
    (tools / "git").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {real} "$@"\n')
    (tools / "git").chmod(0o755)
    (home / "bin").symlink_to(tools)
    monkeypatch.setenv("HOME", str(home))
    original = os.environ["PATH"]
    monkeypatch.setenv("PATH", f"{home / 'bin'}{os.pathsep}{original}")
    assert redirectable_folder(str(home / "bin")) == str(home / "bin")
    assert trusted_program("git") == os.path.realpath(real)
    assert git.out("rev-parse", "--abbrev-ref", "HEAD") == "main" and not calls.exists()
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{original}")  # no link on the way
    assert redirectable_folder(str(tools)) is None
    assert trusted_program("git") == str(tools / "git")
