"""Tree edits through git (edit.replace_blobs: ls-tree, hash-object, mktree): each gives the
tree its edits describe, modes kept, and costs one git process per depth beyond two."""

from __future__ import annotations

import os
import random
import shutil
import stat

import pytest

from bmad_loop.git.trees.compose import LaneEdit, compose
from bmad_loop.errors import GitError
from bmad_loop.git.trees.edit import blob_at, blobs_at, replace_blobs
from support import git_repo

FILES = {
    "README": "top\n",
    "a.txt": "a\n",
    "a-b.txt": "dash sorts before the folder a/\n",
    "a/x.txt": "x\n",
    "a/deep/y.txt": "y\n",
    "a/deep/z.txt": "z\n",
    "b/only.txt": "alone in b\n",
    "sp ace/f.md": "spaced\n",
    "run.sh": "#!/bin/sh\n",
}


@pytest.fixture
def repo(tmp_path):
    """A real repository with nested folders, an executable, a symlink and an odd neighbour
    order (``a-b.txt`` < ``a/`` < ``a.txt`` in git's tree order)."""
    git = git_repo(tmp_path / "repo", FILES)
    (git.repo_dir / "run.sh").chmod(0o755)
    os.symlink("a.txt", git.repo_dir / "link")
    git.run("add", "-A")
    git.run("commit", "-q", "-m", "modes", env=git.identity_env())
    return git, git.out("rev-parse", "HEAD^{tree}")


CASES = [
    {"a/deep/y.txt": b"edited\n"},
    {"run.sh": b"#!/bin/sh\necho hi\n", "link": b"now a file\n"},
    {"b/only.txt": None},  # empties b/
    {"a/deep/y.txt": None, "a/deep/z.txt": None, "a/new/n.txt": b"n\n"},
    {"new dir/deeper/n.txt": b"n\n", "a.txt": None, "a-b.txt": b"changed\n"},
    {"sp ace/f.md": b"spaced again\n", "missing/never.txt": None, "a/x.txt": b"x\n"},
    {"a/x.txt": b"x\n"},  # unchanged content: the same tree
]


def listing(git, tree) -> dict[str, tuple[str, str]]:
    """path -> (mode, object) of every file of `tree`."""
    out = git.out("ls-tree", "-r", "-z", tree).split("\0")
    found = {}
    for entry in filter(None, out):
        meta, _, path = entry.partition("\t")
        mode, _kind, sha = meta.split(" ")
        found[path] = (mode, sha)
    return found


def expected(git, tree, edit) -> dict[str, tuple[str, str]]:
    """What `edit` should make of `tree`'s files: removed, or written as a regular file that
    keeps an existing file's executable bit."""
    files = listing(git, tree)
    for path, content in edit.items():
        if content is None:
            files.pop(path, None)
            continue
        sha = git.out("hash-object", "--no-filters", "--stdin", input=content)
        mode = "100755" if files.get(path, ("",))[0] == "100755" else "100644"
        files[path] = (mode, sha)
    return files


@pytest.mark.parametrize("edit", CASES)
def test_each_edit_gives_the_tree_it_describes(repo, edit):
    git, tree = repo
    new = replace_blobs(git, tree, edit)
    assert listing(git, new) == expected(git, tree, edit)
    assert git.run("fsck", "--no-dangling", "--strict").returncode == 0


def test_an_edit_that_changes_nothing_gives_the_same_tree(repo):
    git, tree = repo
    assert replace_blobs(git, tree, {"a/x.txt": b"x\n", "missing/never.txt": None}) == tree
    assert replace_blobs(git, tree, {}) == tree


def test_random_edits_of_random_trees_give_the_trees_they_describe(tmp_path):
    rng = random.Random(15)
    names = ["a", "b", "a.b", "a-b", "c d", "z"]
    for round_ in range(6):
        paths = {"/".join(rng.choice(names) + str(rng.randrange(2)) for _ in range(rng.randint(1, 3)))
                 for _ in range(12)}
        files = {}
        for p in sorted(paths):  # a path that is a folder of another stays a folder
            if not any(q.startswith(p + "/") for q in paths):
                files[p] = f"{p}\n"
        git = git_repo(tmp_path / f"r{round_}", files)
        tree = git.out("rev-parse", "HEAD^{tree}")
        for _ in range(4):
            edit = {}
            for p in rng.sample(sorted(files), k=min(3, len(files))):
                edit[p] = None if rng.random() < 0.4 else f"{p} v{rng.random()}\n".encode()
            edit[f"n{rng.randrange(9)}/{rng.choice(names)}.new"] = b"new\n"
            assert listing(git, replace_blobs(git, tree, edit)) == expected(git, tree, edit), edit


