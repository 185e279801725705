"""A refused command creates nothing: the whole repository folder, `.git` included, is byte for
byte what it was (every path, its mode, size, modification time and content).

Each case prepares a real repository, snapshots it, runs one command that must refuse (exit 2),
and compares. A read-only git step (`symbolic-ref HEAD` to learn the target branch) once wrote
its lock record into `.git/bmad-loop-steps/` before the board was even looked for.
"""

from __future__ import annotations

import gc
import hashlib
import os
from pathlib import Path

import pytest

from support import StoryDef

ONE = [StoryDef("1-1-alpha", files=["src/alpha.py"])]


def tree_snapshot(root: Path) -> dict[str, tuple]:
    """Every path below `root` (hidden ones and .git too): mode, size, mtime, content digest."""
    seen: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            info = os.lstat(path)
            digest = None
            if path.is_file() and not path.is_symlink():
                digest = hashlib.sha1(path.read_bytes()).hexdigest()
            mtime = None if path.is_dir() else info.st_mtime_ns
            if name.endswith("-shm"):  # SQLite's shared-memory index: every reader writes it
                mtime = digest = None
            seen[str(path.relative_to(root))] = (info.st_mode, info.st_size, mtime, digest)
    return seen


def assert_same_tree(before: dict, after: dict) -> None:
    made = sorted(set(after) - set(before))
    gone = sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    assert (made, gone, changed) == ([], [], []), \
        f"a refused command wrote: made {made}, removed {gone}, changed {changed}"


def no_board(repo):
    repo.board.unlink()
    repo.commit_all("no board")


def missing_binary(repo):
    repo.write_policy('[adapter]\ncommand = ["/nonexistent/agent"]\n', agent=False)


def bad_policy_value(repo):
    repo.write_policy("[limits]\nmax_dev_attempts = 0\n")


def live_run(repo):
    assert repo.cli("enqueue").exit_code == 0


def completed_run(repo):
    assert repo.cli("run").exit_code == 0


def nothing(repo):
    pass


def paused_run_then_bad_policy(repo):
    """A run paused (its only story escalated), then a policy edited into a bad value."""
    repo.write_script({"*": {"dev": [{"exit": 1}]}})
    repo.write_policy("[limits]\nmax_dev_attempts = 1\n")
    assert repo.cli("run").exit_code == 3
    run_id = repo.status()["run"]["id"]
    policy = repo.root / ".bmad-loop" / "policy.toml"
    policy.write_text(policy.read_text() + "\n[scm]\nmax_parallel = 0\n")
    return run_id


CASES = [
    (no_board, ("run",)), (no_board, ("enqueue",)), (no_board, ("run", "--enqueue-only")),
    (no_board, ("validate",)),
    (missing_binary, ("run",)), (missing_binary, ("enqueue",)), (missing_binary, ("validate",)),
    (nothing, ("run", "--story", "9-9")), (nothing, ("enqueue", "--epic", "7")),
    (nothing, ("run", "--parallel", "0")),
    (bad_policy_value, ("init",)), (bad_policy_value, ("run",)),
    (live_run, ("run",)), (live_run, ("enqueue",)),
    (nothing, ("resume", "nosuchrun")), (completed_run, ("resume", "LATEST")),
    (nothing, ("cleanup", "--purge")), (nothing, ("cleanup", "--clone", "/nonexistent/clone")),
    (paused_run_then_bad_policy, ("resume", "LATEST", "--reload-policy")),
    (paused_run_then_bad_policy, ("resume", "LATEST", "--reload-policy", "--enqueue-only")),
    (paused_run_then_bad_policy, ("cleanup",)), (paused_run_then_bad_policy, ("validate",)),
    (paused_run_then_bad_policy, ("init",)),
]


@pytest.mark.parametrize("prepare,args", CASES,
                         ids=[f"{p.__name__}-{'-'.join(a)}" for p, a in CASES])
def test_a_refused_command_leaves_the_repository_and_its_git_folder_untouched(make_repo, prepare, args):
    repo = make_repo(ONE)
    run_id = prepare(repo)
    if "LATEST" in args:
        run_id = run_id or repo.status()["run"]["id"]
        args = tuple(run_id if a == "LATEST" else a for a in args)
    # The set-up's in-process commands leave their SQLite connections to the cyclic collector:
    # one collected during the refused command (the last to close checkpoints its database)
    # would look like that command's write. Nothing is collected until the second snapshot.
    gc.disable()
    try:
        before = tree_snapshot(repo.root)
        result = repo.cli(*args)
        assert result.exit_code == 2, result.output
        assert_same_tree(before, tree_snapshot(repo.root))
    finally:
        gc.enable()
