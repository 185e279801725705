"""Reading each agent CLI's structured output, and telling its environment faults apart.

The event shapes are those each CLI documents (claude `-p --output-format stream-json
--verbose`, `codex exec --json`, `gemini -o stream-json` / `-o json`); the stand-in CLIs in
tests/agents print the same shapes, so these tests and the end-to-end ones agree.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from bmad_loop.agents.faults import classify, reset_time
from bmad_loop.agents.output import parse_output
from bmad_loop.errors import ConfigError
from bmad_loop.agents.profiles import (
    custom_command_warnings,
    known_cli_of,
    load_profile,
    resolve_command,
)
from bmad_loop.policy.load import policy_from_dict

NOW = dt.datetime(2026, 12, 2, 10, 0, 0, tzinfo=dt.timezone.utc)


def lines(*events) -> str:
    return "\n".join(json.dumps(e) for e in events) + "\n"


def claude_result(text, *, is_error=False, usage=None, cost=None):
    return {"type": "result", "subtype": "success", "is_error": is_error, "result": text,
            "session_id": "s1", "num_turns": 3, "duration_ms": 1200,
            "total_cost_usd": cost, "usage": usage or {}}


CLAUDE_OK = lines(
    {"type": "system", "subtype": "init", "session_id": "s1", "model": "sonnet", "tools": []},
    {"type": "assistant", "message": {"content": [{"type": "text", "text": "Working on it."}]}},
    {"type": "user", "message": {"content": [{"type": "tool_result", "content": "rate limit tests pass"}]}},
    {"type": "assistant", "message": {"content": [{"type": "text", "text": "BMAD-LOOP-VERDICT: APPROVED"}]}},
    claude_result("BMAD-LOOP-VERDICT: APPROVED", cost=0.42,
                  usage={"input_tokens": 1200, "output_tokens": 300, "cache_read_input_tokens": 5000,
                         "cache_creation_input_tokens": 700}),
)


def fault_of(profile: str, output: str, exit_code: int):
    cli = load_profile(profile)
    return classify(parse_output(cli.output, output), exit_code, patterns=cli.faults,
                    exit_codes=cli.fault_exit_codes, now=NOW)


def test_claude_stream_json_gives_the_agent_words_usage_and_cost():
    report = parse_output("claude-stream-json", CLAUDE_OK)
    assert report.structured and not report.is_error
    assert "Working on it." in report.text and report.text.count("BMAD-LOOP-VERDICT") == 1
    assert report.usage.columns() == {"input_tokens": 1200, "output_tokens": 300,
                                      "cache_read_tokens": 5000, "cache_write_tokens": 700,
                                      "cost_usd": 0.42}
    # a tool's output that mentions a rate limit is not the CLI's error channel
    assert fault_of("claude", CLAUDE_OK, 0) is None


def test_claude_rate_limit_is_exit_0_with_is_error_and_charges_nothing():
    out = lines(claude_result("API Error: Rate limit reached", is_error=True))
    fault = fault_of("claude", out, 0)
    assert fault is not None and fault.category == "rate-limit"
    assert fault.words == "API Error: Rate limit reached" and fault.reset_at is None


def test_claude_usage_limit_is_exit_1_with_its_reset_clock_time():
    out = lines(claude_result("You've hit your limit · resets 1pm (UTC)", is_error=True))
    fault = fault_of("claude", out, 1)
    assert fault.category == "usage-limit"
    assert fault.reset_at == dt.datetime(2026, 12, 2, 13, 0, tzinfo=dt.timezone.utc)
    # the same words on stderr, before any event (no result event at all)
    plain = fault_of("claude", "You've hit your limit · resets 9am (UTC)\n", 1)
    assert plain.category == "usage-limit"
    assert plain.reset_at == dt.datetime(2026, 12, 3, 9, 0, tzinfo=dt.timezone.utc)  # tomorrow


@pytest.mark.parametrize("words, category", [
    ("Invalid API key · Please run /login", "auth"),
    ("OAuth token has expired. Please obtain a new token or refresh your existing token.", "auth"),
    ("There's an issue with the selected model (claude-nine). It may not exist or you may not have access to it.", "model"),
    ("API Error: Connection error.", "network"),
])
def test_claude_environment_faults_by_their_words(words, category):
    assert fault_of("claude", lines(claude_result(words, is_error=True)), 1).category == category


def test_a_story_failure_is_not_an_environment_fault():
    out = lines(claude_result("I could not make the tests pass.", is_error=False))
    assert fault_of("claude", out, 1) is None
    report = parse_output("claude-stream-json",
                          lines({"type": "result", "subtype": "error_max_turns", "is_error": True}))
    assert report.is_error and "error_max_turns" in report.error


def test_codex_jsonl_sums_turn_usage_and_reads_its_usage_limit():
    ok = lines({"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"},
               {"type": "item.completed", "item": {"id": "i1", "type": "agent_message", "text": "Done."}},
               {"type": "turn.completed", "usage": {"input_tokens": 900, "cached_input_tokens": 400,
                                                    "output_tokens": 120}})
    report = parse_output("codex-jsonl", ok)
    assert report.text == "Done." and not report.is_error
    assert report.usage.columns() == {"input_tokens": 500, "output_tokens": 120,
                                      "cache_read_tokens": 400, "cache_write_tokens": None,
                                      "cost_usd": None}
    limit = ("You've hit your usage limit. Visit https://chatgpt.com/codex/settings/usage "
             "to purchase more credits or try again in 2 hours 5 minutes.")
    out = lines({"type": "thread.started", "thread_id": "t"}, {"type": "error", "message": limit},
                {"type": "turn.failed", "error": {"message": limit}})
    fault = fault_of("codex", out, 1)
    assert fault.category == "usage-limit"
    assert fault.reset_at == NOW + dt.timedelta(hours=2, minutes=5)
    assert fault_of("codex", "Not inside a trusted directory and --skip-git-repo-check was not "
                             "specified.\n", 1).category == "trust"


def test_a_codex_turn_that_completed_after_a_retry_is_a_success_with_its_cache_writes():
    # codex 0.171.0, one 429 cured by its own retry: an `error` event, then the turn completes.
    out = lines({"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"},
                {"type": "error", "message": "Reconnecting... 1/5 (exceeded retry limit, last status: "
                                             "429 Too Many Requests)"},
                {"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": "Done."}},
                {"type": "turn.completed", "usage": {"input_tokens": 3600, "cached_input_tokens": 1200,
                                                     "cache_write_input_tokens": 30, "output_tokens": 150,
                                                     "reasoning_output_tokens": 21}})
    out += "Reading additional input from stdin...\n"
    report = parse_output("codex-jsonl", out)
    assert not report.is_error and fault_of("codex", out, 0) is None
    assert report.usage.cache_write_tokens == 30 and report.usage.input_tokens == 2400


@pytest.mark.parametrize("words", [
    "Selected model is at capacity. Please try a different model.",  # a 503
    "unexpected status 529 <unknown status code>: Overloaded, url: http://127.0.0.1:1/v1/responses"])
def test_an_overloaded_codex_waits_like_a_rate_limit_in_its_own_words(words):
    out = lines({"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"},
                {"type": "error", "message": f"Reconnecting... 1/5 ({words})"},
                {"type": "error", "message": words}, {"type": "turn.failed", "error": {"message": words}})
    out += "Reading additional input from stdin...\n"  # codex's stderr, after the events
    fault = fault_of("codex", out, 1)
    assert fault.category == "rate-limit"
    assert "Reading additional input" not in fault.words


@pytest.mark.parametrize("code, category", [(173, "rate-limit"), (247, "rate-limit"), (17, "rate-limit"),
                                            (41, "auth"), (55, "trust")])
def test_gemini_exit_codes_as_observed(code, category):
    out = lines({"type": "result", "status": "error",
                 "error": {"type": "unknown", "message": "[API Error: something]"}})
    assert fault_of("gemini", out, code).category == category


def test_qwen_stream_json_takes_the_cache_reads_out_of_the_input_and_reads_its_error():
    ok = lines({"type": "assistant", "message": {"content": [{"type": "text", "text": "Done."}]}},
               {"type": "result", "subtype": "success", "is_error": False, "result": "Done.",
                "usage": {"input_tokens": 3600, "output_tokens": 150, "cache_read_input_tokens": 1200}})
    report = parse_output("qwen-stream-json", ok)
    assert report.text == "Done." and not report.is_error
    assert (report.usage.input_tokens, report.usage.cache_read_tokens, report.usage.cost_usd) == (2400, 1200, None)
    failed = lines({"type": "result", "subtype": "error_during_execution", "is_error": True,
                    "usage": {"input_tokens": 0, "output_tokens": 0},
                    "error": {"message": "[API Error: 503 The model is overloaded. Please try again later.]"}})
    fault = fault_of("qwen", failed, 1)
    assert fault.category == "rate-limit" and fault.words.startswith("[API Error: 503")


def test_opencode_json_sums_its_steps_and_reads_its_error_event():
    step = {"type": "step_finish", "part": {"type": "step-finish", "cost": 0.01, "tokens": {
        "input": 800, "output": 50, "reasoning": 0, "cache": {"write": 5, "read": 400}}}}
    ok = lines({"type": "step_start", "part": {}}, step,
               {"type": "text", "part": {"type": "text", "text": "BMAD-LOOP-VERDICT: APPROVED"}}, step)
    report = parse_output("opencode-json", ok)
    assert report.text == "BMAD-LOOP-VERDICT: APPROVED" and not report.is_error
    assert report.usage.columns() == {"input_tokens": 1600, "output_tokens": 100, "cache_read_tokens": 800,
                                      "cache_write_tokens": 10, "cost_usd": 0.02}
    failed = lines({"type": "error", "error": {"name": "APIError", "data": {
        "message": "Rate limit exceeded: too many requests", "statusCode": 429, "isRetryable": True}}})
    fault = fault_of("opencode", failed, 1)
    assert fault.category == "rate-limit" and "HTTP 429" in fault.words


def test_gemini_stream_json_and_its_fatal_exit_codes():
    ok = lines({"type": "init", "session_id": "g", "model": "gemini-2.5-pro"},
               {"type": "message", "role": "assistant", "content": "Hel", "delta": True},
               {"type": "message", "role": "assistant", "content": "lo", "delta": True},
               {"type": "result", "status": "success",
                "stats": {"total_tokens": 150, "input_tokens": 100, "output_tokens": 50,
                          "cached": 30, "input": 70, "duration_ms": 5, "tool_calls": 0}})
    report = parse_output("gemini-stream-json", ok)
    assert report.text == "Hello"
    assert (report.usage.input_tokens, report.usage.output_tokens, report.usage.cache_read_tokens) == (70, 50, 30)
    untrusted = "FatalUntrustedWorkspaceError: Gemini CLI is not running in a trusted directory.\n"
    assert fault_of("gemini", untrusted, 55).category == "trust"
    assert fault_of("gemini", "some error\n", 41).category == "auth"
    quota = lines({"type": "result", "status": "error",
                   "error": {"type": "RetryableQuotaError", "message": "Quota hit. Please retry in 20s."}})
    fault = fault_of("gemini", quota, 1)
    assert fault.category == "rate-limit" and fault.reset_at == NOW + dt.timedelta(seconds=20)
    single = json.dumps({"session_id": "g", "error": {"type": "TerminalQuotaError",
                                                      "message": "You have exhausted your daily quota."}},
                        indent=2)
    assert fault_of("gemini", single, 1).category == "usage-limit"


@pytest.mark.parametrize("text, expected", [
    ("try again in 20s", NOW + dt.timedelta(seconds=20)),
    ("Please retry in 1.5s.", NOW + dt.timedelta(seconds=1.5)),
    ("try again in 3 days 6 hours 57 minutes", NOW + dt.timedelta(days=3, hours=6, minutes=57)),
    ('{"resetsAt": 1796212800}', dt.datetime.fromtimestamp(1796212800, dt.timezone.utc)),
    ("or try again at 3:28 PM (UTC).", dt.datetime(2026, 12, 2, 15, 28, tzinfo=dt.timezone.utc)),
    ("resets 12am (UTC)", dt.datetime(2026, 12, 3, 0, 0, tzinfo=dt.timezone.utc)),
    ("Try again Aug 18.", None),
    ("resets soon", None),
])
def test_reset_times_in_the_words_clis_use(text, expected):
    assert reset_time(text, NOW) == expected


def test_plain_text_output_is_classified_only_when_the_session_failed():
    cli = load_profile("claude")
    report = parse_output("text", "Rate limit reached\n")
    assert classify(report, 0, patterns=cli.faults, exit_codes={}) is None
    assert classify(report, 1, patterns=cli.faults, exit_codes={}).category == "rate-limit"


def test_extra_args_add_to_a_profile_without_replacing_it():
    argv = resolve_command(profile="claude", command=(), phase_command=None, model="opus",
                           tier_args=("--tier-flag",), extra_args=("--max-turns", "40"))
    assert argv[0] == "claude" and "stream-json" in argv and "--verbose" in argv
    assert argv[-5:] == ["--model", "{model}", "--max-turns", "40", "--tier-flag"]


def test_gemini_trusts_its_worktree_with_the_variable_the_cli_reads():
    env = load_profile("gemini").env
    assert env["GEMINI_CLI_TRUST_WORKSPACE"] == "true" and "GEMINI_TRUST_WORKSPACE" not in env


def test_validate_warns_when_a_custom_command_runs_a_known_cli_with_exit_verdicts():
    assert known_cli_of(["/usr/local/bin/claude", "-p", "x"]) == "claude"
    assert known_cli_of(["npx", "@google/gemini-cli"]) is None
    assert known_cli_of(["my-agent", "--go"]) is None
    risky = policy_from_dict({"adapter": {"command": ["codex", "exec", "{prompt_file}"]}})
    (warning,) = custom_command_warnings(risky.adapter)
    assert "[adapter] command runs codex" in warning and "every review would approve" in warning
    marked = policy_from_dict({"adapter": {"command": ["codex", "exec", "{prompt_file}"],
                                           "verdict": "marker"}})
    assert custom_command_warnings(marked.adapter) == []
    assert custom_command_warnings(policy_from_dict({"adapter": {"profile": "codex"}}).adapter) == []


def test_bad_adapter_keys_are_one_line_errors_naming_the_key():
    with pytest.raises(ConfigError, match=r"\[adapter\] verdict: must be one of"):
        policy_from_dict({"adapter": {"profile": "claude", "verdict": "loud"}})
    with pytest.raises(ConfigError, match=r"\[adapter\] on_limit"):
        policy_from_dict({"adapter": {"profile": "claude", "on_limit": "sleep"}})
    with pytest.raises(ConfigError, match=r"\[limits\] max_cost_per_run: expected a number"):
        policy_from_dict({"limits": {"max_cost_per_run": "ten"}})
    assert policy_from_dict({"limits": {"max_cost_per_run": 5}}).limits.max_cost_per_run == 5.0
