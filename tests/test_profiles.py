"""The shipped agent profiles and how the argv template for a session is chosen."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path, PurePosixPath

import pytest

from bmad_loop.agents.adapter import AgentCall, render_argv
from bmad_loop.errors import ConfigError
from bmad_loop.agents.profiles import (
    known_profiles,
    load_profile,
    phase_instructions,
    resolve_command,
)
from bmad_loop.agents.prompts import GROUND_RULES, PHASE_INSTRUCTIONS
from bmad_loop.states import AGENT_PHASES as PHASES

BINARIES = {"claude": "claude", "codex": "codex", "gemini": "gemini", "opencode": "opencode", "qwen": "qwen"}


def _call(**overrides) -> AgentCall:
    values = dict(phase="dev", story_key="1-2-login", story_file="/wt/s.md", prompt_file="/wt/.bmad-loop/p.md",
                  worktree="/wt", run_id="r1", attempt=1, base_sha="b" * 40)
    values.update(overrides)
    return AgentCall(**values)


def test_the_five_profiles_are_shipped():
    assert known_profiles() == ("claude", "codex", "gemini", "opencode", "qwen")


@pytest.mark.parametrize("name", sorted(BINARIES))
def test_each_shipped_profile_loads(name):
    profile = load_profile(name)
    assert profile.name == name
    assert profile.command[0] == BINARIES[name]
    assert any("{prompt_file}" in part for part in profile.command)
    assert profile.model_args and "{model}" in profile.model_args
    assert profile.seed_files
    assert all(not PurePosixPath(p).is_absolute() and ".." not in PurePosixPath(p).parts for p in profile.seed_files)
    assert profile.verdict in ("exit", "marker")
    assert set(profile.instructions) == set(PHASES)
    for phase in PHASES:
        assert profile.instructions[phase].endswith(GROUND_RULES[phase])


@pytest.mark.parametrize("name", sorted(BINARIES))
def test_each_profile_runs_the_bmad_workflow_the_project_has(name):
    # Which skill or folder is the prompt's "BMAD in this project" section (bmadinstall): the
    # profile's instructions point there and never at a folder the project may not have.
    profile = load_profile(name)
    for phase in ("dev", "review", "fix"):
        assert '"BMAD in this project"' in profile.instructions[phase]
        assert "_bmad/" not in profile.instructions[phase]
    assert "code-review" in profile.instructions["review"]


@pytest.mark.parametrize("name", sorted(BINARIES))
def test_each_profile_renders_to_a_complete_argv(name):
    argv = render_argv(resolve_command(profile=name, command=[], phase_command=None, model="", tier_args=[]), _call())
    assert not any(re.search(r"\{[a-z_]+\}", part) for part in argv)
    assert any("/wt/.bmad-loop/p.md" in part for part in argv)
    assert "--model" not in argv


@pytest.mark.parametrize("name", sorted(BINARIES))
def test_every_flag_a_profile_passes_is_explained_in_the_readme(name):
    readme = resources.files("bmad_loop.agents.profiles").joinpath("README.md").read_text(encoding="utf-8")
    profile = load_profile(name)
    for part in profile.command + profile.model_args:
        if part.startswith("-"):
            assert f"`{part}" in readme or f"{part} " in readme, f"{name}: {part} is not explained"
    for path in profile.seed_files:
        assert f"`{path}`" in readme


def test_an_unknown_profile_is_a_config_error_listing_the_known_ones():
    with pytest.raises(ConfigError, match=r"^\[adapter\] profile: unknown profile 'x' \(known: claude, codex, gemini, opencode, qwen\)$"):
        load_profile("x")


def test_a_profile_name_cannot_reach_outside_the_package():
    with pytest.raises(ConfigError, match="unknown profile"):
        load_profile("../errors")


def test_the_profile_command_gets_its_model_args_only_with_a_model():
    profile = load_profile("claude")
    without = resolve_command(profile="claude", command=[], phase_command=None, model="", tier_args=[])
    with_model = resolve_command(profile="claude", command=[], phase_command=None, model="opus", tier_args=[])
    assert without == list(profile.command)
    assert with_model == list(profile.command) + ["--model", "{model}"]
    assert render_argv(with_model, _call(model="opus"))[-2:] == ["--model", "opus"]


def test_the_adapter_command_wins_over_the_profile():
    assert resolve_command(profile="claude", command=["my-agent", "{prompt_file}"], phase_command=None,
                           model="opus", tier_args=[]) == ["my-agent", "{prompt_file}"]


def test_the_phase_command_wins_over_the_adapter_command():
    assert resolve_command(profile="claude", command=["my-agent"], phase_command=["my-reviewer", "{story_key}"],
                           model="", tier_args=[]) == ["my-reviewer", "{story_key}"]


def test_tier_args_come_last_whatever_the_command():
    tier = ["--effort", "high"]
    assert resolve_command(profile="codex", command=[], phase_command=None, model="o3", tier_args=tier)[-4:] == \
        ["--model", "{model}", "--effort", "high"]
    assert resolve_command(profile="", command=["a"], phase_command=None, model="", tier_args=tier) == ["a", *tier]
    assert resolve_command(profile="", command=["a"], phase_command=["b"], model="", tier_args=tier) == ["b", *tier]


def test_neither_profile_nor_command_is_a_config_error():
    with pytest.raises(ConfigError, match=r"\[adapter\]: set either profile or command"):
        resolve_command(profile="", command=[], phase_command=None, model="", tier_args=[])


def test_phase_instructions_come_from_the_profile_or_the_defaults():
    assert phase_instructions("review") == PHASE_INSTRUCTIONS["review"]
    assert phase_instructions("review", "gemini") == load_profile("gemini").instructions["review"]
    assert phase_instructions("review", "gemini") != PHASE_INSTRUCTIONS["review"]


def test_codex_is_told_it_cannot_commit_in_its_sandbox():
    profile = load_profile("codex")
    assert "do not try to commit" in profile.instructions["dev"]
    assert "do not try to commit" in profile.instructions["fix"]


def test_gemini_trusts_its_worktree_for_the_session():
    assert load_profile("gemini").env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"


def test_gemini_takes_back_the_git_ignored_session_folder_through_its_own_settings():
    profile = load_profile("gemini")
    defaults = Path(profile.env["GEMINI_CLI_SYSTEM_DEFAULTS_PATH"])
    assert defaults.is_absolute() and defaults.is_file()  # {profile_dir} was resolved
    ignore_files = json.loads(defaults.read_text())["context"]["fileFiltering"]["customIgnoreFilePaths"]
    assert ignore_files == [".bmad-loop-session/gemini-ignore"]
    assert profile.session_files == {"gemini-ignore": "!/.bmad-loop-session/\n"}
