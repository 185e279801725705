"""A custom agent command reports its usage through $BMAD_LOOP_USAGE_FILE, so `[limits]`
budgets trip on it; a budget no agent reports to is warned about (validate, run) and each
session that reported nothing under a budget is journaled; a bad usage file is journaled and
recorded as nothing, never a crash.

The agent is the real scripted agent process (tests/agents/scripted_agent.py, step `usage`).
"""

from __future__ import annotations

import json

import pytest

from support import StoryDef, agent_command, query

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
BETA = StoryDef("1-2-beta", files=["src/beta.py"])
WRITE_ALPHA = {"write": {"src/alpha.py": "A = 1\n"}}
WRITE_BETA = {"write": {"src/beta.py": "B = 1\n"}}


def policy(repo_script, limits: str, reports: bool | None = True) -> str:
    reports_line = "" if reports is None else f"reports_usage = {str(reports).lower()}\n"
    return (f"[scm]\nmax_parallel = 1\n[gates]\nmode = \"none\"\n"
            f"[limits]\nmax_dev_attempts = 1\n{limits}\n"
            f"[adapter]\ncommand = {json.dumps(agent_command(repo_script))}\ntimeout_s = 60\n"
            f"{reports_line}")


def test_a_custom_command_reporting_tokens_trips_max_tokens_per_story(make_repo):
    repo = make_repo([ALPHA])
    repo.write_script({"*": {"dev": [{**WRITE_ALPHA, "usage": {"input_tokens": 700, "output_tokens": 500,
                                                               "cache_read_tokens": 9000}}]}})
    repo.write_policy(policy(repo.script_path, "max_tokens_per_story = 1000"), agent=False)
    assert repo.cli("run").exit_code == 3
    assert "token limit reached" in repo.status()["run"]["reason"]
    assert repo.story("1-1-alpha")["state"] == "pending"  # dev done (1200 tokens), review not run
    assert [c["phase"] for c in repo.calls()] == ["dev"]
    assert query(repo, "SELECT phase, input_tokens, output_tokens, cache_read_tokens, cost_usd "
                       "FROM attempts") == [("dev", 700, 500, 9000, None)]


def test_a_custom_command_reporting_cost_trips_max_cost_per_run(make_repo):
    repo = make_repo([ALPHA, BETA])
    repo.write_script({"1-1-alpha": {"dev": [{**WRITE_ALPHA, "usage": {"cost_usd": 0.25}}],
                                     "review": [{"usage": {"cost_usd": 0.25}}]},
                       "1-2-beta": {"dev": [WRITE_BETA]}})
    repo.write_policy(policy(repo.script_path, "max_cost_per_run = 0.4"), agent=False)
    assert repo.cli("run").exit_code == 3
    status = repo.status()
    assert "cost limit reached" in status["run"]["reason"]
    assert {s["key"]: s["state"] for s in status["stories"]} == {"1-1-alpha": "integrated",
                                                                "1-2-beta": "pending"}
    assert [c["key"] for c in repo.calls()] == ["1-1-alpha", "1-1-alpha"]  # beta never started
    assert repo.story("1-1-alpha")["usage"]["cost_usd"] == pytest.approx(0.5)


def test_each_session_gets_its_own_usage_file_in_its_scratch_folder(make_repo):
    repo = make_repo([ALPHA])
    repo.write_script({"*": {"dev": [{**WRITE_ALPHA, "usage": {"output_tokens": 1}}]}})
    repo.write_policy(policy(repo.script_path, ""), agent=False)
    assert repo.cli("run").exit_code == 0
    files = [c["env"]["BMAD_LOOP_USAGE_FILE"] for c in repo.calls()]
    state_dirs = [c["env"]["BMAD_LOOP_STATE_DIR"] for c in repo.calls()]
    assert [f.rsplit("/", 1)[1] for f in files] == ["usage-dev-1.json", "usage-review-1.json"]
    assert all(f.startswith(d + "/") for f, d in zip(files, state_dirs))


