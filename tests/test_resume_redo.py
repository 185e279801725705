"""What `resume` and `retry` redo after an escalation (issue 33, item 3).

A story escalated at integration for a cause outside it (local changes in the target checkout,
a target that kept moving, a verification that could not run) goes back to `ready` on resume:
the very commit its worker recorded is composed, verified and integrated again, with no agent
session. A conflict or a failed candidate verification keeps the documented path (a fresh
attempt, the failure as feedback). `retry --from dev|review|integrate` is a person's choice.
Real git, the scripted agent as a real process, the CLI in process.
"""

from __future__ import annotations

import json

import pytest

from support import MERGE_NONE, StoryDef, git, query, write_each

A = StoryDef("1-1-a", files=["src/a.py"])
B = StoryDef("1-2-b", files=["src/b.py"])
VERIFIED = MERGE_NONE.format(n=1, strategy="merge") + '[verify]\ncommands = ["true"]\n'


def _sessions(repo, key: str, phase: str) -> int:
    return len([c for c in repo.calls() if c["key"] == key and c["phase"] == phase])


def _escalate_on_a_dirty_checkout(make_repo, stories=(A,), policy: str = VERIFIED, backend=None):
    """A run whose first story escalates at its advance: an untracked src/a.py of a person's
    in the target checkout overlaps its candidate (which passed verification)."""
    extra = backend.policy_toml() if backend is not None else ""
    repo = make_repo(list(stories), script=write_each(stories), policy=policy + extra)
    if backend is not None:
        backend.adopt_project(repo.root)
    (repo.root / "src/a.py").write_text("a person's own draft\n")
    assert repo.cli("run").exit_code == 3
    story = repo.story(A.key)
    assert story["state"] == "escalated" and "overlap the candidate: src/a.py" in story["reason"]
    return repo, story


def test_resume_after_a_dirty_checkout_escalation_integrates_the_same_commit_without_an_agent(
        make_repo, backend):
    repo, story = _escalate_on_a_dirty_checkout(make_repo, backend=backend)
    assert (_sessions(repo, A.key, "dev"), _sessions(repo, A.key, "review")) == (1, 1)
    repo.git("stash", "-u", "-q")  # the person puts the draft away, as the reason says
    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    # No session ran again (before the fix: dev and review ran a second time).
    assert (_sessions(repo, A.key, "dev"), _sessions(repo, A.key, "review")) == (1, 1)
    assert repo.story(A.key)["state"] == "integrated"
    assert repo.git("show", "main:src/a.py") == f"NAME = '{A.key}'"
    repo.git("merge-base", "--is-ancestor", story["head_sha"], "main")  # that very commit
    assert repo.events("story.escalated", A.key)[0]["data"]["cause"] == "checkout"
    retry = repo.events("story.retry", A.key)[-1]["data"]
    assert (retry["from"], retry["by"], retry["cause"]) == ("integrate", "resume", "checkout")
    # Composed and verified again: a second candidate, and it advanced.
    states = [c["state"] for c in repo.status()["candidates"] if c["story"] == A.key]
    assert states == ["abandoned", "advanced"]
    assert repo.git("stash", "list")  # the person's draft is theirs, untouched


def test_resume_twice_changes_nothing_more(make_repo):
    repo, _ = _escalate_on_a_dirty_checkout(make_repo)
    # The draft is still there: resume sends it back to ready, the same overlap escalates it
    # again, and a second resume does the same: never an agent.
    assert repo.cli("resume").exit_code == 3
    assert repo.cli("resume").exit_code == 3
    assert _sessions(repo, A.key, "dev") == 1
    assert [e["data"]["cause"] for e in repo.events("story.escalated", A.key)] == ["checkout"] * 3
    (repo.root / "src/a.py").unlink()
    assert repo.cli("resume").exit_code == 0
    assert _sessions(repo, A.key, "dev") == 1


def test_a_branch_a_person_changed_is_verified_as_their_fix_not_integrated_as_recorded(make_repo):
    repo, story = _escalate_on_a_dirty_checkout(make_repo)
    wt = story["worktree"]
    (repo.root / "src/a.py").unlink()
    open(f"{wt}/src/a.py", "w").write("NAME = 'fixed by a person'\n")
    git(repo.root, "-C", wt, "commit", "-q", "-am", "a person's fix")
    assert repo.cli("resume").exit_code == 0
    assert repo.git("show", "main:src/a.py") == "NAME = 'fixed by a person'"
    assert repo.events("story.human_fix", A.key) and _sessions(repo, A.key, "dev") == 1


