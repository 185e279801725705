"""The human path after an escalation is safe (issue 44, item 5).

A person who merges or rebases the target into an escalated story's branch, commits and resumes
(docs/operations.md, "A paused run") must never get a lane-owned ledger reverted: the guard
compares with the story's current merge base with the target, and the story's `base_sha` moves
there (`story.base_moved`). `retry STORY --from integrate` takes such a hand-fixed branch to the
lane: its worktree verify runs, only the agent is skipped.

The sprint is the newcomer's: two stories with disjoint footprints that both edit README.md. The
first integrates and marks the board; the second conflicts with it and escalates. Real git, the
scripted agent as a real process, a real consumer (`run` spawned), the CLI in process.
"""

from __future__ import annotations

import json

from support import MERGE_NONE, StoryDef, barrier_script, git, go, inside, wait_until

A = StoryDef("1-1-a", files=["src/a.py"])
B = StoryDef("1-2-b", files=["src/b.py"])
# Both stories' worktree verify runs this: the log shows it ran, and the candidate's too.
VERIFY = 'test -f src/__init__.py && echo "verified in $PWD"'
POLICY = (MERGE_NONE.format(n=2, strategy="merge") + f"[verify]\ncommands = [{json.dumps(VERIFY)}]\n"
          "[limits]\nmax_repairs = 0\n")  # the person's path: the story escalates at once


def _sessions(repo, key: str, phase: str) -> int:
    return len([c for c in repo.calls() if c["key"] == key and c["phase"] == phase])


def _escalated_second_story(make_repo, bar):
    """Run the sprint until the second story escalates on its merge conflict with the first,
    which integrated and marked the board `done` on main. Returns (repo, the second story)."""
    script = barrier_script([A, B], bar)
    script[A.key]["dev"][0]["write"] = {"src/a.py": "A = 1\n", "README.md": "# by a\n"}
    script[B.key]["dev"][0]["write"] = {"src/b.py": "B = 1\n", "README.md": "# by b\n"}
    repo = make_repo([A, B], script=script, policy=POLICY)
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside dev")  # B starts on A's base
    go(bar, A.key)
    go(bar, B.key)
    assert proc.wait(timeout=60) == 3, repo.spawned_logs()
    assert repo.board_status(A.key) == "done"
    story = repo.story(B.key)
    assert story["state"] == "escalated" and "merge conflict" in story["reason"], story
    return repo, story


def _merge_the_target_by_hand(repo, wt: str) -> None:
    """docs/operations.md, "Fixing a story's branch by hand", steps 2 and 3: in the story's
    worktree merge the target, resolve what git could not merge (README.md), commit."""
    git(repo.root, "-C", wt, "merge", "-q", "main", check=False)  # conflicts in README.md
    (repo.root / wt / "README.md").write_text("# by a and b\n")
    git(repo.root, "-C", wt, "add", "README.md")
    git(repo.root, "-C", wt, "commit", "-q", "--no-edit")


def _after_landing(repo, story_before: dict) -> None:
    """What the person's fix must give: both stories done on main's board, B's work landed,
    the conflict resolved as they resolved it, no agent session for B again, no board revert."""
    assert repo.story(B.key)["state"] == "integrated"
    assert repo.board_status(A.key) == "done"  # before the fix: ready-for-dev again
    assert repo.board_status(B.key) == "done"
    assert repo.git("show", "main:src/a.py") == "A = 1"
    assert repo.git("show", "main:src/b.py") == "B = 1"
    assert repo.git("show", "main:README.md") == "# by a and b"
    assert _sessions(repo, B.key, "dev") == 1
    assert not repo.events("story.ledger_reverted", B.key)[1:]  # only the agent's, if any
    moved = repo.events("story.base_moved", B.key)
    assert moved and moved[0]["data"]["old"] == story_before["base_sha"]
    assert moved[0]["data"]["new"] == story_before["target_main"]
    assert repo.story(B.key)["base_sha"] == story_before["target_main"]


def test_merging_the_target_into_an_escalated_branch_then_resume_keeps_the_board(make_repo, bar):
    # docs/operations.md: "resolve on the story branch (merge the target into it), commit, resume".
    repo, story = _escalated_second_story(make_repo, bar)
    story["target_main"] = repo.git("rev-parse", "main")
    wt = story["worktree"]
    _merge_the_target_by_hand(repo, wt)
    # The person's merge brought main's board (1-1-a: done) into the branch.
    assert repo.board_status(A.key, ref=story["branch"]) == "done"
    repo.write_script({})  # no agent may run again
    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    _after_landing(repo, story)
    assert repo.events("story.human_fix", B.key)


def test_rebasing_the_branch_onto_the_target_then_resume_keeps_the_board(make_repo, bar):
    repo, story = _escalated_second_story(make_repo, bar)
    story["target_main"] = repo.git("rev-parse", "main")
    wt = story["worktree"]
    git(repo.root, "-C", wt, "rebase", "main", check=False)  # stops on README.md
    (repo.root / wt / "README.md").write_text("# by a and b\n")
    git(repo.root, "-C", wt, "add", "README.md")
    git(repo.root, "-C", wt, "-c", "core.editor=true", "rebase", "--continue")
    assert repo.git("merge-base", "main", story["branch"]) == story["target_main"]
    repo.write_script({})
    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    _after_landing(repo, story)


def test_retry_from_integrate_takes_a_hand_fixed_branch_through_verify_to_the_lane(make_repo, bar):
    repo, story = _escalated_second_story(make_repo, bar)
    story["target_main"] = repo.git("rev-parse", "main")
    wt = story["worktree"]
    _merge_the_target_by_hand(repo, wt)
    fixed = repo.git("rev-parse", story["branch"])
    verified_before = len(repo.events("verify.passed", B.key))
    result = repo.cli("retry", B.key, "--from", "integrate")
    assert result.exit_code == 0, result.output  # before: exit 2, "moved"
    row = repo.story(B.key)
    assert (row["state"], row["phase"]) == ("pending", "prepare")
    retry = repo.events("story.retry", B.key)[-1]["data"]
    assert (retry["from"], retry["by"], retry["head_sha"]) == ("integrate", "retry", fixed)
    repo.write_script({})
    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    _after_landing(repo, story)
    # Its worktree verify ran on the person's commit; no agent session of any phase did.
    assert len(repo.events("verify.passed", B.key)) == verified_before + 1
    assert [c for c in repo.calls() if c["key"] == B.key][2:] == []  # dev + review of run 1
    repo.git("merge-base", "--is-ancestor", fixed, "main")  # the person's very commit landed


def test_a_target_that_moves_again_after_the_persons_merge_keeps_the_board_too(make_repo, bar):
    repo, story = _escalated_second_story(make_repo, bar)
    story["target_main"] = repo.git("rev-parse", "main")
    wt = story["worktree"]
    _merge_the_target_by_hand(repo, wt)
    # Someone else commits on main before the resume (adopted as the new baseline).
    (repo.root / "NOTES.md").write_text("a colleague's note\n")
    repo.commit_all("a colleague's commit")
    repo.write_script({})
    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    _after_landing(repo, story)  # the base is the target the person merged, not the newest
    assert repo.git("show", "main:NOTES.md") == "a colleague's note"
