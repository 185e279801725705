"""Faults of a real workstation, reproduced for real: an editor's `git status` beside the run,
a lock file someone else holds, and the ways a person gets out of a run (stop with no
consumer, resume with a corrected policy, abandon)."""

from __future__ import annotations

import os
import subprocess
import threading

from support import MERGE_NONE, StoryDef, git, write_each

TEN = [StoryDef(f"1-{i}-s{i}", files=[f"src/s{i}.py"]) for i in range(1, 11)]


def test_two_git_status_loops_in_the_target_checkout_never_fail_a_ten_story_run(make_repo):
    """What an editor does beside the run: plain `git status`, which takes the index lock for
    a moment to refresh it. The lane holds that lock across each advance and waits for it."""
    repo = make_repo(TEN, script=write_each(TEN), policy=MERGE_NONE.format(n=3, strategy="merge"))
    stop = threading.Event()
    statuses = [0, 0]

    def editor(i):
        while not stop.is_set():
            subprocess.run(["git", "status", "--porcelain"], cwd=repo.root, capture_output=True,
                           env={k: v for k, v in os.environ.items() if k != "GIT_OPTIONAL_LOCKS"})
            statuses[i] += 1

    threads = [threading.Thread(target=editor, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    try:
        result = repo.cli("run")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert result.exit_code == 0, result.output
    status = repo.status()
    assert [s["state"] for s in status["stories"]] == ["integrated"] * 10
    assert min(statuses) > 10  # the editors really ran all along
    assert git(repo.root, "status", "--porcelain") == ""  # the checkout followed every advance
    assert git(repo.root, "rev-parse", "HEAD") == git(repo.root, "rev-parse", "main")


def test_a_foreign_index_lock_makes_the_lane_wait_before_the_cas_then_pause_naming_it(make_repo):
    stories = TEN[:2]
    policy = MERGE_NONE.format(n=1, strategy="merge").replace("[scm]\n", "[scm]\nlock_wait_s = 1\n")
    repo = make_repo(stories, script=write_each(stories), policy=policy)
    lock = repo.root / ".git" / "index.lock"
    lock.write_text("held by a person's git\n")  # a lock bmad-loop cannot attribute to itself
    main_before = git(repo.root, "rev-parse", "main")

    result = repo.cli("run")

    assert result.exit_code == 3, result.output  # needs a human
    run = repo.status()["run"]
    assert run["state"] == "paused"
    assert str(lock) in run["reason"]
    assert git(repo.root, "rev-parse", "main") == main_before  # it waited before the CAS
    journal = repo.journal()
    kinds = [e["kind"] for e in journal]
    assert "git.lock_waited" in kinds and "fault.retry" in kinds
    assert lock.read_text() == "held by a person's git\n"  # a foreign lock is never removed

    lock.unlink()  # the person is done
    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    assert [s["state"] for s in repo.status()["stories"]] == ["integrated", "integrated"]
    assert git(repo.root, "status", "--porcelain") == ""


def test_enqueue_then_stop_with_no_consumer_settles_at_once(make_repo):
    repo = make_repo(TEN[:2], script=write_each(TEN[:2]))
    run_id = repo.cli("enqueue").output.strip()
    result = repo.cli("stop", run_id)
    assert result.exit_code == 0, result.output
    assert repo.status(run_id)["run"]["state"] == "stopped"
    assert {s["state"] for s in repo.status(run_id)["stories"]} == {"pending"}
    result = repo.cli("resume", run_id)  # and it still runs to the end
    assert result.exit_code == 0, result.output


def test_resume_reload_policy_fixes_the_mistake_that_paused_the_run_but_not_its_identity(make_repo):
    stories = TEN[:1]
    bad = MERGE_NONE.format(n=1, strategy="merge") + '[verify]\ncommands = ["exit 1"]\n'
    repo = make_repo(stories, script=write_each(stories), policy=bad)
    result = repo.cli("run")
    assert result.exit_code == 3, result.output  # the verify command was the mistake
    run_id = repo.status()["run"]["id"]

    # The fix, and an identity key the reload must not take (the run stays on main).
    # max_parallel and merge_strategy change too: the run's columns follow its new snapshot.
    fixed = MERGE_NONE.format(n=2, strategy="squash").replace(
        "[scm]\n", '[scm]\ntarget_branch = "elsewhere"\n') + '[verify]\ncommands = ["true"]\n'
    repo.write_policy(fixed)
    plain = repo.cli("resume", run_id)
    assert plain.exit_code == 3, plain.output  # without --reload-policy: same mistake

    result = repo.cli("resume", run_id, "--reload-policy")
    assert result.exit_code == 0, result.output
    reloaded = [e for e in repo.journal(run_id) if e["kind"] == "run.policy_reloaded"]
    assert {"verify.commands", "scm.max_parallel", "scm.merge_strategy"} <= set(reloaded[0]["data"]["changed"])
    run = repo.status(run_id)["run"]
    assert run["target_branch"] == "main"
    assert (run["max_parallel"], run["merge_strategy"]) == (2, "squash")


def test_abandon_ends_a_paused_run_for_good_and_keeps_its_evidence_per_keep_failed(make_repo):
    stories = TEN[:1]
    repo = make_repo(stories, script=write_each(stories),
                     policy=MERGE_NONE.format(n=1, strategy="merge") + '[verify]\ncommands = ["exit 1"]\n')
    assert repo.cli("run").exit_code == 3
    run_id = repo.status()["run"]["id"]
    branch = repo.status(run_id)["stories"][0]["branch"]

    assert repo.cli("abandon", run_id, "--reason", "wrong sprint").exit_code == 0
    run = repo.status(run_id)["run"]
    assert run["state"] == "abandoned" and "wrong sprint" in run["reason"]
    for refused in (("resume", run_id), ("stop", run_id), ("abandon", run_id)):
        result = repo.cli(*refused)
        assert result.exit_code == 2 and "abandoned" in result.output, refused

    assert repo.cli("cleanup").exit_code == 0  # keep_failed (default): the escalated work stays
    assert f"refs/heads/{branch}" in repo.bmad_branches()


def test_abandon_refuses_a_live_run(make_repo):
    repo = make_repo(TEN[:1], script=write_each(TEN[:1]))
    run_id = repo.cli("enqueue").output.strip()
    result = repo.cli("abandon", run_id)
    assert result.exit_code == 2 and "stop it first" in result.output
    assert repo.status(run_id)["run"]["state"] == "running"