def test_a_deleted_branch_gets_a_fresh_attempt_as_before(make_repo):
    repo, story = _escalate_on_a_dirty_checkout(make_repo)
    (repo.root / "src/a.py").unlink()
    repo.git("worktree", "remove", "--force", story["worktree"])
    repo.git("branch", "-D", story["branch"])
    assert repo.cli("resume").exit_code == 0
    assert _sessions(repo, A.key, "dev") == 2  # its recorded commit is not on a branch any more
    assert repo.events("story.retry", A.key)[-1]["data"]["from"] == "dev"


def test_a_failed_candidate_verification_still_gets_a_fresh_attempt_with_the_failure(make_repo, tmp_path, escalate_at_once):
    # The verify command passes in the story worktree and fails in the candidate worktree.
    verify = 'case "$PWD" in */candidates/*) echo combined-check-failed; exit 1;; esac'
    policy = MERGE_NONE.format(n=1, strategy="merge") + f"[verify]\ncommands = [{json.dumps(verify)}]\n"
    repo = make_repo([A], script=write_each([A]), policy=policy)
    assert repo.cli("run").exit_code == 3
    repo.write_policy(MERGE_NONE.format(n=1, strategy="merge"))
    assert repo.cli("resume", "--reload-policy").exit_code == 0
    dev = [c for c in repo.calls() if c["key"] == A.key and c["phase"] == "dev"]
    assert len(dev) == 2 and "candidate verification failed" in dev[1]["prompt"]
    assert repo.events("story.escalated", A.key)[0]["data"]["cause"] == "verify-failed"


# ------------------------------------------------------------------ bmad-loop retry
def _rows(repo) -> tuple:
    """Everything a refused retry must leave as it was."""
    return (query(repo, "SELECT key, state, phase, head_sha, dev_attempts FROM stories ORDER BY seq"),
            query(repo, "SELECT id, state FROM candidates ORDER BY id"),
            query(repo, "SELECT count(*) FROM events"), repo.bmad_branches())


def test_retry_from_integrate_sends_the_recorded_commit_back_without_an_agent(make_repo):
    repo, story = _escalate_on_a_dirty_checkout(make_repo)
    (repo.root / "src/a.py").unlink()
    result = repo.cli("retry", A.key, "--from", "integrate")
    assert result.exit_code == 0, result.output
    assert "retry from integrate (ready)" in result.output and "bmad-loop resume" in result.output
    assert repo.story(A.key)["state"] == "ready"
    assert repo.cli("resume").exit_code == 0
    assert _sessions(repo, A.key, "dev") == 1 and repo.story(A.key)["state"] == "integrated"
    assert repo.events("story.retry", A.key)[-1]["data"]["by"] == "retry"


def test_retry_from_review_reviews_the_branch_as_it_is_and_from_dev_develops_it_again(make_repo):
    repo, story = _escalate_on_a_dirty_checkout(make_repo, stories=(A, B))
    (repo.root / "src/a.py").unlink()
    run_id = repo.status()["run"]["id"]
    assert repo.cli("retry", run_id, A.key, "--from", "review").exit_code == 0
    assert repo.cli("resume").exit_code == 0
    assert (_sessions(repo, A.key, "dev"), _sessions(repo, A.key, "review")) == (1, 2)
    assert repo.git("show", "main:src/a.py") == f"NAME = '{A.key}'"
    # Every story has landed now: nothing more to retry.
    before = _rows(repo)
    for key in (A.key, B.key):
        refused = repo.cli("retry", key, "--from", "dev")
        assert refused.exit_code == 2 and "nothing to retry" in refused.output
    assert _rows(repo) == before


def test_retry_from_dev_runs_dev_again_with_a_fresh_budget(make_repo):
    repo, _ = _escalate_on_a_dirty_checkout(make_repo)
    (repo.root / "src/a.py").unlink()
    assert repo.cli("retry", A.key, "--from", "dev").exit_code == 0
    assert repo.story(A.key)["state"] == "pending"
    assert repo.cli("resume").exit_code == 0
    assert _sessions(repo, A.key, "dev") == 2 and repo.story(A.key)["state"] == "integrated"


# (`--from integrate` on a branch a person moved is no longer refused: it is taken as their fix,
# tests/test_human_fix.py.)
@pytest.mark.parametrize("args,words", [
    (("no-such-story", "--from", "dev"), "no story"),
    ((A.key, "--from", "sideways"), "Invalid value"),
])
def test_a_refused_retry_is_exit_2_and_changes_nothing(make_repo, args, words):
    repo, story = _escalate_on_a_dirty_checkout(make_repo)
    git(repo.root, "-C", story["worktree"], "commit", "-q", "--allow-empty", "-m", "a person")
    before = _rows(repo)
    result = repo.cli("retry", *args)
    assert result.exit_code == 2 and words in result.output, result.output
    assert _rows(repo) == before


