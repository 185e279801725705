"""A target moved by anyone but the lane is seen, journaled and, by default, paused on.

The second story's agent blocks on a file barrier; while it is inside, the target moves by one
of the ways the field does it; then the lane composes on a target that is not where it left it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support import MERGE_NONE, StoryDef, barrier_script, git, go, inside, wait_until

A, B = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])


def _hotfix_commit(repo) -> str:
    """A person's hotfix, committed on the checked-out target."""
    (repo.root / "HOTFIX.md").write_text("fixed by hand\n")
    git(repo.root, "add", "HOTFIX.md")
    git(repo.root, "-c", "user.name=Human", "-c", "user.email=h@example.com",
        "commit", "-q", "--no-verify", "-m", "hotfix")
    return git(repo.root, "rev-parse", "HEAD")


def _commit_object(repo) -> str:
    """A commit on top of main made with plumbing only (same tree: the checkout stays valid)."""
    main = git(repo.root, "rev-parse", "main")
    tree = git(repo.root, "rev-parse", "main^{tree}")
    return git(repo.root, "-c", "user.name=Daemon", "-c", "user.email=d@example.com",
               "commit-tree", tree, "-p", main, "-m", "a stray process wrote this")


def _raw_ref_write(repo) -> str:
    """A process writing .git/refs/heads/main directly, as no git command would let it."""
    sha = _commit_object(repo)
    (repo.root / ".git" / "refs" / "heads" / "main").write_text(sha + "\n")
    return sha


def _packed_refs_write(repo) -> str:
    """The target only in packed-refs, rewritten there."""
    sha = _commit_object(repo)
    git(repo.root, "pack-refs", "--all", "--prune")
    packed = repo.root / ".git" / "packed-refs"
    old = git(repo.root, "rev-parse", "main")
    packed.write_text(packed.read_text().replace(f"{old} refs/heads/main", f"{sha} refs/heads/main"))
    return sha


def _update_ref_without_guard(repo) -> str:
    """Plain git run by a process that escaped the guard's environment (a daemon)."""
    sha = _commit_object(repo)
    git(repo.root, "update-ref", "refs/heads/main", sha)
    return sha


def is_ancestor(repo, old: str, new: str) -> bool:
    return subprocess.run(["git", "merge-base", "--is-ancestor", old, new], cwd=repo.root).returncode == 0


VECTORS = {"hotfix": _hotfix_commit, "raw-ref-file": _raw_ref_write,
           "packed-refs": _packed_refs_write, "update-ref": _update_ref_without_guard}


@pytest.mark.parametrize("vector", list(VECTORS))
def test_a_foreign_move_pauses_the_run_naming_the_commit_and_resume_adopts_it(make_repo, bar, vector):
    repo = make_repo([A, B], script=barrier_script([A, B], bar),
                     policy=MERGE_NONE.format(n=1, strategy="merge"))
    proc = repo.spawn("run")
    wait_until(lambda: A.key in inside(bar), what="a inside")
    go(bar, A.key)
    wait_until(lambda: B.key in inside(bar), what="b inside (a integrated)")
    after_a = git(repo.root, "rev-parse", "main")
    foreign = VECTORS[vector](repo)
    assert git(repo.root, "rev-parse", "main") == foreign
    go(bar, B.key)

    assert proc.wait(timeout=120) == 3  # needs a human
    status = repo.status()
    assert status["run"]["state"] == "paused"
    assert foreign[:12] in status["run"]["reason"]
    moved = [e for e in repo.journal() if e["kind"] == "target.moved"]
    assert len(moved) == 1
    assert (moved[0]["data"]["old"], moved[0]["data"]["new"]) == (after_a, foreign)
    assert moved[0]["data"]["commits"] == [foreign] and moved[0]["data"]["action"] == "pause"
    assert git(repo.root, "rev-parse", "main") == foreign  # nothing of b landed unseen
    # b was never composed: the move was found first, so it waits as it was, ready.
    assert [s["state"] for s in status["stories"]] == ["integrated", "ready"]

    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    assert [e["kind"] for e in repo.journal()].count("target.adopted") == 1
    assert is_ancestor(repo, foreign, "main")
    assert [s["state"] for s in repo.status()["stories"]] == ["integrated", "integrated"]


