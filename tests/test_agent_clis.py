"""The shipped profiles against stand-ins of the real CLIs, through the CLI.

`claude`, `codex` and `gemini` on PATH are the stand-ins of tests/agents (install_fake_clis):
they print each CLI's documented structured output, edit files and exit as the real one does,
driven by a script file (FAKE_CLI_SCRIPT). Nothing of bmad-loop is mocked.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from support import StoryDef, install_fake_clis, query

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
BETA = StoryDef("1-2-beta", files=["src/beta.py"])
SCHEMA_MD = Path(__file__).resolve().parents[1] / "docs" / "schema.md"


@pytest.fixture
def clis(tmp_path, monkeypatch):
    """The stand-ins first on PATH; returns a function that writes their script."""
    bin_dir = install_fake_clis(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    script = tmp_path / "fake-cli-script.json"
    monkeypatch.setenv("FAKE_CLI_SCRIPT", str(script))

    def write(data: dict) -> Path:
        script.write_text(json.dumps(data))
        return script

    write.calls = lambda: [json.loads(line) for line in
                           Path(str(script) + ".calls").read_text().splitlines()]
    return write


def profile_policy(profile: str, extra: str = "") -> str:
    return f'[limits]\nmax_dev_attempts = 1\n{extra}\n[adapter]\nprofile = "{profile}"\ntimeout_s = 60\n'


def test_a_rate_limited_claude_session_pauses_the_run_charging_nothing_and_resume_integrates(
        make_repo, clis):
    clis({"1-1-alpha": {"dev": [{"fault": "rate-limit"}, {"write": {"src/alpha.py": "A = 1\n"}}]}})
    repo = make_repo([ALPHA], policy=profile_policy("claude"))
    result = repo.cli("run")
    assert result.exit_code == 3, result.output

    status = repo.status()
    story = status["stories"][0]
    assert status["run"]["state"] == "paused"
    assert story["state"] == "pending" and story["attempt"] == 0  # not escalated, nothing charged
    assert "rate-limit" in status["run"]["reason"]
    assert "API Error: Rate limit reached" in status["run"]["reason"]
    (unavailable,) = repo.events("agent.unavailable")
    assert unavailable["story"] == "1-1-alpha"
    assert unavailable["data"]["category"] == "rate-limit" and unavailable["data"]["action"] == "pause"
    assert unavailable["data"]["words"] == "API Error: Rate limit reached"
    rows = query(repo, "SELECT phase, state, counted, exit_code, reason FROM attempts")
    assert rows == [("dev", "interrupted", 0, 0, "rate-limit: API Error: Rate limit reached")]
    # the stand-in got the profile's live structured output flags
    assert {"--output-format", "stream-json", "--verbose"} <= set(clis.calls()[0]["argv"])

    result = repo.cli("resume", status["run"]["id"])
    assert result.exit_code == 0, result.output
    story = repo.story("1-1-alpha")
    assert story["state"] == "integrated" and story["attempt"] == 1
    assert repo.git("show", "main:src/alpha.py") == "A = 1"


def test_a_claude_usage_limit_exits_1_and_pauses_with_its_reset_time_in_the_journal(make_repo, clis):
    clis({"1-1-alpha": {"dev": [{"fault": "usage-limit"}]}})
    repo = make_repo([ALPHA], policy=profile_policy("claude"))
    assert repo.cli("run").exit_code == 3
    (unavailable,) = repo.events("agent.unavailable")
    assert unavailable["data"]["category"] == "usage-limit"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:00:00Z", unavailable["data"]["reset_at"])
    assert repo.story("1-1-alpha")["state"] == "pending"
    assert query(repo, "SELECT state, counted, exit_code FROM attempts") == [("interrupted", 0, 1)]


def test_on_limit_wait_waits_for_the_reset_the_cli_printed_and_goes_on(make_repo, clis):
    clis({"1-1-alpha": {"dev": [{"fault": "rate-limit", "words": "Resource exhausted. Please retry in 1s."},
                                {"write": {"src/alpha.py": "A = 1\n"}}]}})
    repo = make_repo([ALPHA], policy=profile_policy("gemini").replace(
        "[adapter]\n", '[adapter]\non_limit = "wait"\n'))
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    (unavailable,) = repo.events("agent.unavailable")
    assert unavailable["data"]["action"] == "wait" and unavailable["data"]["category"] == "rate-limit"
    (waiting,) = repo.events("agent.waiting")
    assert waiting["data"]["until"] is not None
    assert repo.story("1-1-alpha")["state"] == "integrated"
    states = query(repo, "SELECT state, counted FROM attempts WHERE phase = 'dev' ORDER BY id")
    assert states == [("interrupted", 0), ("succeeded", 1)]
    # gemini ran with the trust variable the CLI reads (else it exits 55, untrusted)
    assert all(call["trust"] == "true" for call in clis.calls())


def test_an_empty_dev_session_fails_its_attempt_with_no_changes(make_repo, clis):
    clis({"1-1-alpha": {"dev": [{"say": "I ran into an error and stopped."}]}})
    repo = make_repo([ALPHA], policy=profile_policy("codex"))
    assert repo.cli("run").exit_code == 3
    story = repo.story("1-1-alpha")
    assert story["state"] == "escalated" and "no changes" in story["reason"]
    assert query(repo, "SELECT phase, state, counted, reason FROM attempts") == [
        ("dev", "failed", 1, "no changes")]
    assert [c["phase"] for c in clis.calls()] == ["dev"]  # never reviewed, never integrated


def test_usage_is_summed_in_status_history_and_the_sql_views(make_repo, clis):
    usage = {"input": 1000, "output": 200, "cache_read": 3000, "cache_write": 500, "cost": 0.25}
    clis({"*": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}, "usage": usage}],
                "review": [{"usage": usage}]},
          "1-2-beta": {"dev": [{"write": {"src/beta.py": "B = 1\n"}, "usage": usage}],
                       "review": [{"usage": usage}]}})
    repo = make_repo([ALPHA, BETA], policy=profile_policy("claude"))
    assert repo.cli("run").exit_code == 0
    status = repo.status()
    for story in status["stories"]:
        assert story["usage"] == {"input_tokens": 2000, "output_tokens": 400,
                                  "cache_read_tokens": 6000, "cache_write_tokens": 1000,
                                  "cost_usd": 0.5}
    (entry,) = json.loads(repo.cli("history", "--json").output)
    assert entry["usage"]["cost_usd"] == 1.0 and entry["usage"]["input_tokens"] == 4000
    assert "$1.00" in repo.cli("history").output
    run_id = status["run"]["id"]
    assert query(repo, "SELECT story, sessions, tokens, cost_usd FROM v_story_usage ORDER BY seq") == [
        ("1-1-alpha", 2, 2400, 0.5), ("1-2-beta", 2, 2400, 0.5)]
    assert query(repo, "SELECT run_id, sessions, tokens, cost_usd FROM v_run_usage") == [
        (run_id, 4, 4800, 1.0)]
    assert query(repo, "SELECT phase, sessions, cache_read_tokens FROM v_phase_usage ORDER BY phase") == [
        ("dev", 2, 6000), ("review", 2, 6000)]


def test_codex_reports_tokens_but_no_cost(make_repo, clis):
    clis({"*": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}})
    repo = make_repo([ALPHA], policy=profile_policy("codex"))
    assert repo.cli("run").exit_code == 0
    usage = repo.story("1-1-alpha")["usage"]
    assert usage["cost_usd"] is None and usage["cache_write_tokens"] is None
    assert usage["input_tokens"] == 2000 and usage["cache_read_tokens"] == 6000  # dev + review


def test_crossing_max_cost_per_run_pauses_before_the_next_session(make_repo, clis):
    clis({"*": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]},
          "1-2-beta": {"dev": [{"write": {"src/beta.py": "B = 1\n"}}]}})
    repo = make_repo([ALPHA, BETA], policy=profile_policy("claude", "max_cost_per_run = 0.4"))
    assert repo.cli("run").exit_code == 3
    status = repo.status()
    assert "cost limit reached" in status["run"]["reason"]
    assert {s["key"]: s["state"] for s in status["stories"]} == {"1-1-alpha": "integrated",
                                                                "1-2-beta": "pending"}
    assert [c["key"] for c in clis.calls()] == ["1-1-alpha", "1-1-alpha"]  # beta never started


def test_crossing_max_tokens_per_story_pauses_the_run(make_repo, clis):
    clis({"*": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}})
    repo = make_repo([ALPHA], policy=profile_policy("claude", "max_tokens_per_story = 1000"))
    assert repo.cli("run").exit_code == 3
    assert "token limit reached" in repo.status()["run"]["reason"]
    assert repo.story("1-1-alpha")["state"] == "pending"  # dev done (1200 tokens), review not run
    assert [c["phase"] for c in clis.calls()] == ["dev"]


def test_a_review_marker_verdict_is_read_from_the_agent_words_in_the_event_stream(make_repo, clis):
    clis({"*": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}],
                "review": [{"say": "Missing tests.\nBMAD-LOOP-VERDICT: CHANGES-REQUESTED"}, {}]},
          "1-1-alpha": {"fix": [{"write": {"src/alpha.py": "A = 2\n"}}]}})
    repo = make_repo([ALPHA], policy=profile_policy("claude", "max_dev_attempts = 2"
                                                    ).replace("max_dev_attempts = 1\n", ""))
    assert repo.cli("run").exit_code == 0
    assert [c["phase"] for c in clis.calls()] == ["dev", "review", "fix", "review"]
    reasons = query(repo, "SELECT phase, reason FROM attempts ORDER BY id")
    assert reasons[1] == ("review", "review requested changes")


def test_validate_warns_about_a_custom_command_running_claude_with_exit_verdicts(make_repo, clis):
    repo = make_repo([ALPHA], policy='[adapter]\ncommand = ["claude", "-p", "{prompt_file}"]\n')
    result = repo.cli("validate")
    assert "runs claude" in result.output and "every review would approve" in result.output


def test_the_usage_views_are_documented_column_by_column(make_repo):
    from bmad_loop.operator.readonly import run_query

    repo = make_repo([ALPHA])
    repo.cli("init")
    url = f"sqlite:///{repo.root / '.bmad-loop' / 'state.db'}"
    text = SCHEMA_MD.read_text()
    for view in ("v_story_usage", "v_run_usage", "v_phase_usage"):
        section = re.search(rf"^### `{view}`.*?(?=^### |^## |\Z)", text, re.S | re.M).group(0)
        for column in run_query(url, f"SELECT * FROM {view} LIMIT 0").columns:
            assert f"`{column}`" in section, f"{view}.{column} is undocumented"


def test_the_ci_reports_carry_the_usage_totals(make_repo, clis, tmp_path):
    clis({"*": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}})
    repo = make_repo([ALPHA], policy=profile_policy("claude"))
    report, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    result = repo.cli("run", "--ci", "--report", str(report), "--junit", str(junit))
    assert result.exit_code == 0, result.output
    usage = json.loads(report.read_text())["usage"]
    assert usage == {"input_tokens": 2000, "output_tokens": 400, "cache_read_tokens": 6000,
                     "cache_write_tokens": 1000, "cost_usd": 0.5}
    assert '<property name="usage.cost_usd" value="0.5"' in junit.read_text()