def test_retry_of_a_story_that_is_working_is_refused(make_repo, bar):
    from support import barrier_script, go, inside, wait_until

    repo = make_repo([A], script=barrier_script([A], bar), policy=VERIFIED)
    proc = repo.spawn("run")
    wait_until(lambda: inside(bar) == [A.key], what="a in dev")
    before = _rows(repo)
    for start in ("dev", "review", "integrate"):
        result = repo.cli("retry", A.key, "--from", start)
        assert result.exit_code == 2 and "working (it is being worked on)" in result.output
    assert _rows(repo) == before
    go(bar, A.key)
    assert proc.wait(timeout=60) == 0


def test_validate_warns_about_local_changes_in_the_target_checkout(make_repo):
    repo = make_repo([A], script=write_each([A]), policy=VERIFIED)
    clean = json.loads(repo.cli("validate", "--json").output)
    assert not [c for c in clean["checks"] if c["name"] == "checkout"]
    (repo.root / "src/a.py").write_text("a person's own draft\n")
    (repo.root / "README.md").write_text("edited\n")
    result = repo.cli("validate", "--json")
    assert result.exit_code == 0, result.output  # a warning, not an error
    warned = [c for c in json.loads(result.output)["checks"] if c["name"] == "checkout"]
    assert [c["status"] for c in warned] == ["warn"]
    assert "2 uncommitted change(s) on main (README.md, src/a.py)" in warned[0]["detail"]
    assert repo.git("status", "--porcelain") == "M README.md\n?? src/a.py"  # nothing changed


def test_resume_after_the_target_kept_moving_integrates_the_same_commit_with_a_fresh_budget(make_repo, unboxed):
    # The candidate's verify command commits on the target each time: every CAS goes stale.
    repo = make_repo([A], script=write_each([A]))
    mover = (f'case "$PWD" in */candidates/*) cd {repo.root} && date +%s%N > human.txt && '
             'git add human.txt && git -c user.name=h -c user.email=h@x commit -qm human ;; esac; true')
    scm = MERGE_NONE.format(n=1, strategy="merge").replace("[scm]\n", '[scm]\non_foreign_move = "accept"\n')
    repo.write_policy(scm + f'[limits]\nmax_recompose = 2\n[verify]\ncommands = [{json.dumps(mover)}]\n')
    assert repo.cli("run").exit_code == 3
    repo.write_policy(scm + '[limits]\nmax_recompose = 2\n[verify]\ncommands = ["true"]\n')
    result = repo.cli("resume", "--reload-policy")
    # Before the fix: dev ran again, then the three old stale candidates escalated it at once.
    assert result.exit_code == 0, result.output
    assert _sessions(repo, A.key, "dev") == 1
    states = [c["state"] for c in repo.status()["candidates"]]
    assert states == ["stale", "stale", "stale", "advanced"]
    assert repo.git("show", "main:src/a.py") == f"NAME = '{A.key}'"
    assert repo.events("story.escalated", A.key)[0]["data"]["cause"] == "target-moving"


def test_a_worktree_a_person_removed_is_no_reason_to_run_an_agent(make_repo):
    repo, story = _escalate_on_a_dirty_checkout(make_repo, stories=(A, B))
    (repo.root / "src/a.py").unlink()
    repo.git("worktree", "remove", "--force", story["worktree"])  # the branch stays
    assert repo.cli("retry", A.key, "--from", "review").exit_code == 0
    assert repo.cli("resume").exit_code == 0
    # Its worktree was made again from the branch; verified and reviewed, never developed again.
    assert (_sessions(repo, A.key, "dev"), _sessions(repo, A.key, "review")) == (1, 2)
    assert repo.git("show", "main:src/a.py") == f"NAME = '{A.key}'"
    assert {s["key"]: s["state"] for s in repo.status()["stories"]} == {
        A.key: "integrated", B.key: "integrated"}


def test_retry_of_a_held_story_verifies_it_again_and_it_waits_for_a_new_sign_off(make_repo):
    held = StoryDef(A.key, files=A.files, extra_front_matter={"merge_class": "operator"})
    repo = make_repo([held], script=write_each([held]), policy=VERIFIED)
    assert repo.cli("run").exit_code == 3
    assert repo.story(A.key)["state"] == "held"
    assert repo.cli("retry", A.key, "--from", "integrate").exit_code == 0
    assert [c["state"] for c in repo.status()["candidates"]] == ["abandoned"]  # its verdict went
    assert repo.cli("resume").exit_code == 3
    assert repo.story(A.key)["state"] == "held"  # composed and verified again, signed off never
    assert [c["state"] for c in repo.status()["candidates"]] == ["abandoned", "verified"]
    run_id = repo.status()["run"]["id"]
    assert repo.cli("approve", run_id, A.key).exit_code == 0
    assert repo.cli("resume").exit_code == 0
    assert _sessions(repo, A.key, "dev") == 1 and repo.story(A.key)["state"] == "integrated"
