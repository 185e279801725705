"""`validate` on the agent CLI's version and on the BMAD install (issue 14, part 7)."""

from __future__ import annotations

import json
import os

import pytest

from support import StoryDef, install_fake_clis

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])


@pytest.fixture
def fake_path(tmp_path, monkeypatch):
    bin_dir = install_fake_clis(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def _validate(repo) -> dict:
    result = repo.cli("validate", "--json")
    return json.loads(result.output)


def _checks(report: dict, name: str) -> list[dict]:
    return [c for c in report["checks"] if c["name"] == name]


@pytest.mark.parametrize("profile, shown", [("claude", "2.1.332 (Claude Code)"),
                                            ("gemini", "0.61.0"), ("codex", "codex-cli 0.171.0")])
def test_validate_reports_the_profile_clis_version(make_repo, fake_path, profile, shown):
    repo = make_repo([ALPHA], policy=f'[adapter]\nprofile = "{profile}"\n')
    report = _validate(repo)
    versions = [c for c in _checks(report, "agent") if shown in c["detail"]]
    assert [c["status"] for c in versions] == ["ok"], report["checks"]


def test_validate_warns_when_the_cli_is_older_than_the_profile_was_checked_against(
        make_repo, fake_path, monkeypatch):
    monkeypatch.setenv("FAKE_CLI_VERSION", "1.0.17")
    repo = make_repo([ALPHA], policy='[adapter]\nprofile = "claude"\n')
    report = _validate(repo)
    (older,) = [c for c in _checks(report, "agent") if "older than 2.1.332" in c["detail"]]
    assert older["status"] == "warn" and "1.0.17" in older["detail"]
    assert report["ok"]  # a warning, not a refusal


def test_validate_says_which_bmad_is_installed_and_what_is_seeded(make_repo):
    repo = make_repo([ALPHA])
    for rel in (".claude/skills/bmad-dev-story/SKILL.md", ".claude/skills/bmad-code-review/SKILL.md",
                "_bmad/bmm/config.yaml"):
        (repo.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo.root / rel).write_text("x\n")
    (repo.root / ".git" / "info" / "exclude").write_text("_bmad/\n.claude/\n")
    report = _validate(repo)
    (bmad,) = _checks(report, "bmad")
    assert bmad["status"] == "ok"
    assert "bmad-code-review, bmad-dev-story" in bmad["detail"]
    assert report["bmad"]["kind"] == "skills"
    assert report["bmad"]["seeded"] == [".claude/skills/bmad-code-review",
                                        ".claude/skills/bmad-dev-story", "_bmad"]
    assert report["bmad"]["skills"]["review"] == ".claude/skills/bmad-code-review"


def test_validate_on_a_project_without_bmad_says_agents_work_by_hand(make_repo):
    repo = make_repo([ALPHA])
    report = _validate(repo)
    (bmad,) = _checks(report, "bmad")
    assert bmad["status"] == "ok" and "work by hand" in bmad["detail"]
    assert report["bmad"] == {"kind": "none", "skills": {}, "workflows": {}, "seeded": []}


def test_validate_does_not_call_a_story_still_to_be_created_footprintless(make_repo):
    from support import drop_story_files

    repo = make_repo([ALPHA, StoryDef("1-2-beta", files=["src/beta.py"], status="backlog")])
    drop_story_files(repo, "1-2-beta")
    report = _validate(repo)
    assert report["ok"], report["checks"]
    assert not [c for c in _checks(report, "footprint") if "1-2-beta" in c["detail"]]
    assert [s["found"] for s in report["stories"] if s["key"] == "1-2-beta"] == [False]
    assert any("1-2-beta" in c["detail"] for c in _checks(report, "create"))
