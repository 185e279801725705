"""A story commit has exactly the parents bmad-loop chooses (issue 45, item 4).

The agent can write its worktree's admin entry (the part of `.git` the box leaves writable). A
`MERGE_HEAD` there naming a sibling story's tip made the worker's porcelain `git commit` a merge
of the sibling: the sibling's own merge then became empty and its file was missing from the
target at exit 0. The worker now commits with plumbing (`write-tree`, `commit-tree` with the
parents it chooses, `update-ref` of HEAD expecting its old value) and removes `MERGE_HEAD`,
`MERGE_MSG`, `CHERRY_PICK_HEAD` and `REVERT_HEAD`; and the lane, before it composes a story,
refuses a commit whose parent is neither the story's own nor on its base (cause `branch`).

Real repositories; the run-level tests drive a real consumer (`run` spawned) and the scripted
agent, with file barriers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bmad_loop.git.runner import Git
from bmad_loop.git.trees.merge import foreign_parents
from bmad_loop.git.trees.compose import blob_at, commit_worktree
from bmad_loop.git.worktrees import ensure_worktree
from support import (MERGE_NONE, StoryDef, barrier_script, git, git_repo, go, inside,
                     status_when, wait_until)

BOARD = "sprint-status.yaml"
PLANTED = ("MERGE_HEAD", "MERGE_MSG", "CHERRY_PICK_HEAD", "REVERT_HEAD")


def _commit(g: Git, cwd: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
        (cwd / rel).write_text(text)
    g.run("add", "-A", cwd=cwd)
    g.run("commit", "-q", "-m", message, cwd=cwd, env=g.identity_env())
    return g.rev("HEAD", cwd=cwd)


def _parents(g: Git, sha: str) -> list[str]:
    return g.out("rev-list", "--parents", "-n1", sha).split()[1:]


def _plant(g: Git, worktree: Path, sha: str) -> list[Path]:
    """What a hostile agent writes into its worktree's admin entry: each names `sha`."""
    paths = [Path(g.out("rev-parse", "--git-path", name, cwd=worktree)) for name in PLANTED]
    paths = [p if p.is_absolute() else worktree / p for p in paths]
    for path in paths:
        path.write_text(f"{sha}\n" if path.name.endswith("HEAD") else "Merge a sibling\n")
    return paths


@pytest.fixture
def repo(tmp_path) -> Git:
    """A repository on `main` (a board, a source) with a sibling story branch one commit on,
    and a story branch at main."""
    g = git_repo(tmp_path / "repo", {BOARD: "1-1-a: ready-for-dev\n1-2-b: ready-for-dev\n",
                                     "src/a.py": "a = 0\n"})
    for name in ("sibling", "story"):  # worktrees of both, on main
        ensure_worktree(g, tmp_path / name, name, g.rev("main"))
    _commit(g, tmp_path / "sibling", {"src/b.py": "b = 1\n"}, "1-2-b: the sibling's work")
    return g


@pytest.fixture
def story(repo, tmp_path) -> Path:
    """The worktree of branch `story` (made by `repo`)."""
    return tmp_path / "story"


def test_a_planted_merge_head_names_no_parent_of_the_workers_commit(repo, story):
    base, sibling = repo.rev("main"), repo.rev("refs/heads/sibling")
    planted = _plant(repo, story, sibling)
    (story / "src/a.py").write_text("a = 1\n")
    message = "  1-1-a: A  \n\n\n  the story's body\t\n\n"
    head, _ = commit_worktree(repo, story, message, base, [BOARD])
    assert _parents(repo, head) == [base]  # before: [base, the sibling's tip]
    assert repo.rev("refs/heads/story") == head and repo.rev("HEAD", cwd=story) == head
    assert [p for p in planted if p.exists()] == []
    assert blob_at(repo, head, "src/b.py") is None
    assert blob_at(repo, head, "src/a.py") == b"a = 1\n"
    # Stored as `git commit -m` stores it, with the [scm] identity, unsigned.
    assert repo.run("cat-file", "commit", head).stdout.split("\n\n", 1)[1] == \
        repo.run("stripspace", input=message).stdout
    assert repo.out("log", "-1", "--format=%an <%ae>|%cn <%ce>|%G?", head) == \
        "bmad-loop <bmad-loop@localhost>|bmad-loop <bmad-loop@localhost>|N"
    # A person's later `git commit` in that worktree takes no planted parent either.
    git(story, "commit", "-q", "--allow-empty", "-m", "a person")
    assert _parents(repo, repo.rev("HEAD", cwd=story)) == [head]