def test_with_accept_a_foreign_move_is_journaled_and_the_story_composed_on_top(make_repo, bar):
    policy = MERGE_NONE.format(n=1, strategy="merge").replace(
        "[scm]\n", '[scm]\non_foreign_move = "accept"\n')
    repo = make_repo([A, B], script=barrier_script([A, B], bar), policy=policy)
    proc = repo.spawn("run")
    wait_until(lambda: A.key in inside(bar), what="a inside")
    go(bar, A.key)
    wait_until(lambda: B.key in inside(bar), what="b inside")
    foreign = _hotfix_commit(repo)
    go(bar, B.key)
    assert proc.wait(timeout=120) == 0
    moved = [e for e in repo.journal() if e["kind"] == "target.moved"]
    assert [m["data"]["action"] for m in moved] == ["accept"] and moved[0]["data"]["new"] == foreign
    assert is_ancestor(repo, foreign, "main")


def test_a_story_branch_written_after_ready_is_not_integrated_but_escalated(make_repo, bar):
    """What the lane integrates is the commit the worker recorded at `ready`: a sibling agent
    that writes into another story's branch afterwards gets nothing onto the target."""
    policy = MERGE_NONE.format(n=2, strategy="merge")
    script = barrier_script([A, B], bar)
    repo = make_repo([A, B], script=script, policy=policy)
    proc = repo.spawn("run")
    wait_until(lambda: {A.key, B.key} <= set(inside(bar)), what="both inside")
    go(bar, B.key)  # b finishes first and waits, ready, behind a
    wait_until(lambda: repo.story(B.key)["state"] == "ready", what="b ready")
    b = repo.story(B.key)
    # Someone else writes into b's branch (its own worktree went to the pool at ready: the
    # work is all on the branch), through a checkout of their own.
    worktree = str(repo.root.parent / "sneaky")
    git(repo.root, "worktree", "add", "-q", worktree, b["branch"])
    (Path(worktree) / "planted.py").write_text("PLANTED = True\n")
    git(worktree, "add", "planted.py")
    git(worktree, "commit", "-q", "--no-verify", "-m", "sneaked in")
    planted = git(worktree, "rev-parse", "HEAD")
    go(bar, A.key)

    assert proc.wait(timeout=120) == 3
    b = repo.story(B.key)
    assert b["state"] == "escalated" and "its worker recorded" in b["reason"]
    mismatch = [e for e in repo.journal() if e["kind"] == "story.branch_mismatch"]
    assert mismatch[0]["data"]["found"] == planted and mismatch[0]["data"]["recorded"] == b["head_sha"]
    assert not is_ancestor(repo, planted, "main")
    assert repo.story(A.key)["state"] == "integrated"


def test_a_state_database_edited_behind_the_lanes_back_is_reported_not_trusted(make_repo):
    """An agent (or a person) marks a story integrated in the state database directly: the
    lane checks the rows against git, reports the contradiction and pauses."""
    import sqlite3

    repo = make_repo([A, B], script={A.key: {"dev": [{"write": {"src/a.py": "A\n"}}]},
                                     B.key: {"dev": [{"write": {"src/b.py": "B\n"}}]}},
                     policy=MERGE_NONE.format(n=1, strategy="merge"))
    run_id = repo.cli("enqueue").output.strip()
    assert repo.cli("stop", run_id).exit_code == 0
    db = repo.root / ".bmad-loop" / "state.db"
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE stories SET state = 'integrated', integrated_sha = ? WHERE key = ?",
                     ("f" * 40, A.key))
    result = repo.cli("resume", run_id)
    assert result.exit_code == 3, result.output
    run = repo.status(run_id)["run"]
    assert run["state"] == "paused" and "contradict git" in run["reason"] and A.key in run["reason"]
    assert [e["data"]["stories"] for e in repo.journal(run_id) if e["kind"] == "rows.contradicted"] == [[A.key]]
    assert git(repo.root, "rev-list", "--count", "main") == "1"  # nothing moved meanwhile
