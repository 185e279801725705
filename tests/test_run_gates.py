"""`run` says where it will pause; `run --gates` overrides the gates for one run; `resume`
prints only what is new (issue 13, "overnight without surprises")."""

from __future__ import annotations

from support import StoryDef, write_each

TWO_EPICS = [StoryDef("1-1-alpha", files=["src/alpha.py"]),
             StoryDef("2-1-beta", files=["src/beta.py"]),
             StoryDef("3-1-gamma", files=["src/gamma.py"])]


def _repo(make_repo, policy: str = ""):
    return make_repo(TWO_EPICS, script=write_each(TWO_EPICS), policy=policy)


def test_run_says_before_it_starts_where_the_per_epic_gates_will_pause_it(make_repo):
    repo = _repo(make_repo)
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    lines = result.output.splitlines()
    summary = next(line for line in lines if line.startswith("gates per-epic"))
    assert "before epic 2 (2-1-beta), before epic 3 (3-1-gamma)" in summary
    assert "a story that needs a human pauses the run" in summary
    # Said before the first event of the run, not found out at the pause.
    assert lines.index(summary) < next(i for i, line in enumerate(lines) if "run.created" in line)
    assert repo.status()["run"]["state"] == "paused"


def test_run_gates_none_overrides_the_policy_for_this_run_only(make_repo):
    repo = _repo(make_repo, policy='[gates]\nmode = "per-epic"\n')
    result = repo.cli("run", "--gates", "none")
    assert result.exit_code == 0, result.output
    assert "gates none: no gate pause" in result.output
    status = repo.status()
    assert status["run"]["state"] == "completed"
    assert [s["state"] for s in status["stories"]] == ["integrated"] * 3
    # The run's own policy snapshot says what it ran under; the policy file is unchanged.
    (mode,) = {row[0] for row in _snapshot_gates(repo)}
    assert mode == "none"
    assert 'mode = "per-epic"' in (repo.root / ".bmad-loop" / "policy.toml").read_text()


def _snapshot_gates(repo):
    import json

    from support import query

    return [(json.loads(p)["gates"]["mode"],) for (p,) in query(repo, "SELECT policy FROM runs")]


def test_run_gates_spec_approval_says_each_story_waits_for_approve(make_repo):
    repo = _repo(make_repo)
    result = repo.cli("run", "--gates", "per-story-spec-approval")
    assert result.exit_code == 3, result.output
    assert "each of the 3 stories waits for `bmad-loop approve RUN STORY`" in result.output
    assert repo.status()["stories"][0]["state"] == "pending"


def test_run_gates_with_a_mode_that_does_not_exist_is_refused_and_creates_nothing(make_repo):
    repo = _repo(make_repo)
    state_db = repo.root / ".bmad-loop" / "state.db"
    assert not state_db.exists()
    result = repo.cli("run", "--gates", "sometimes")
    assert result.exit_code == 2
    assert "--gates" in result.output and "sometimes" in result.output
    assert not state_db.exists()


def test_resume_prints_only_what_happens_from_the_resume_on(make_repo):
    repo = _repo(make_repo)
    first = repo.cli("run")
    assert first.exit_code == 3, first.output
    assert "run.created" in first.output and "story.integrated 1-1-alpha" in first.output
    second = repo.cli("resume")
    assert second.exit_code == 3, second.output  # the gate before epic 3
    assert "run.resumed" in second.output
    assert "run.created" not in second.output
    assert "story.integrated 1-1-alpha" not in second.output
    assert "story.integrated 2-1-beta" in second.output
    third = repo.cli("resume")
    assert third.exit_code == 0, third.output
    assert "story.integrated 2-1-beta" not in third.output
    assert "story.integrated 3-1-gamma" in third.output
