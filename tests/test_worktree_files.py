"""Moving a worktree and detaching its HEAD without git (bmad_loop/git/worktree_files.py).

Each edit is checked against git itself on a real repository: what `git worktree list`, `git
status`, `git worktree prune` and `git branch -D` make of the result, and the very file a real
`git worktree move` writes. Every refusal leaves the worktree where and as it was.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from bmad_loop.git.worktree_files import detach_head, rename_linked_worktree
from support import git_repo


def _git(cwd, *args, check=True) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _repo_with_worktrees(tmp_path: Path, *names: str):
    repo = git_repo(tmp_path / "repo", {"a.txt": "a\n", "src/b.py": "b\n"})
    root = tmp_path / "repo"
    for name in names:
        _git(root, "worktree", "add", "-q", "-b", name, str(tmp_path / "wt" / name))
    return root, Path(repo.common_dir())


def _listed(root: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in _git(root, "worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")]


def test_a_moved_worktree_is_what_git_worktree_move_makes(tmp_path):
    root, common = _repo_with_worktrees(tmp_path, "ours", "theirs")
    real = tmp_path / "real"
    real.mkdir()
    # Through a symlinked folder: git records the real path, and so must we.
    (tmp_path / "via").symlink_to(real)
    ours_to, theirs_to = tmp_path / "via" / "ours-moved", tmp_path / "via" / "theirs-moved"
    assert rename_linked_worktree(tmp_path / "wt" / "ours", ours_to, common)
    _git(root, "worktree", "move", str(tmp_path / "wt" / "theirs"), str(theirs_to))

    ours_admin, theirs_admin = common / "worktrees" / "ours", common / "worktrees" / "theirs"
    assert (ours_admin / "gitdir").read_text() == str(real / "ours-moved" / ".git") + "\n"
    assert (theirs_admin / "gitdir").read_text() == str(real / "theirs-moved" / ".git") + "\n"
    assert not (tmp_path / "wt" / "ours").exists()
    assert str(real / "ours-moved") in _listed(root)
    # The moved worktree works where it is, on its branch, clean, and prune keeps it.
    assert _git(ours_to, "symbolic-ref", "--short", "HEAD") == "ours"
    assert _git(ours_to, "status", "--porcelain") == ""
    _git(root, "worktree", "prune")
    assert (ours_admin / "gitdir").exists()
    (ours_to / "a.txt").write_text("changed\n")
    assert _git(ours_to, "status", "--porcelain") == "M a.txt"
    assert sorted(os.listdir(ours_admin)) == sorted(os.listdir(theirs_admin))  # no leftovers


def test_what_is_not_the_plain_layout_is_left_to_git_untouched(tmp_path):
    root, common = _repo_with_worktrees(tmp_path, "locked", "relative", "plain")
    wt = tmp_path / "wt"
    _git(root, "worktree", "lock", str(wt / "locked"))
    # A relative link (what git 2.48's worktree.useRelativePaths writes): a move would have to
    # rewrite it, so it is git's to do.
    (wt / "relative" / ".git").write_text(
        "gitdir: " + os.path.relpath(common / "worktrees" / "relative", wt / "relative") + "\n")
    (tmp_path / "taken").mkdir()
    before = {name: (common / "worktrees" / name / "gitdir").read_text()
              for name in ("locked", "relative", "plain")}

    assert not rename_linked_worktree(wt / "locked", tmp_path / "x1", common)
    assert not rename_linked_worktree(wt / "relative", tmp_path / "x2", common)
    assert not rename_linked_worktree(wt / "plain", tmp_path / "taken", common)  # exists
    assert not rename_linked_worktree(root, tmp_path / "x3", common)  # the main checkout
    other_root, other_common = _repo_with_worktrees(tmp_path / "other", "foreign")
    assert not rename_linked_worktree(tmp_path / "other" / "wt" / "foreign", tmp_path / "x4", common)

    for name in ("locked", "relative", "plain"):
        assert (wt / name).is_dir()
        assert (common / "worktrees" / name / "gitdir").read_text() == before[name]
    assert not any((tmp_path / f"x{i}").exists() for i in range(1, 5))
    assert (root / ".git").is_dir() and (tmp_path / "other" / "wt" / "foreign").is_dir()


def test_a_detached_head_is_what_update_ref_no_deref_makes(tmp_path):
    root, common = _repo_with_worktrees(tmp_path, "story")
    wt, admin = tmp_path / "wt" / "story", common / "worktrees" / "story"
    sha = _git(wt, "rev-parse", "HEAD")

    assert detach_head(admin, sha)
    assert _git(wt, "symbolic-ref", "-q", "HEAD", check=False) == ""  # detached
    assert _git(wt, "rev-parse", "HEAD") == sha
    assert _git(wt, "status", "--porcelain") == ""
    assert not (admin / "HEAD.lock").exists()
    # The branch is no longer checked out anywhere: git lets it go.
    _git(root, "branch", "-D", "story")


def test_a_held_head_lock_is_left_alone_and_head_unchanged(tmp_path):
    root, common = _repo_with_worktrees(tmp_path, "story")
    wt, admin = tmp_path / "wt" / "story", common / "worktrees" / "story"
    sha = _git(wt, "rev-parse", "HEAD")
    (admin / "HEAD.lock").write_text("someone else's\n")  # a real git holding HEAD

    assert not detach_head(admin, sha)
    assert (admin / "HEAD").read_text() == "ref: refs/heads/story\n"
    assert (admin / "HEAD.lock").read_text() == "someone else's\n"
    assert not detach_head(admin, "not-a-sha")


# -- registering a new worktree (what `worktree add --no-checkout --lock -b` writes) -----------

def _admin_files(admin: Path) -> dict[str, str]:
    """Every file of an admin entry, a log's times left out (each run writes its own)."""
    found = {}
    for folder, _dirs, files in os.walk(admin):
        for name in files:
            path = Path(folder, name)
            text = path.read_text()
            if "logs" in path.relative_to(admin).parts:
                text = re.sub(r"> [0-9]+ [+-][0-9]{4}", "> TIME", text)
            found[str(path.relative_to(admin))] = text
    return found


