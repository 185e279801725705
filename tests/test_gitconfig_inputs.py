"""git's configuration asked again only when an input changed (gitconfig_inputs): every answer
is compared with a fresh ``git config --list`` read, and the reads git really did are counted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bmad_loop.git import config_inputs as gitconfig_inputs
from bmad_loop.git.config_guard import _read_entries
from support import git_repo, write

# HOME without git config: the autouse `isolated_home` fixture of conftest.py.


class Reads:
    """The real reader, counted."""

    def __init__(self):
        self.count = 0

    def __call__(self, git, cwd):
        self.count += 1
        return _read_entries(git, cwd)


@pytest.fixture
def repo(tmp_path):
    """A real repository on `main` with one commit."""
    return git_repo(tmp_path / "repo", {"README": "hello\n"})


def answer(git, cwd: Path, reads: Reads):
    """The cached answer, checked against a read git does now; and whether git was asked."""
    before = reads.count
    got = gitconfig_inputs.entries(git, cwd, reads)
    assert got == _read_entries(git, cwd)
    return got, reads.count > before


def values(found, key):
    return [value for _scope, _origin, k, value in found[0] if k == key]


def test_an_unchanged_configuration_is_not_read_again(repo):
    reads = Reads()
    assert answer(repo, repo.repo_dir, reads)[1]
    for _ in range(3):
        assert not answer(repo, repo.repo_dir, reads)[1]


def test_an_edit_that_keeps_size_and_clock_tick_is_seen(repo):
    reads = Reads()
    repo.run("config", "filter.x.clean", "aaaa")
    answer(repo, repo.repo_dir, reads)
    config = repo.repo_dir / ".git" / "config"
    stat = config.stat()
    config.write_bytes(config.read_bytes().replace(b"aaaa", b"bbbb"))
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    found, asked = answer(repo, repo.repo_dir, reads)
    assert asked and values(found, "filter.x.clean") == ["bbbb"]


def test_a_global_file_that_appears_is_seen(repo):
    reads = Reads()
    answer(repo, repo.repo_dir, reads)
    write(Path(os.environ["HOME"]) / ".gitconfig", "[core]\n\tpager = planted\n")
    found, asked = answer(repo, repo.repo_dir, reads)
    assert asked and values(found, "core.pager") == ["planted"]
    write(Path(os.environ["HOME"]) / ".config" / "git" / "config", "[diff \"x\"]\n\ttextconv = y\n")
    found, asked = answer(repo, repo.repo_dir, reads)
    assert asked and values(found, "diff.x.textconv") == ["y"]


def test_an_included_file_that_appears_later_is_seen(repo):
    reads = Reads()
    repo.run("config", "include.path", "extra.conf")  # relative to .git/config: .git/extra.conf
    repo.run("config", "includeIf.onbranch:main.path", "/nonexistent-dir/never")
    answer(repo, repo.repo_dir, reads)
    answer(repo, repo.repo_dir, reads)  # the included files are watched from here on
    assert not answer(repo, repo.repo_dir, reads)[1]
    write(repo.repo_dir / ".git" / "extra.conf", "[filter \"lfs\"]\n\tsmudge = planted\n")
    found, asked = answer(repo, repo.repo_dir, reads)
    assert asked and values(found, "filter.lfs.smudge") == ["planted"]


def test_a_worktree_switching_branch_under_an_onbranch_include_is_seen(repo, tmp_path):
    reads = Reads()
    write(tmp_path / "feature.conf", "[core]\n\tsshCommand = planted\n")
    repo.run("config", "includeIf.onbranch:feature.path", str(tmp_path / "feature.conf"))
    linked = tmp_path / "linked"
    repo.run("worktree", "add", "-q", "-b", "story", str(linked))
    answer(repo, linked, reads)
    answer(repo, linked, reads)
    assert not answer(repo, linked, reads)[1]
    repo.run("checkout", "-q", "-b", "feature", cwd=linked)
    found, asked = answer(repo, linked, reads)
    assert asked and values(found, "core.sshcommand") == ["planted"]


def test_a_worktree_s_own_configuration_is_seen(repo, tmp_path):
    reads = Reads()
    repo.run("config", "extensions.worktreeConfig", "true")
    linked = tmp_path / "linked"
    repo.run("worktree", "add", "-q", "-b", "story", str(linked))
    answer(repo, linked, reads)
    assert not answer(repo, linked, reads)[1]
    repo.run("config", "--worktree", "core.fsmonitor", "planted", cwd=linked)
    found, asked = answer(repo, linked, reads)
    assert asked and values(found, "core.fsmonitor") == ["planted"]


def test_a_subfolder_is_always_asked(repo):
    reads = Reads()
    sub = repo.repo_dir / "sub"
    sub.mkdir()
    assert answer(repo, sub, reads)[1]
    assert answer(repo, sub, reads)[1]


def test_sibling_worktrees_share_an_answer_until_a_condition_could_tell_them_apart(repo, tmp_path):
    reads = Reads()
    one, two, three = (tmp_path / name for name in ("one", "two", "three"))
    for i, folder in enumerate((one, two, three)):
        repo.run("worktree", "add", "-q", "-b", f"s{i}", str(folder))
    assert answer(repo, one, reads)[1]
    assert not answer(repo, two, reads)[1]  # the same files, no condition: one's answer
    repo.run("config", "filter.x.smudge", "planted")
    found, asked = answer(repo, two, reads)
    assert asked and values(found, "filter.x.smudge") == ["planted"]
    write(tmp_path / "only-three.conf", "[core]\n\tpager = three\n")
    repo.run("config", "includeIf.onbranch:s2.path", str(tmp_path / "only-three.conf"))
    assert answer(repo, two, reads)[1]
    found, asked = answer(repo, three, reads)  # a condition could tell them apart: not shared
    assert asked and values(found, "core.pager") == ["three"]
    assert values(answer(repo, one, reads)[0], "core.pager") == []


def test_threads_asking_for_one_folder_at_once_ask_git_once(repo):
    import threading

    entered, release = threading.Event(), threading.Event()
    reads = Reads()

    def slow(git, cwd):  # the first read holds until the second thread is waiting for it
        entered.set()
        assert release.wait(10)
        return reads(git, cwd)

    answers = []
    first = threading.Thread(target=lambda: answers.append(
        gitconfig_inputs.entries(repo, repo.repo_dir, slow)))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=lambda: answers.append(
        gitconfig_inputs.entries(repo, repo.repo_dir, reads)))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert reads.count == 1
    assert answers[0] == answers[1] == _read_entries(repo, repo.repo_dir)