@pytest.mark.parametrize("bad,why", [
    ("{not json", "is not JSON"), ("[1, 2]", "holds a JSON list"),
    ('{"input_tokens": "many"}', "input_tokens must be a whole number"),
    ('{"output_tokens": -5}', "output_tokens must be a whole number"),
    ('{"input_tokens": true}', "input_tokens must be a whole number"),
    ('{"cost_usd": "free"}', "cost_usd must be a number"),
    ('{"cost_usd": NaN}', "cost_usd must be a number"), ('{"input_tokens": 1e400}', "input_tokens must"),
    ("x" * 70000, "is larger than"),
])
def test_a_bad_usage_file_is_journaled_and_records_nothing_and_the_run_goes_on(make_repo, bad, why):
    repo = make_repo([ALPHA])
    repo.write_script({"*": {"dev": [{**WRITE_ALPHA, "usage": bad}]}})
    repo.write_policy(policy(repo.script_path, "max_tokens_per_story = 1000"), agent=False)
    assert repo.cli("run").exit_code == 0
    invalid = repo.events("usage.invalid")
    assert [(e["story"], e["data"]["phase"]) for e in invalid] == [("1-1-alpha", "dev")]
    assert why in invalid[0]["data"]["reason"] and "BMAD_LOOP_USAGE_FILE" in invalid[0]["data"]["reason"]
    assert query(repo, "SELECT input_tokens, output_tokens, cost_usd FROM attempts "
                       "WHERE phase = 'dev'") == [(None, None, None)]
    # dev's report was refused and review wrote none: both are sessions that reported nothing
    assert [e["data"]["phase"] for e in repo.events("usage.missing")] == ["dev", "review"]


def test_a_usage_file_that_is_a_symlink_is_refused(make_repo, tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"input_tokens": 1}')
    repo = make_repo([ALPHA])
    repo.write_script({"*": {"dev": [{**WRITE_ALPHA, "git": [["--version"]]}]}})
    # the agent plants a symlink instead of writing the file
    repo.write_policy(policy(repo.script_path, "") .replace(
        json.dumps(agent_command(repo.script_path)),
        json.dumps(["/bin/sh", "-c", f'ln -s {secret} "$BMAD_LOOP_USAGE_FILE"; exec "$0" "$@"',
                    *agent_command(repo.script_path)])), agent=False)
    assert repo.cli("run").exit_code == 0
    reasons = [e["data"]["reason"] for e in repo.events("usage.invalid")]
    assert len(reasons) == 2 and all("symlink" in r for r in reasons)
    assert query(repo, "SELECT DISTINCT input_tokens FROM attempts") == [(None,)]


@pytest.mark.parametrize("reports", [False, None])
def test_a_budget_for_a_command_that_reports_nothing_is_warned_about_naming_both_keys(make_repo, reports):
    repo = make_repo([ALPHA])
    repo.write_script({"*": {"dev": [WRITE_ALPHA]}})
    repo.write_policy(policy(repo.script_path, "max_cost_per_run = 5\nmax_tokens_per_story = 100",
                             reports=reports), agent=False)
    validate = repo.cli("validate")
    warned = [line for line in validate.output.splitlines() if line.startswith("warn") and "limits" in line]
    assert len(warned) == 1, validate.output
    for key in ("[limits] max_cost_per_run", "[limits] max_tokens_per_story", "[adapter] reports_usage"):
        assert key in warned[0]
    result = repo.cli("run")
    assert result.exit_code == 0, result.output  # inert budgets: nothing trips
    assert "[adapter] reports_usage" in result.stderr and "max_tokens_per_story" in result.stderr
    assert [e["data"]["message"] for e in repo.events("run.warning")][0].startswith("[limits]")
    missing = repo.events("usage.missing")
    assert [(e["story"], e["data"]["phase"]) for e in missing] == [("1-1-alpha", "dev"),
                                                                   ("1-1-alpha", "review")]


def test_no_warning_and_no_note_without_a_budget_or_when_the_command_reports(make_repo):
    repo = make_repo([ALPHA])
    repo.write_script({"*": {"dev": [{**WRITE_ALPHA, "usage": {"input_tokens": 3}}],
                             "review": [{"usage": {"input_tokens": 3}}]}})
    repo.write_policy(policy(repo.script_path, "max_tokens_per_story = 1000"), agent=False)
    assert "reports_usage" not in repo.cli("validate").output
    result = repo.cli("run")
    assert result.exit_code == 0 and "reports_usage" not in result.stderr
    assert repo.events("usage.missing") == [] and repo.events("run.warning") == []
    repo2 = make_repo([ALPHA], name="plain")
    repo2.write_policy(policy(repo2.script_path, "", reports=None), agent=False)
    assert "reports_usage" not in repo2.cli("validate").output