def test_a_registration_is_what_git_worktree_add_writes(tmp_path):
    from bmad_loop.git.config_guard import config_entries
    from bmad_loop.git.worktree_files import register_linked_worktree, registrable
    from bmad_loop.git.worktrees import ensure_worktree

    root, common = _repo_with_worktrees(tmp_path)
    git_made, ours = tmp_path / "wt" / "by-git", tmp_path / "wt" / "by-us"
    # A stale admin entry already holds the name: both take the next one, `<name>1`.
    for taken in ("by-git", "by-us"):
        (common / "worktrees" / taken).mkdir(parents=True)
        (common / "worktrees" / taken / "locked").write_text("someone else's\n")
    _git(root, "worktree", "add", "-q", "--no-checkout", "--lock", "--reason", "initializing",
         "-b", "theirs", str(git_made))
    _git(root, "branch", "ours")
    from bmad_loop.git.runner import Git
    git = Git(root)
    assert registrable(common, ours, config_entries(git, root))
    register_linked_worktree(common, ours, "ours", "initializing")

    theirs_admin, ours_admin = common / "worktrees" / "by-git1", common / "worktrees" / "by-us1"
    assert (ours_admin / "logs" / "HEAD").exists()  # HEAD's creation, logged as git logs it
    expected = {name: text.replace("by-git", "by-us").replace("theirs", "ours")
                for name, text in _admin_files(theirs_admin).items()}
    assert _admin_files(ours_admin) == expected
    assert (ours / ".git").read_text() == (git_made / ".git").read_text().replace("by-git", "by-us")
    assert sorted(os.listdir(ours)) == sorted(os.listdir(git_made)) == [".git"]
    listed = _git(root, "worktree", "list", "--porcelain")
    assert f"worktree {ours}\nHEAD " in listed and "branch refs/heads/ours\nlocked initializing" in listed
    # And the engine's entry point makes one the same way, checked out and unlocked.
    made = ensure_worktree(git, tmp_path / "wt" / "engine", "eng", git.rev("HEAD"), branch_head=None)
    assert made == git.rev("HEAD")
    assert _git(tmp_path / "wt" / "engine", "status", "--porcelain") == ""
    assert _git(tmp_path / "wt" / "engine", "symbolic-ref", "HEAD") == "refs/heads/eng"
    assert not (common / "worktrees" / "engine" / "locked").exists()
    assert _git(root, "reflog", "show", "--format=%gs", "refs/heads/eng") == (
        f"branch: Created from {made}")


