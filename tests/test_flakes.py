"""Flake or failure, and a red target: real runs with checks that fail on chosen invocations.

A flaky check keeps its memory outside the tree (a file in the test's `bar` folder), as a real
flaky suite's cause lives outside the code (a port, a clock, a service): so these policies run
the verify commands unboxed (`[verify] sandbox = "off"`), since the box would refuse that write.
Whether a command runs in a story's worktree, on a candidate or on the target's own check is
told by its working folder (`…/worktrees/…`, `…/candidates/<run>/<story>-<n>`,
`…/candidates/<run>/target`).
"""

from __future__ import annotations

import pytest

from support import StoryDef, query

S1, S2 = StoryDef("1-1-one", files=["src/one.py"]), StoryDef("1-2-two", files=["src/two.py"])
SCRIPT = {S1.key: {"dev": [{"write": {"src/one.py": "ONE = 1\n"}}]},
          S2.key: {"dev": [{"write": {"src/two.py": "TWO = 2\n"}}]}}


def once(bar, where: str, marker: str) -> str:
    """A check that fails the first time it runs where `where` matches its folder (a `case`
    pattern), and passes every time after (its memory: `bar/<marker>`)."""
    return (f'case "$PWD" in {where}) if [ ! -e {bar}/{marker} ]; then : > {bar}/{marker}; '
            f'echo flaked; exit 1; fi;; esac')


def policy(command: str, *, n: int = 2, parallel: int | None = None, retries: int | None = None) -> str:
    verify = f"commands = ['{command}']\nsandbox = \"off\"\n"  # a TOML literal string
    if parallel is not None:
        verify += f"parallel = {parallel}\n"
    if retries is not None:
        verify += f"retries = {retries}\n"
    return (f'[scm]\nmax_parallel = {n}\n[gates]\nmode = "none"\n[review]\nenabled = false\n'
            f"[verify]\n{verify}")


def phases(repo, key: str) -> list[str]:
    return [c["phase"] for c in repo.calls() if c["key"] == key]


def test_a_flake_in_a_story_verify_charges_no_dev_attempt_and_runs_no_fix(make_repo, bar):
    repo = make_repo([S1, S2], script=SCRIPT, policy=policy(once(bar, "*/worktrees/*/1-1-one", "s1")))
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    flaky = repo.events("verify.flaky")
    assert [(e["story"], e["data"]["site"], e["data"]["retry"]) for e in flaky] == [(S1.key, "story", 1)]
    data = flaky[0]["data"]
    assert "flaked" in open(data["failed_log"]).read()  # both logs are there to read
    assert data["passed_log"].endswith("-retry1.log") and open(data["passed_log"]).read() is not None
    assert phases(repo, S1.key) == ["dev"]  # no second dev, no fix
    assert query(repo, "SELECT dev_attempts FROM stories WHERE key = ?", S1.key) == [(1,)]
    assert query(repo, "SELECT site, story, command, retry FROM flakes") == [
        ("story", S1.key, once(bar, "*/worktrees/*/1-1-one", "s1"), 1)]
    assert query(repo, "SELECT flakes, in_stories, on_candidates FROM v_flaky_commands") == [(1, 1, 0)]
    assert "flak" in result.output  # the end-of-run summary says so


@pytest.mark.parametrize("parallel", [1, 2], ids=["one-at-a-time", "speculative"])
def test_a_flake_in_a_candidate_verify_passes_on_its_retry_and_blames_nobody(make_repo, bar, parallel):
    check = once(bar, "*/candidates/*/1-2-two-*", "c2")
    repo = make_repo([S1, S2], script=SCRIPT, policy=policy(check, parallel=parallel))
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert [(e["story"], e["data"]["site"]) for e in repo.events("verify.flaky")] == [(S2.key, "candidate")]
    assert query(repo, "SELECT site, attempt FROM flakes") == [("candidate", 1)]
    assert not repo.events("target.checked") and not repo.events("repair.requested")
    assert phases(repo, S2.key) == ["dev"]
    status = repo.status()
    assert {s["key"]: s["flakes"] for s in status["stories"]} == {S1.key: 0, S2.key: 1}


def test_retries_zero_counts_the_first_failure_as_before(make_repo, bar):
    repo = make_repo([S1], script=SCRIPT,
                     policy=policy(once(bar, "*/worktrees/*", "s1"), n=1, retries=0))
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert not repo.events("verify.flaky")
    assert phases(repo, S1.key) == ["dev", "dev"]  # the failure counted: a second dev attempt


def test_a_command_that_passes_on_its_own_leftovers_does_not_pass_a_retry(make_repo, bar):
    # Fails on a clean tree, passes where its own earlier run left a stamp: only a retry on a
    # tree put back exactly as the agent left it tells the two apart.
    stamp = ('case "$PWD" in */worktrees/*) if [ -e stamp ]; then exit 0; fi; : > stamp; '
             'exit 1;; esac')
    repo = make_repo([S1], script=SCRIPT,
                     policy=policy(stamp, n=1) + "[limits]\nmax_dev_attempts = 1\n")
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    assert not repo.events("verify.flaky")
    failed = [e for e in repo.events("verify.failed") if e["story"] == S1.key]
    assert len(failed) == 1 and failed[0]["data"]["log"].endswith("-retry1.log")


@pytest.mark.parametrize("parallel", [1, 2], ids=["one-at-a-time", "speculative"])
def test_a_red_target_blames_no_story_pauses_and_resume_lands_once_it_is_fixed(make_repo, bar, parallel):
    # The world turns red under the run: after story 1 landed, every check on a candidate or on
    # the target fails while bar/red exists (a clock, a dead service); the stories' own verify
    # still passes.
    red = bar / "red"
    # Story 1's candidate passes and turns the world red for every check after it; story 2's
    # dev waits for that, so its candidate is verified only once the world is red.
    check = (f'case "$PWD" in */candidates/*/1-1-one-*) : > {red};; '
             f'*/candidates/*) test ! -e {red} || {{ echo red; exit 1; }};; esac')
    script = {S1.key: SCRIPT[S1.key],
              S2.key: {"dev": [{"write": {"src/two.py": "TWO = 2\n"}, "wait_for": str(red)}]}}
    repo = make_repo([S1, S2], script=script, policy=policy(check, parallel=parallel))
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    run = repo.status()["run"]
    assert run["state"] == "paused"
    target = repo.git("rev-parse", "main")
    assert "the target is red" in run["reason"] and target[:12] in run["reason"]
    assert "fix the target first" in run["reason"]
    reds = repo.events("target.red")
    assert [(e["story"], e["data"]["target_sha"]) for e in reds] == [(S2.key, target)]
    assert repo.story(S2.key)["state"] == "ready"
    assert query(repo, "SELECT state FROM target_checks") == [("failed",)]
    assert not repo.events("repair.requested") and not repo.events("story.escalated")
    assert query(repo, "SELECT dev_attempts, repairs FROM stories WHERE key = ?", S2.key) == [(1, 0)]
    red.unlink()  # the person fixes what turned the target red
    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    assert repo.story(S2.key)["state"] == "integrated"
    assert phases(repo, S2.key) == ["dev"]
