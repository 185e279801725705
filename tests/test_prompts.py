"""The prompt file: what each session is told, and the evidence it is given."""

from __future__ import annotations

import pytest

from bmad_loop.agents.prompts import (
    GROUND_RULES,
    MAX_EVIDENCE_CHARS,
    PHASE_INSTRUCTIONS,
    PromptSpec,
    build_prompt,
    compose,
    write_prompt,
)
from bmad_loop.states import AGENT_PHASES as PHASES

STORY = """\
# Story 1.2: Login

Status: ready-for-dev

## Acceptance Criteria
1. A user can log in.

## Tasks / Subtasks
- [ ] Add the login form
"""


def _prompt(**overrides) -> str:
    values = dict(phase="dev", story_key="1-2-login", story_title="Login", story_text=STORY,
                  instructions=PHASE_INSTRUCTIONS["dev"], attempt=1)
    values.update(overrides)
    return build_prompt(PromptSpec(**values))


def test_a_dev_prompt_holds_the_whole_story_and_the_instructions():
    text = _prompt(worktree="/wt/1-2-login")
    assert STORY.strip() in text
    assert PHASE_INSTRUCTIONS["dev"] in text
    assert "1-2-login: Login" in text and "/wt/1-2-login" in text and "Attempt: 1" in text


def test_a_fix_prompt_holds_the_failing_verify_output_and_the_review_notes():
    text = _prompt(phase="fix", instructions=PHASE_INSTRUCTIONS["fix"], attempt=1,
                   verify_output="FAILED tests/test_login.py::test_bad_password", review_notes="src/login.py:12 leaks the hash")
    assert STORY.strip() in text
    assert PHASE_INSTRUCTIONS["fix"] in text
    assert "FAILED tests/test_login.py::test_bad_password" in text
    assert "src/login.py:12 leaks the hash" in text


def test_a_fix_prompt_after_a_passing_verify_says_so():
    text = _prompt(phase="fix", instructions=PHASE_INSTRUCTIONS["fix"], review_notes="rename it")
    assert "Verification passed; the review requested changes." in text


def test_a_second_dev_attempt_gets_the_previous_failing_verify_output():
    text = _prompt(attempt=2, verify_output="E   AssertionError: 401 != 200")
    assert "previous attempt failed verification" in text
    assert "E   AssertionError: 401 != 200" in text


def test_a_first_dev_attempt_has_no_evidence_section():
    assert "failed verification —" not in _prompt()


def test_evidence_holding_backticks_cannot_close_its_fence_early():
    output = "```\nnot the end\n````"
    text = _prompt(phase="fix", instructions=PHASE_INSTRUCTIONS["fix"], verify_output=output)
    assert "`````text\n" + output + "\n`````" in text


def test_huge_evidence_keeps_its_tail():
    output = "x" * MAX_EVIDENCE_CHARS + "THE-END"
    text = _prompt(phase="fix", instructions=PHASE_INSTRUCTIONS["fix"], verify_output=output)
    assert "THE-END" in text and len(text) < MAX_EVIDENCE_CHARS + 10_000
    assert f"only the last {MAX_EVIDENCE_CHARS} characters" in text


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown phase 'deploy'"):
        _prompt(phase="deploy")


@pytest.mark.parametrize("phase", PHASES)
def test_every_phase_is_told_the_ground_rules(phase):
    text = PHASE_INSTRUCTIONS[phase]
    assert GROUND_RULES[phase] in text
    assert "worktree" in text
    assert "sprint board" in text and "sprint-status.yaml" in text
    assert "do not push" in text and "any other branch" in text


@pytest.mark.parametrize("phase", ["dev", "fix"])
def test_dev_and_fix_may_commit_or_leave_their_changes(phase):
    assert "committed by bmad-loop" in PHASE_INSTRUCTIONS[phase]


def test_the_review_is_told_how_to_give_its_verdict():
    text = PHASE_INSTRUCTIONS["review"]
    assert "exit with status 0 to approve, non-zero to request changes" in text
    assert "standard output" in text
    assert "BMAD-LOOP-VERDICT: APPROVED" in text and "change no file" in text


def test_compose_puts_a_task_before_the_ground_rules():
    assert compose("dev", "  Do the thing.\n") == "Do the thing.\n\n" + GROUND_RULES["dev"]


def test_write_prompt_creates_its_folder_and_returns_the_path(tmp_path):
    target = tmp_path / "runs" / "r1" / "prompts" / "1-2-login.dev.1.md"
    text = _prompt()
    assert write_prompt(target, text) == target
    assert target.read_text(encoding="utf-8") == text
    write_prompt(target, "second")
    assert target.read_text() == "second"
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary file left