def test_what_worktree_add_would_do_more_for_is_left_to_it(tmp_path):
    from bmad_loop.git.config_guard import config_entries
    from bmad_loop.git.runner import Git
    from bmad_loop.git.worktree_files import registrable

    root, common = _repo_with_worktrees(tmp_path)
    git = Git(root)
    assert registrable(common, tmp_path / "wt" / "plain", config_entries(git, root))
    assert not registrable(common, tmp_path / "wt" / "with space", config_entries(git, root))
    assert not registrable(common, tmp_path / "wt" / ".hidden", config_entries(git, root))
    assert not registrable(common, root, config_entries(git, root))  # exists
    assert not registrable(common, tmp_path / "wt" / "plain", None)  # configuration unknown
    for key, value in (("core.sparseCheckout", "true"), ("extensions.worktreeConfig", "true"),
                       ("worktree.useRelativePaths", "true")):
        _git(root, "config", key, value)
        assert not registrable(common, tmp_path / "wt" / "plain", config_entries(git, root)), key
        _git(root, "config", "--unset", key)
    assert registrable(common, tmp_path / "wt" / "plain", config_entries(git, root))


def test_a_registration_refused_part_way_takes_back_what_it_made(tmp_path):
    import pytest

    from bmad_loop.git.worktree_files import register_linked_worktree

    root, common = _repo_with_worktrees(tmp_path)
    _git(root, "branch", "ours")
    (tmp_path / "a-file").write_text("in the way\n")  # the worktree's folder cannot go under it
    before = sorted(os.listdir(common / "worktrees")) if (common / "worktrees").exists() else []
    with pytest.raises(OSError):
        register_linked_worktree(common, tmp_path / "a-file" / "wt", "ours", "initializing")
    assert sorted(os.listdir(common / "worktrees")) == before  # no locked entry left behind
    assert _git(root, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert (tmp_path / "a-file").read_text() == "in the way\n"


def test_a_detached_registration_is_what_git_worktree_add_detach_writes(tmp_path):
    """`worktree add --detach --no-checkout --lock` by git and by us: the same admin entry (git
    also logs HEAD's first value, without a message: left out), then the engine's detached
    worktree (the lane's candidates) made that way, checked out and unlocked."""
    from bmad_loop.git.runner import Git
    from bmad_loop.git.worktree_files import register_detached_worktree
    from bmad_loop.git.worktrees import ensure_detached_worktree
    from bmad_loop.git.config_guard import config_entries

    root, common = _repo_with_worktrees(tmp_path)
    git = Git(root)
    sha = git.rev("HEAD")
    git_made, ours = tmp_path / "wt" / "by-git", tmp_path / "wt" / "by-us"
    _git(root, "worktree", "add", "-q", "--detach", "--no-checkout", "--lock", "--reason",
         "initializing", str(git_made), sha)
    assert register_detached_worktree(git, ours, sha, "initializing", config_entries(git, root))

    theirs_admin, ours_admin = common / "worktrees" / "by-git", common / "worktrees" / "by-us"
    expected = {name: text.replace("by-git", "by-us")
                for name, text in _admin_files(theirs_admin).items() if name != "logs/HEAD"}
    assert _admin_files(ours_admin) == expected and (ours_admin / "HEAD").read_text() == sha + "\n"
    assert (ours / ".git").read_text() == (git_made / ".git").read_text().replace("by-git", "by-us")
    listed = _git(root, "worktree", "list", "--porcelain")
    assert f"worktree {ours}\nHEAD {sha}\ndetached\nlocked initializing" in listed
    # Refused where git must do it: the path exists (here: the one just made).
    assert not register_detached_worktree(git, ours, sha, "initializing", config_entries(git, root))

    engine = tmp_path / "wt" / "engine"
    ensure_detached_worktree(git, engine, sha)
    assert _git(engine, "status", "--porcelain") == "" and (engine / "src" / "b.py").exists()
    assert _git(engine, "rev-parse", "HEAD") == sha
    assert _git(engine, "symbolic-ref", "-q", "HEAD", check=False) == ""  # detached
    assert not (common / "worktrees" / "engine" / "locked").exists()
    _git(root, "worktree", "remove", str(engine))  # git takes it back as one of its own
