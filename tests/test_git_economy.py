"""How many git processes a story costs, counted from outside: a `git` on PATH that logs each
call and runs the real one (no tracing of git itself, no wrapper around the project's code).

Numbers are per story of a plain run (max_parallel 1, merge, review off, no verify commands),
whole run included (enqueue, start-up clean-up, the last settle). Every read and write of refs,
worktrees and commits is a git command (docs/recovery.md, "What bmad-loop touches under
.git"); the bound sits a third above what a story costs so, and the timing lives in
bench/overhead.py.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections import Counter
from pathlib import Path

import pytest

from bmad_loop.git.trees.compose import blobs_at, commit_worktree, replace_blobs
from bmad_loop.git.runner import Git
from bmad_loop.git.worktrees import ensure_worktree, list_worktrees, remove_worktree
from support import StoryDef, git_repo, write, write_each

STORIES = [StoryDef(f"1-{i}-s{i}", files=[f"src/s{i}.py"]) for i in range(1, 5)]
# Measured 62.5 per story here: 57.0 with the worker's commit in plumbing, then +4 once the
# board edit is written by git folder by folder (ls-tree, hash-object and one mktree per depth
# instead of one hand-made pack) and +1.5 once git's configuration is asked around each agent
# session instead of kept (45.0 with a porcelain commit; 23.0 while
# refs were read, branches deleted, worktrees registered and moved and commits written by
# editing git's files).
PER_STORY_BOUND = 65


def git_shim(folder: Path) -> tuple[Path, Path]:
    """A folder holding a `git` that appends its arguments to a log, then runs the real git."""
    real = shutil.which("git")
    assert real, "git is not on PATH"
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "calls.log"
    shim = folder / "git"
    shim.write_text(f'#!/bin/sh\nprintf \'%s\\n\' "$*" >> "{log}"\nexec "{real}" "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder, log


def subcommands(log: Path) -> Counter:
    """Calls by subcommand (bmad-loop's fixed ``-c k=v`` options skipped)."""
    counts: Counter = Counter()
    for line in log.read_text().splitlines() if log.exists() else []:
        words = line.split()
        while words and words[0] == "-c":
            words = words[2:]
        if words:
            counts[" ".join(words[:2]) if words[0] == "worktree" else words[0]] += 1
    return counts


@pytest.fixture
def counted(tmp_path, monkeypatch):
    """Start counting: every git process started from here on (this process and its children)."""
    folder, log = git_shim(tmp_path / "shim")

    def start():
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        return log

    return start


def test_a_plain_run_costs_a_bounded_number_of_git_processes_per_story(make_repo, counted):
    repo = make_repo(STORIES, script=write_each(STORIES),
                     policy='[scm]\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n'
                            '[review]\nenabled = false\n')
    log = counted()
    result = repo.cli("run")
    calls = subcommands(log)
    os.environ["PATH"] = os.environ["PATH"].split(os.pathsep, 1)[1]  # stop counting
    assert result.exit_code == 0, result.output
    assert set(repo.board_status(s.key) for s in STORIES) == {"done"}
    total = sum(calls.values())
    per_story = total / len(STORIES)
    assert per_story <= PER_STORY_BOUND, f"{per_story:.1f} git processes per story: {calls}"
    # Look-ups answered once per step, not once per helper.
    assert calls["worktree list"] <= 4 * len(STORIES), calls  # a park's, a take's checks
    assert calls["worktree prune"] <= 1, calls  # start-up clean-up only
    assert calls["check-ref-format"] == 0, calls  # names are checked in Python
    # Each story wrote only the file its footprint names: its drift check lists no folders of
    # its base (the `ls-tree` left are the start-up's look at what is committed, the first
    # admission's look at the target, and two per composition: the target's committed
    # `.gitattributes`, the only attributes a merge reads (trees/merge.py), and the folders
    # along the files the board edit writes (trees/edit.py)).
    assert calls["ls-tree"] <= 2 + 2 * len(STORIES), calls
    # One checkout for the run: each later story takes the worktree the one before it parked
    # (engine/workspace/pool.py), and the pool is emptied when the run completes.
    # read-tree: the pool's take, and each agent session's start record (a temporary index,
    # engine/worker/sessions.py) — one per story.
    assert calls["read-tree"] <= 1 + len(STORIES) and calls["worktree remove"] == 1, calls
    assert calls["worktree add"] == 1, calls  # the run's one new worktree
    # Each park and take moves it (`worktree move`); the CASes, the parks' detaches and the
    # worker's commits (plumbing: compose.commit_worktree) are `update-ref`s.
    assert calls["worktree move"] <= 2 * len(STORIES), calls
    # update-ref: the candidate and its CAS, the plumbing commit, a session start record
    # made and dropped (engine/worker/sessions.py).
    assert calls["update-ref"] <= 5 * len(STORIES), calls
    # The landed story branches go with `branch -D`; each worker commit and each candidate
    # commit is `commit-tree`'s; the candidate's board edit is one `hash-object` and a
    # `mktree` per folder depth of the board (three: the board's folder, its parent, the root).
    assert calls["branch"] == len(STORIES), calls
    # commit-tree: the worker's commit, the candidate, and a session's start record.
    assert calls["commit-tree"] == 3 * len(STORIES), calls
    assert calls["hash-object"] == len(STORIES) and calls["unpack-objects"] == 0, calls
    assert calls["mktree"] == 3 * len(STORIES), calls


def test_removing_a_worktree_that_is_not_there_only_asks_git_for_its_worktrees(tmp_path, counted):
    git = git_repo(tmp_path / "repo", {"a.txt": "a\n"})
    git.common_dir()  # asked once per repository
    log = counted()
    remove_worktree(git, tmp_path / "repo" / ".wt" / "never-made")
    assert subcommands(log) == Counter({"worktree list": 1})


def test_a_new_story_worktree_is_one_ref_one_checkout_and_its_removal_one_remove(tmp_path,
                                                                                 counted):
    git = git_repo(tmp_path / "repo", {"a.txt": "a\n"})
    base = git.rev("HEAD")
    path = tmp_path / "wts" / "s1"
    git.common_dir()  # asked once per repository
    log = counted()
    assert ensure_worktree(git, path, "bmad-loop/r/s1", base, branch_head=None) == base
    made = subcommands(log)
    remove_worktree(git, path)
    # The branch and the registration (`worktree add --no-checkout -b`) under the repository
    # lock, the checkout (`read-tree`) outside it, then the unlock.
    assert made == Counter({"worktree add": 1, "read-tree": 1, "worktree unlock": 1}), \
        log.read_text()
    assert subcommands(log) == made + Counter({"worktree remove": 1})
    assert [i.path for i in list_worktrees(git)] == [tmp_path / "repo"]
    assert git.rev("refs/heads/bmad-loop/r/s1") == base  # the branch stays; delete_branch drops it


def test_ensure_worktree_still_recovers_a_half_made_checkout_after_the_quick_path(tmp_path):
    git = git_repo(tmp_path / "repo", {"a.txt": "a\n"})
    base = git.rev("HEAD")
    path = tmp_path / "wts" / "s1"
    ensure_worktree(git, path, "bmad-loop/r/s1", base, branch_head=None)
    shutil.rmtree(path)  # a crash left the registration without its folder
    # The caller believes the branch is new; the registration says otherwise: the careful way.
    assert ensure_worktree(git, path, "bmad-loop/r/s1", base, branch_head=None) == base
    assert (path / "a.txt").read_text() == "a\n"
    assert git.current_branch(cwd=path) == "bmad-loop/r/s1"


def test_blobs_at_reads_several_paths_in_one_process(tmp_path, counted):
    files = {"a b.txt": "spaced\n", "dir/x.md": "x\n", "run.sh": "#!/bin/sh\n"}
    git = git_repo(tmp_path / "repo", files)
    head = git.rev("HEAD")
    log = counted()
    got = blobs_at(git, head, ["a b.txt", "dir/x.md", "missing.txt", "dir"])
    assert got == {"a b.txt": b"spaced\n", "dir/x.md": b"x\n", "missing.txt": None, "dir": None}
    assert subcommands(log) == Counter({"cat-file": 1})


def test_replace_blobs_writes_edits_and_deletions_in_one_tree_keeping_the_exec_bit(tmp_path):
    git = git_repo(tmp_path / "repo", {"a.txt": "a\n", "run.sh": "#!/bin/sh\n", "gone.txt": "g\n"})
    git.run("update-index", "--chmod=+x", "run.sh")
    git.run("commit", "-q", "-m", "exec", env=git.identity_env())
    tree = git.out("rev-parse", "HEAD^{tree}")
    new = replace_blobs(git, tree, {"run.sh": b"#!/bin/sh\necho hi\n", "gone.txt": None,
                                    "new dir/n.txt": b"n\n"})
    listing = git.out("ls-tree", "-r", new)
    entries = {line.split("\t")[1]: line.split()[0] for line in listing.splitlines()}
    assert entries == {"a.txt": "100644", "run.sh": "100755", "new dir/n.txt": "100644"}
    assert blobs_at(git, new, ["run.sh"]) == {"run.sh": b"#!/bin/sh\necho hi\n"}
    assert replace_blobs(git, tree, {}) == tree


def test_commit_worktree_reverts_a_lane_owned_file_the_story_added_or_deleted(tmp_path):
    git = git_repo(tmp_path / "repo", {"ledger/board.yaml": "board\n", "src/a.py": "A\n"})
    base = git.rev("HEAD")
    wt = tmp_path / "repo"
    (wt / "ledger" / "board.yaml").unlink()  # deleted by the agent
    write(wt / "ledger" / "new.yaml", "planted\n")  # added by the agent
    write(wt / "src" / "a.py", "A2\n")
    head, reverted = commit_worktree(Git(wt), wt, "story", base, ["ledger/**"])
    assert reverted == ["ledger/board.yaml", "ledger/new.yaml"]
    assert (wt / "ledger" / "board.yaml").read_text() == "board\n"
    assert not (wt / "ledger" / "new.yaml").exists()
    assert git.out("diff-tree", "-r", "--name-only", "--no-commit-id", base, head) == "src/a.py"
    assert git.out("status", "--porcelain") == ""


def test_the_lane_knows_the_date_of_every_story_a_long_ready_queue_holds(tmp_path, counted):
    # With fast agents the lane falls behind: many stories wait as ready, each committed by a
    # worker of this process. Composing each needs its commit date; none is read back by git.
    from bmad_loop.git.trees.compose import _commit_date

    git = git_repo(tmp_path / "repo", {"a.txt": "a\n"})
    wt = tmp_path / "wt"
    base = git.rev("HEAD")
    ensure_worktree(git, wt, "story", base)
    heads = []
    for i in range(40):
        (wt / f"f{i}.txt").write_text(f"{i}\n")
        head, _ = commit_worktree(git, wt, f"story {i}", heads[-1] if heads else base, [])
        heads.append(head)
    log = counted()
    dates = [_commit_date(git, head) for head in heads]
    assert subcommands(log)["cat-file"] == 0, subcommands(log)
    assert dates[0] == git.commit_date(heads[0]) and dates[-1] == git.commit_date(heads[-1])