def test_commit_worktree_makes_a_two_parent_merge_with_the_parents_it_is_given(repo, story, tmp_path):
    base = repo.rev("main")
    own = _commit(repo, story, {"src/a.py": "a = 1\n"}, "1-1-a: the story's work")
    # The target moves on: another story landed and the lane marked the board.
    _commit(repo, repo.repo_dir, {"src/c.py": "c = 1\n", BOARD: "1-1-a: ready-for-dev\n"
                                  "1-2-b: ready-for-dev\n1-0-c: done\n"}, "1-0-c landed")
    target = repo.rev("main")
    # A repair: the target merged into the worktree (git leaves MERGE_HEAD = target), the agent
    # edits the board too; then a MERGE_HEAD naming the sibling is planted over it.
    repo.run("merge", "--no-commit", "--no-ff", "-q", target, cwd=story, env=repo.identity_env())
    (story / BOARD).write_text("1-1-a: done\n")
    _plant(repo, story, repo.rev("refs/heads/sibling"))
    head, reverted = commit_worktree(repo, story, "1-1-a: repair", target, [BOARD],
                                     parents=[own, target])
    assert _parents(repo, head) == [own, target]
    assert reverted == [BOARD]
    assert blob_at(repo, head, BOARD) == blob_at(repo, target, BOARD)  # the board from the target
    assert blob_at(repo, head, "src/c.py") == b"c = 1\n" and blob_at(repo, head, "src/b.py") is None
    # The lane's check: with the base moved to the target, every parent is the story's or the
    # target's; the range from the story's first base shows the target as foreign.
    assert foreign_parents(repo, target, head) == []
    assert foreign_parents(repo, base, head) == [(head, target)]
    # A merge whose tree is HEAD's own is still made when its parents differ from HEAD alone.
    again, _ = commit_worktree(repo, story, "1-1-a: merge again", target, [BOARD],
                               parents=[head, repo.rev("refs/heads/sibling")])
    assert _parents(repo, again) == [head, repo.rev("refs/heads/sibling")]
    assert foreign_parents(repo, target, again) == [(again, repo.rev("refs/heads/sibling"))]


# ------------------------------------------------------------------------------ real runs
A = StoryDef("1-1-a", files=["src/a.py"])
B = StoryDef("1-2-b", files=["src/b.py"])


def _sibling_ready(make_repo, bar):
    """A run of A (first in plan order, its agent held in dev) and B (finished: ready, waiting
    for A). Returns (repo, the spawned run, A's worktree, B's head)."""
    script = barrier_script([A], bar)
    script[B.key] = {"dev": [{"write": {"src/b.py": "NAME = '1-2-b'\n"}}]}
    repo = make_repo([A, B], script=script, policy=MERGE_NONE.format(n=2, strategy="merge"))
    proc = repo.spawn("run")
    wait_until(lambda: inside(bar) == [A.key], what="a in dev")
    status_when(repo, lambda st: {s["key"]: s["state"] for s in st["stories"]}[B.key] == "ready",
                what="b ready")
    return repo, proc, Path(repo.story(A.key)["worktree"]), repo.story(B.key)["head_sha"]


def test_a_merge_head_planted_during_dev_does_not_erase_the_siblings_work(make_repo, bar):
    repo, proc, worktree, sibling = _sibling_ready(make_repo, bar)
    g = Git(repo.root)
    _plant(g, worktree, sibling)  # what the agent writes into its admin entry
    go(bar, A.key)
    assert proc.wait(timeout=60) == 0, repo.spawned_logs()
    assert repo.git("show", "main:src/a.py") == "NAME = '1-1-a'"
    assert repo.git("show", "main:src/b.py") == "NAME = '1-2-b'"  # before: missing at exit 0
    assert _parents(g, repo.story(A.key)["head_sha"]) == [repo.story(A.key)["base_sha"]]
    assert {repo.board_status(A.key), repo.board_status(B.key)} == {"done"}


def test_a_story_commit_with_a_siblings_tip_as_parent_escalates_naming_both(make_repo, bar,
                                                                             unboxed):
    repo, proc, worktree, sibling = _sibling_ready(make_repo, bar)
    main_before = repo.git("rev-parse", "main")
    # The unboxed agent merges the sibling's finished branch into its own: a real commit.
    git(worktree, "merge", "-q", "--no-ff", "--no-edit", sibling)
    merge = git(worktree, "rev-parse", "HEAD")
    go(bar, A.key)
    assert proc.wait(timeout=60) == 3, repo.spawned_logs()  # before: exit 0, b landed inside a
    story = repo.story(A.key)
    assert story["state"] == "escalated"
    assert f"commit {merge[:12]}" in story["reason"] and f"parent {sibling[:12]}" in story["reason"]
    escalated = [e for e in repo.journal() if e["kind"] == "story.escalated" and e["story"] == A.key]
    assert escalated[-1]["data"]["cause"] == "branch"
    assert repo.git("rev-parse", "main") == main_before  # nothing landed


def test_in_place_a_planted_merge_head_names_no_parent_either(make_repo, unboxed):
    # isolation = "none": the agent works in the project's own checkout, whose MERGE_HEAD is
    # `.git/MERGE_HEAD`; it names an unrelated branch's tip.
    repo = make_repo([A], policy='[scm]\nisolation = "none"\n[gates]\nmode = "none"\n')
    repo.git("switch", "-q", "-c", "other")
    (repo.root / "other.txt").write_text("not the story's\n")
    other = repo.commit_all("someone else's work")
    repo.git("switch", "-q", "main")
    repo.write_script({A.key: {"dev": [{"write": {"src/a.py": "NAME = '1-1-a'\n",
                                                  ".git/MERGE_HEAD": f"{other}\n"}}]}})
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    head = repo.story(A.key)["head_sha"]
    assert _parents(Git(repo.root), head) == [repo.story(A.key)["base_sha"]]  # before: + other
    assert repo.git("show", "main:src/a.py") == "NAME = '1-1-a'"
    assert "other.txt" not in repo.git("ls-tree", "-r", "--name-only", "main")
    assert not (repo.root / ".git" / "MERGE_HEAD").exists()
