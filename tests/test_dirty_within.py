"""The lane's dirty-checkout check asks git about the paths the advance touches only.

`dirty_paths(..., within=...)` limits `git status` to those paths (and what is under them);
`overlapping_dirty` must find exactly what it found with a status of the whole checkout, which
these tests force by setting `treediff.MAX_PATHSPECS` to 0.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from bmad_loop.git.trees import diff as treediff
from bmad_loop.git.trees.compose import dirty_paths, overlapping_dirty
from bmad_loop.git.runner import Git
from bmad_loop.git.worktrees import ensure_worktree
from support import git_repo


def _commit_all(git: Git, cwd: Path, message: str) -> str:
    git.run("add", "-A", cwd=cwd)
    git.run("commit", "-q", "--allow-empty", "-m", message, cwd=cwd,
            env=git.identity_env("@1700000000 +0000"))
    return git.rev("HEAD", cwd=cwd)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_within_lists_only_those_paths_and_what_is_under_them_taken_literally(tmp_path):
    repo = tmp_path / "repo"
    git = git_repo(repo)
    for rel in ("a*.py", "ab.py", "src/x.py", "src/y.py", "docs/z.md"):
        _write(repo, rel, "v1\n")
    _commit_all(git, repo, "base")
    for rel in ("a*.py", "ab.py", "src/x.py", "src/y.py", "docs/z.md"):
        _write(repo, rel, "v2\n")
    _write(repo, "src/new.txt", "untracked\n")
    assert dirty_paths(git, repo) == {"a*.py", "ab.py", "src/x.py", "src/y.py", "docs/z.md",
                                      "src/new.txt"}
    assert dirty_paths(git, repo, within=["a*.py"]) == {"a*.py"}  # not a glob: ab.py stays out
    assert dirty_paths(git, repo, within=["src"]) == {"src/x.py", "src/y.py", "src/new.txt"}
    assert dirty_paths(git, repo, within=["src/x.py", "docs/z.md"]) == {"src/x.py", "docs/z.md"}
    assert dirty_paths(git, repo, within=[]) == set()


# -------------------------------------------------------------- the same verdict as a full status
NAMES = ["a.py", "b.txt", "lib", "lib/c.py", "lib/d/e.py", "pkg/f.py", "pkg/g/h.py", "x.log"]


def _tree_of(rng: random.Random) -> dict[str, str]:
    """Random files (a name is never both a file and a folder of another)."""
    files: dict[str, str] = {}
    for name in rng.sample(NAMES, rng.randint(2, len(NAMES))):
        if any(other.startswith(name + "/") or name.startswith(other + "/") for other in files):
            continue
        files[name] = f"{name} {rng.random()}\n"
    return files


def _mess_up(rng: random.Random, checkout: Path, tracked: dict[str, str]) -> None:
    """Local changes a person may leave: edits, deletions, untracked and ignored files, a file
    where a folder is, a folder where a file is."""
    for _ in range(rng.randint(0, 4)):
        kind = rng.choice(["edit", "delete", "untracked", "ignored", "file-for-folder",
                           "folder-for-file"])
        if kind in ("edit", "delete") and tracked:
            name = rng.choice(sorted(tracked))
            path = checkout / name
            if path.is_file():
                if kind == "edit":
                    path.write_text("local edit\n")
                else:
                    path.unlink()
        elif kind in ("untracked", "ignored"):
            name = rng.choice(NAMES)
            name = name if kind == "untracked" else Path(name).with_suffix(".log").as_posix()
            if not (checkout / name).exists() and all(
                    not (checkout / p).is_file() for p in Path(name).parents if str(p) != "."):
                _write(checkout, name, "local\n")
        elif kind == "file-for-folder":
            folder = rng.choice(["lib", "pkg", "pkg/g", "lib/d"])
            if (checkout / folder).is_dir():
                shutil.rmtree(checkout / folder)
                (checkout / folder).write_text("a file now\n")
        elif tracked:
            name = rng.choice(sorted(tracked))
            if (checkout / name).is_file():
                (checkout / name).unlink()
                _write(checkout, f"{name}/inside.txt", "a folder now\n")


@pytest.mark.parametrize("seed", range(12))
def test_overlapping_dirty_finds_the_same_with_git_limited_to_the_touched_paths(tmp_path, seed,
                                                                               monkeypatch):
    rng = random.Random(seed)
    repo = tmp_path / "repo"
    git = git_repo(repo)
    _write(repo, ".gitignore", "*.log\n")
    base = _tree_of(rng)
    for name, text in base.items():
        _write(repo, name, text)
    old = _commit_all(git, repo, "base")
    story = tmp_path / "story"
    ensure_worktree(git, story, "story", old)
    for name in base:
        if (story / name).exists():
            (story / name).unlink()
    for parent in sorted({p for name in base for p in Path(name).parents if str(p) != "."},
                         key=lambda p: -len(p.parts)):
        if (story / parent).is_dir() and not any((story / parent).iterdir()):
            (story / parent).rmdir()
    for name, text in _tree_of(rng).items():
        _write(story, name, text)
    new = _commit_all(git, story, "story")
    for trial in range(3):
        checkout = tmp_path / f"checkout{trial}"
        ensure_worktree(git, checkout, f"c{seed}-{trial}", old)
        _mess_up(rng, checkout, base)
        limited = overlapping_dirty(git, checkout, old, new)
        monkeypatch.setattr(treediff, "MAX_PATHSPECS", 0)
        whole = overlapping_dirty(git, checkout, old, new)
        monkeypatch.undo()
        assert limited == whole, (seed, trial)
