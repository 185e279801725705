"""BMAD as installed: what `detect_bmad` finds, and the untracked install seeded into worktrees."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmad_loop.bmad.install import bmad_seeds, detect_bmad
from bmad_loop.git.runner import Git
from support import StoryDef, barrier_script, go, init_repo, wait_for_files, wait_for_exit


def _files(root: Path, *paths: str) -> Path:
    for rel in paths:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{rel}\n")
    return root


def test_a_v6_2_skills_install_names_each_phases_skill(tmp_path):
    root = _files(tmp_path, ".claude/skills/bmad-dev-story/SKILL.md",
                  ".claude/skills/bmad-code-review/SKILL.md",
                  ".claude/skills/bmad-create-story/SKILL.md",
                  ".claude/skills/my-own-skill/SKILL.md")
    found = detect_bmad(root)
    assert found.kind == "skills"
    assert [found.skill_name(p) for p in ("create", "dev", "review", "fix")] == [
        "bmad-create-story", "bmad-dev-story", "bmad-code-review", "bmad-dev-story"]
    assert "`bmad-code-review` skill" in found.guidance("review")
    assert ".claude/skills/bmad-code-review/SKILL.md" in found.guidance("review")


def test_skills_under_agents_count_and_bmad_build_stands_in_for_dev_story(tmp_path):
    root = _files(tmp_path, ".agents/skills/bmad-build/SKILL.md",
                  ".agents/skills/bmad-code-review/SKILL.md")
    found = detect_bmad(root)
    assert found.kind == "skills"
    assert found.skill_name("dev") == "bmad-build" and found.skill_name("fix") == "bmad-build"
    assert found.skill_name("create") is None and found.guidance("create") == ""


def test_a_skill_folder_without_skill_md_is_not_a_skill(tmp_path):
    root = _files(tmp_path, ".claude/skills/bmad-dev-story/notes.md")
    assert detect_bmad(root).kind == "none"


@pytest.mark.parametrize("install_root", ["_bmad", ".bmad", "bmad"])
def test_a_v6_0_workflows_install_points_at_its_workflow_folders(tmp_path, install_root):
    base = f"{install_root}/bmm/workflows/4-implementation"
    root = _files(tmp_path, f"{base}/dev-story/workflow.yaml", f"{base}/code-review/workflow.yaml")
    found = detect_bmad(root)
    assert found.kind == "workflows"
    assert f"`{base}/dev-story/`" in found.guidance("dev")
    assert f"`{base}/code-review/`" in found.guidance("review")
    assert f"`{base}/dev-story/`" in found.guidance("fix")
    assert found.guidance("create") == ""  # no create-story folder here


def test_v4_and_nothing(tmp_path):
    assert detect_bmad(_files(tmp_path / "v4", ".bmad-core/agents/dev.md")).kind == "v4"
    assert ".bmad-core/agents/dev.md" in detect_bmad(tmp_path / "v4").guidance("dev")
    (tmp_path / "plain").mkdir()
    none = detect_bmad(tmp_path / "plain")
    assert none.kind == "none" and none.guidance("dev") == ""


def test_seeds_are_the_untracked_part_of_the_install_ignored_files_included(tmp_path):
    root = init_repo(tmp_path / "repo", {rel: f"{rel}\n" for rel in (
        ".agents/skills/bmad-code-review/SKILL.md", "src/app.py")}, message="tracked part")
    _files(root, "_bmad/bmm/config.yaml", ".claude/skills/bmad-dev-story/SKILL.md",
           ".claude/skills/not-bmad/SKILL.md", ".agents/skills/bmad-code-review/local.md")
    (root / ".gitignore").write_text("_bmad/\n.claude/\n")
    assert bmad_seeds(Git(root), root) == [
        ".agents/skills/bmad-code-review/local.md", ".claude/skills/bmad-dev-story", "_bmad"]


def test_an_untracked_bmad_install_reaches_each_worktree_and_is_never_committed(make_repo, bar):
    stories = [StoryDef("1-1-alpha", files=["src/alpha.py"])]
    # The agent also scribbles on the seeded install: that must not reach the target either.
    script = barrier_script(stories, bar, extra={"1-1-alpha": {
        "append": {"_bmad/bmm/config.yaml": "agent was here\n"}}})
    repo = make_repo(stories, script=script, policy='[gates]\nmode = "none"\n')
    _files(repo.root, "_bmad/bmm/config.yaml", ".claude/skills/bmad-dev-story/SKILL.md",
           ".claude/skills/bmad-dev-story/steps/step-01.md")
    (repo.root / ".git" / "info" / "exclude").write_text("_bmad/\n.claude/\n")
    proc = repo.spawn("run")
    wait_for_files(bar / "in-1-1-alpha")
    worktree = Path(repo.calls()[0]["cwd"])
    assert worktree != repo.root
    assert (worktree / ".claude/skills/bmad-dev-story/steps/step-01.md").read_text() == \
        ".claude/skills/bmad-dev-story/steps/step-01.md\n"
    assert (worktree / "_bmad/bmm/config.yaml").is_file()
    go(bar, "1-1-alpha")
    assert wait_for_exit(proc) == 0, repo.spawned_logs()
    tracked = repo.git("ls-tree", "-r", "--name-only", "main").splitlines()
    assert "src/alpha.py" in tracked
    assert not [p for p in tracked if p.startswith(("_bmad/", ".claude/"))]
    # The checkout's own install is untouched.
    assert (repo.root / "_bmad/bmm/config.yaml").read_text() == "_bmad/bmm/config.yaml\n"


def test_seed_bmad_false_leaves_the_install_out(make_repo, bar):
    stories = [StoryDef("1-1-alpha", files=["src/alpha.py"])]
    repo = make_repo(stories, script=barrier_script(stories, bar),
                     policy='[gates]\nmode = "none"\n[scm]\nseed_bmad = false\n')
    _files(repo.root, "_bmad/bmm/config.yaml")
    (repo.root / ".git" / "info" / "exclude").write_text("_bmad/\n")
    proc = repo.spawn("run")
    wait_for_files(bar / "in-1-1-alpha")
    worktree = Path(repo.calls()[0]["cwd"])
    assert not (worktree / "_bmad").exists()
    go(bar, "1-1-alpha")
    assert wait_for_exit(proc) == 0, repo.spawned_logs()


# --- the prompt a shipped profile's CLI gets, per install (stand-in CLIs of tests/agents) ------

def _profile_run(make_repo, tmp_path, monkeypatch, install: tuple[str, ...]) -> list[dict]:
    import json
    import os

    from support import install_fake_clis

    bin_dir = install_fake_clis(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    script = tmp_path / "fake-cli-script.json"
    script.write_text(json.dumps({"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}}))
    monkeypatch.setenv("FAKE_CLI_SCRIPT", str(script))
    repo = make_repo([StoryDef("1-1-alpha", files=["src/alpha.py"])],
                     policy='[gates]\nmode = "none"\n[adapter]\nprofile = "claude"\ntimeout_s = 60\n')
    _files(repo.root, *install)
    (repo.root / ".git" / "info" / "exclude").write_text("_bmad/\n.claude/\n.agents/\n")
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in Path(f"{script}.calls").read_text().splitlines()]


def test_a_profile_on_a_v6_2_skills_project_is_told_to_run_the_skills(make_repo, tmp_path,
                                                                      monkeypatch):
    calls = _profile_run(make_repo, tmp_path, monkeypatch, (
        ".claude/skills/bmad-dev-story/SKILL.md", ".claude/skills/bmad-code-review/SKILL.md"))
    prompts = {c["phase"]: c["prompt"] for c in calls}
    assert set(prompts) == {"dev", "review"}
    assert "run the `bmad-dev-story` skill" in prompts["dev"]
    assert "run the `bmad-code-review` skill" in prompts["review"]
    for text in prompts.values():
        section = text.split("## BMAD in this project")[1]
        assert "4-implementation" not in text and "is not installed" not in section


def test_a_profile_on_a_v6_0_workflows_project_is_sent_to_the_workflow_folders(make_repo, tmp_path,
                                                                             monkeypatch):
    base = "_bmad/bmm/workflows/4-implementation"
    calls = _profile_run(make_repo, tmp_path, monkeypatch, (
        f"{base}/dev-story/workflow.yaml", f"{base}/code-review/workflow.yaml"))
    prompts = {c["phase"]: c["prompt"] for c in calls}
    assert f"`{base}/dev-story/`" in prompts["dev"]
    assert f"`{base}/code-review/`" in prompts["review"]
    assert "skill" not in prompts["dev"].split("## BMAD in this project")[1]


def test_a_profile_on_a_project_without_bmad_is_told_to_work_by_hand(make_repo, tmp_path,
                                                                    monkeypatch):
    calls = _profile_run(make_repo, tmp_path, monkeypatch, ())
    (dev,) = [c["prompt"] for c in calls if c["phase"] == "dev"]
    assert "BMAD is not installed in this project" in dev.split("## BMAD in this project")[1]