def test_a_folder_named_as_a_file_is_refused(repo):
    git, tree = repo
    with pytest.raises(GitError, match="is a folder"):
        replace_blobs(git, tree, {"a/deep": b"x\n"})
    with pytest.raises(GitError, match="is a folder"):
        replace_blobs(git, tree, {"a/deep": None})


def test_a_file_in_the_way_of_a_folder_gives_way(repo):
    git, tree = repo
    files = listing(git, replace_blobs(git, tree, {"a.txt/inside": b"x\n"}))
    assert "a.txt" not in files and files["a.txt/inside"][0] == "100644"


def test_removing_under_a_file_leaves_it_and_removing_everything_leaves_the_empty_tree(repo):
    git, tree = repo
    assert replace_blobs(git, tree, {"a.txt/inside": None}) == tree
    everything = {path: None for path in listing(git, tree)}
    empty = git.out("hash-object", "-t", "tree", "--stdin", input="")
    assert replace_blobs(git, tree, everything) == empty


def test_a_submodule_beside_an_edit_stays_and_paths_are_the_tree_s_from_any_folder(repo):
    git, tree = repo
    head = git.rev("HEAD")
    git.run("update-index", "--add", "--cacheinfo", f"160000,{head},a/deep/sub")
    git.run("commit", "-q", "-m", "submodule", env=git.identity_env())
    tree = git.out("rev-parse", "HEAD^{tree}")
    edit = {"a/deep/y.txt": b"beside the submodule\n"}
    new = replace_blobs(git, tree, edit)
    assert listing(git, new) == expected(git, tree, edit)
    assert listing(git, new)["a/deep/sub"] == ("160000", head)
    below = type(git)(git.repo_dir / "a")  # a project root below the repository's top
    assert replace_blobs(below, tree, edit) == new


def test_a_path_git_will_not_store_is_refused(repo):
    git, tree = repo
    for edit in ({".git/hooks/x": b"planted\n"}, {"a/.git": b"x\n", "a/x.txt": b"kept\n"},
                 {"a/.GIT/config": b"x\n"}, {"a/.git. /x": b"x\n"}, {"a//b": b"x\n"},
                 {"a/./b": b"x\n"}, {"../outside": b"x\n"}, {"/abs": b"x\n"}, {"a/..": None}):
        with pytest.raises(GitError, match="does not store"):
            replace_blobs(git, tree, edit)


def git_shim(folder):
    """A `git` that logs its arguments, then runs the real one."""
    real = shutil.which("git")
    folder.mkdir()
    log = folder / "calls.log"
    shim = folder / "git"
    shim.write_text(f'#!/bin/sh\nprintf \'%s\\n\' "$*" >> "{log}"\nexec "{real}" "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return log


def test_a_write_back_reads_in_one_process_and_writes_one_folder_level_in_each(repo, tmp_path,
                                                                                monkeypatch):
    git, tree = repo
    git.common_dir()  # asked once per repository (the new files wait there)
    log = git_shim(tmp_path / "shim")
    monkeypatch.setenv("PATH", f"{log.parent}{os.pathsep}{os.environ['PATH']}")
    paths = ["a/deep/y.txt", "sp ace/f.md"]
    current = blobs_at(git, tree, paths)
    new = replace_blobs(git, tree, {p: current[p] + b"done\n" for p in paths})
    calls = [line.split() for line in log.read_text().splitlines()]
    commands = [next(w for i, w in enumerate(words) if not w.startswith("-")
                     and (i == 0 or words[i - 1] != "-c")) for words in calls]
    # a/deep/, then a/, then the root with sp ace/ beside it: three depths, three `mktree`s.
    assert commands == ["cat-file", "ls-tree", "hash-object", "mktree", "mktree", "mktree"]
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
    assert blobs_at(git, new, paths) == {p: current[p] + b"done\n" for p in paths}
    assert git.run("fsck", "--no-dangling", "--strict").returncode == 0
    assert git.out("status", "--porcelain") == ""  # no worktree or index was involved


def test_a_file_written_into_a_commit_made_here_is_read_back_without_git(repo, tmp_path,
                                                                           monkeypatch):
    git, tree = repo
    head = git.out("rev-parse", "HEAD")
    edit = lambda t: replace_blobs(git, t, {"a/deep/y.txt": b"done\n"})  # noqa: E731
    candidate = compose(git, "squash", head, head, "write-back", edit=LaneEdit(edit)).sha
    assert candidate == git.out("commit-tree", edit(tree), "-p", head, "-m", "write-back",
                                env=git.identity_env(git.commit_date(head)))
    empty = tmp_path / "no-git"
    empty.mkdir()
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(empty))  # any git started now fails
    assert blob_at(git, candidate, "a/deep/y.txt") == b"done\n"
    with pytest.raises(GitError):
        blob_at(git, candidate, "a/x.txt")  # not written here: git is asked
    monkeypatch.setenv("PATH", path)
    assert blob_at(git, candidate, "a/x.txt") == b"x\n"
