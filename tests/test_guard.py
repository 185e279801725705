"""The target guard: in worktree isolation an agent cannot move the target branch, not even briefly.

A real run with the scripted agent, whose dev session tries one way of writing `main` from its
story worktree: a commit on it, `update-ref`, `branch -f`, `git push . HEAD:main`. Each is tried
with the target checked out in the main repository and with the main repository on a detached
HEAD (the target then checked out nowhere, so git's own "checked out elsewhere" refusals do not
apply and only the guard stands in the way). Every time: `main` and its reflog are unchanged
(the ref never moved, not even for a moment), the journal has `guard.refused`, the story is
escalated with a reason naming the target, and `run` exits 3.
"""

from __future__ import annotations

import pytest

from support import StoryDef

# What bmad-loop does about an unboxed agent (boxed: tests/test_sandbox_escape.py).
pytestmark = pytest.mark.usefixtures("unboxed")

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
OWN_COMMIT = {"write": {"src/alpha.py": "NAME = 'alpha'\n"}, "commit": True}

WRITES = {
    # Put the target in the story worktree, then commit on it.
    "commit on the target": {"checked-out": [["checkout", "--ignore-other-worktrees", "main"],
                                             ["commit", "--allow-empty", "-m", "sneaky"]],
                             "detached": [["checkout", "main"],
                                          ["commit", "--allow-empty", "-m", "sneaky"]]},
    "update-ref": [["update-ref", "refs/heads/main", "HEAD"]],
    "branch -f": [["branch", "-f", "main", "HEAD"]],
    "push to the target": [["push", ".", "HEAD:main"]],
}
CASES = [
    ("commit on the target", "checked-out"),
    ("commit on the target", "detached"),
    ("update-ref", "checked-out"),
    ("update-ref", "detached"),
    # branch -f on a branch checked out in another worktree is refused by git itself (see below).
    ("branch -f", "detached"),
    ("push to the target", "checked-out"),
    ("push to the target", "detached"),
]


def step_for(write: str, layout: str) -> dict:
    commands = WRITES[write]
    if isinstance(commands, dict):
        return {"git": commands[layout]}
    # The agent commits on its own branch first, so HEAD differs from the target.
    return dict(OWN_COMMIT, git=commands)


def reflog(repo) -> str:
    return repo.git("reflog", "show", "--format=%H %gs", "refs/heads/main")


@pytest.mark.parametrize(("write", "layout"), CASES, ids=[f"{w}-{l}" for w, l in CASES])
def test_an_agent_writing_the_target_is_refused_journaled_and_escalated_and_main_never_moves(
        make_repo, write, layout):
    policy = '[scm]\ntarget_branch = "main"\n' if layout == "detached" else ""
    repo = make_repo([ALPHA], policy=policy,
                     script={ALPHA.key: {"dev": [step_for(write, layout)]}})
    if layout == "detached":
        repo.git("checkout", "-q", "--detach")
    main_before, reflog_before = repo.git("rev-parse", "main"), reflog(repo)

    result = repo.cli("run")

    assert result.exit_code == 3, result.output
    assert repo.git("rev-parse", "main") == main_before
    assert reflog(repo) == reflog_before  # not moved and put back: never moved at all
    refused = [e for e in repo.journal() if e["kind"] == "guard.refused"]
    assert [e["story"] for e in refused] == [ALPHA.key]
    assert refused[0]["data"]["phase"] == "dev"
    assert refused[0]["data"]["attempts"] and all(
        "refs/heads/main" in line for line in refused[0]["data"]["attempts"])
    status = repo.status()
    story = status["stories"][0]
    assert story["state"] == "escalated"
    assert "refs/heads/main" in story["reason"] and "target branch" in story["reason"]
    assert status["run"]["state"] == "paused"
    # The agent saw git fail (the guard speaks on stderr, which the session log keeps).
    log = open(story["log"]).read()
    assert "bmad-loop: refused" in log
    # Nothing about the attempt was integrated: no advance, no candidate.
    assert not any(e["kind"] == "target.advanced" for e in repo.journal())
    assert status["candidates"] == []


def test_an_agent_committing_in_the_main_checkout_of_the_target_is_refused_too(make_repo):
    """Outside its worktree, in the checkout where `main` is checked out: still refused."""
    repo = make_repo([ALPHA])
    repo.write_script({ALPHA.key: {"dev": [{"git": [
        ["-C", str(repo.root), "commit", "--allow-empty", "-m", "sneaky"]]}]}})
    main_before, reflog_before = repo.git("rev-parse", "main"), reflog(repo)

    result = repo.cli("run")

    assert result.exit_code == 3, result.output
    assert repo.git("rev-parse", "main") == main_before and reflog(repo) == reflog_before
    assert [e["story"] for e in repo.journal() if e["kind"] == "guard.refused"] == [ALPHA.key]
    story = repo.status()["stories"][0]
    assert story["state"] == "escalated" and "refs/heads/main" in story["reason"]
    assert repo.git("status", "--porcelain") == ""


def test_branch_f_on_a_target_checked_out_in_the_main_repository_is_refused_by_git_itself(make_repo):
    """Not the guard's case: git refuses to force a branch checked out in another worktree.

    The ref does not move by the agent's hand; the run goes on and only the lane's CAS
    advances `main` (every new reflog entry is the lane's).
    """
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [
        dict(OWN_COMMIT, git=[["branch", "-f", "main", "HEAD"]])]}})
    entries_before = reflog(repo).splitlines()

    result = repo.cli("run")

    assert result.exit_code == 0, result.output
    run_id = repo.status()["run"]["id"]
    log = (repo.root / ".bmad-loop" / "logs" / run_id / ALPHA.key / "dev-1.log").read_text()
    assert "git branch -f main HEAD -> 128" in log
    new_entries = reflog(repo).splitlines()[:-len(entries_before)]
    assert new_entries and all(line.endswith("bmad-loop: advance") for line in new_entries)
    assert not any(e["kind"] == "guard.refused" for e in repo.journal())


def test_the_guard_leaves_the_agents_own_branch_writable(make_repo):
    """The hooks refuse only the target: commits and ref moves on the story branch go through."""
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [
        dict(OWN_COMMIT, git=[["tag", "agent-tag"], ["branch", "scratch-branch"]])]}})
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert not any(e["kind"] == "guard.refused" for e in repo.journal())
    assert repo.git("show", "main:src/alpha.py") == "NAME = 'alpha'"
    assert repo.git("rev-parse", "--verify", "-q", "refs/tags/agent-tag")
