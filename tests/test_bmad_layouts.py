"""Every BMAD layout in issue 13, through the CLI: the board and each story's file found where
the project keeps them, from the committed target, from any folder of the repository."""

from __future__ import annotations

import json
import subprocess

import pytest

from bmad_fixtures import (LAYOUTS, V4_ORDER, BmadLayout, IMPL, V6_LINES, board_text, build_layout,
                           story_text, v4_layout)
from bmad_loop.bmad.story_files import read_story_status
from support import cli_argv, git, write

RUN_POLICY = '[gates]\nmode = "none"\n[review]\nenabled = false\n'


def validate(repo, *args: str) -> tuple[int, dict]:
    result = repo.cli("validate", "--json", *args)
    return result.exit_code, json.loads(result.output)


def check(report: dict, name: str) -> list[dict]:
    return [c for c in report["checks"] if c["name"] == name]


def errors(report: dict) -> list[str]:
    return [c["detail"] for c in report["checks"] if c["status"] == "error"]


def warnings(report: dict) -> list[str]:
    return [c["detail"] for c in report["checks"] if c["status"] == "warn"]


# --- each layout: validate finds the board and every story file ---


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
def test_validate_finds_the_board_and_story_files_of_each_layout(tmp_path, layout: BmadLayout):
    repo = build_layout(tmp_path, layout)
    code, report = validate(repo)
    assert errors(report) == [] and code == 0, report
    assert report["board"]["path"] == layout.board
    assert report["board"]["format"] == "v6"
    assert layout.board_reason in report["board"]["reason"]
    stories = {s["key"]: (s["file"], s["found"]) for s in report["stories"]}
    assert stories == {key: (rel, layout.is_found(key)) for key, rel in layout.story_files.items()}
    stories_check = check(report, "stories")[0]["detail"]
    assert "3 stories, 2 actionable, 1 with a story file" in stories_check
    if layout.warns:
        assert any("story_location" in w and layout.warns in w for w in warnings(report)), report
    else:
        assert not any("story_location" in w for w in warnings(report)), report


@pytest.mark.parametrize("with_config", [True, False], ids=["core-config", "story-files-only"])
def test_a_v4_project_is_read_from_its_story_files_in_numeric_order(tmp_path, with_config):
    layout = v4_layout(with_config=with_config)
    repo = build_layout(tmp_path, layout)
    code, report = validate(repo)
    assert code == 0 and errors(report) == [], report
    assert report["board"]["format"] == "v4" and "BMAD v4" in report["board"]["reason"]
    assert report["board"]["story_folder"] == "docs/stories"
    # Approved is the one actionable v4 status; 1.10 comes after 1.3 (numeric, not text order)
    assert [(s["key"], s["status"], s["file"], s["found"]) for s in report["stories"]] == [
        ("1.2.login", "ready-for-dev", "docs/stories/1.2.login.md", True),
        ("1.10.export", "ready-for-dev", "docs/stories/1.10.export.md", True),
    ]
    assert f"{len(V4_ORDER)} stories, 2 actionable" in check(report, "stories")[0]["detail"]
    assert not any("does not know" in w for w in warnings(report)), report


def test_a_v4_run_integrates_the_approved_stories_and_writes_no_board(tmp_path):
    layout = v4_layout()
    script = {key: {"dev": [{"write": {f"src/s{key.replace('.', '_')}.py": f"K = '{key}'\n"}}]}
              for key in layout.story_files}
    repo = build_layout(tmp_path, layout, policy=RUN_POLICY, script=script)
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert {s["key"]: s["state"] for s in repo.status()["stories"]} == {
        "1.2.login": "integrated", "1.10.export": "integrated"}
    assert repo.git("show", "main:src/s1_10_export.py") == "K = '1.10.export'"
    assert "sprint-status.yaml" not in repo.git("ls-tree", "-r", "--name-only", "main")
    # the lane wrote each story file's own status instead, in v4's case style
    for key in ("1.2.login", "1.10.export"):
        text = repo.git("show", f"main:docs/stories/{key}.md")
        assert read_story_status(text).value == "Done", text
    assert read_story_status(repo.git("show", "main:docs/stories/2.1.md")).value == "Draft"
    assert repo.status()["run"]["state"] == "completed"


# --- finding the board: several, none, policy ---


def test_two_boards_in_known_places_are_an_error_listing_both_and_naming_the_policy_key(tmp_path):
    layout = LAYOUTS[2]  # docs/implementation-artifacts
    layout = BmadLayout(layout.name, {**layout.committed,
                                      "docs/sprint-status.yaml": board_text(*V6_LINES)},
                        layout.board, layout.story_files)
    repo = build_layout(tmp_path, layout)
    code, report = validate(repo)
    assert code == 2
    (message,) = errors(report)
    assert "docs/implementation-artifacts/sprint-status.yaml" in message
    assert "docs/sprint-status.yaml" in message and "[stories] sprint_status" in message
    repo.write_policy('[stories]\nsprint_status = "docs/sprint-status.yaml"\n')
    code, report = validate(repo)
    assert report["board"] == {**report["board"], "path": "docs/sprint-status.yaml",
                               "reason": "policy [stories] sprint_status"}


def test_no_board_anywhere_lists_where_it_looked(tmp_path):
    repo = build_layout(tmp_path, BmadLayout("empty", {"README.md": "# x\n"}, None, {}))
    code, report = validate(repo)
    assert code == 2
    (message,) = errors(report)
    for place in ("_bmad-output/implementation-artifacts/sprint-status.yaml",
                  "docs/sprint-artifacts/sprint-status.yaml", "docs/sprint-status.yaml",
                  ".bmad-core/core-config.yaml", "[stories] sprint_status"):
        assert place in message
    assert "\n" not in message
    result = repo.cli("run")
    assert result.exit_code == 2 and "no sprint board found" in result.output
    assert not (repo.root / ".bmad-loop" / "state.db").exists()


def test_a_config_naming_a_board_elsewhere_wins_over_a_known_place(tmp_path):
    layout = LAYOUTS[0]
    files = {**layout.committed, "docs/sprint-status.yaml": board_text("epic-9: backlog"),
             "_bmad/bmm/config.yaml": "implementation_artifacts: '{project-root}/_bmad-output/implementation-artifacts'\n"}
    repo = build_layout(tmp_path, BmadLayout("config-wins", files, layout.board, layout.story_files))
    code, report = validate(repo)
    assert code == 0, report
    assert report["board"]["path"] == f"{IMPL}/sprint-status.yaml"


def test_a_malformed_bmad_config_names_the_file(tmp_path):
    layout = LAYOUTS[0]
    repo = build_layout(tmp_path, layout)
    write(repo.root / "_bmad/bmm/config.yaml", "output_folder: [\n")
    code, report = validate(repo)
    assert code == 2
    assert any("_bmad/bmm/config.yaml: invalid YAML" in e for e in errors(report))


# --- story files: two matches, a policy story_dir ---


def test_two_files_matching_one_story_are_an_error_naming_both(tmp_path):
    layout = LAYOUTS[0]
    files = {**layout.committed, f"{IMPL}/spec-1-2-login.md": story_text("1-2-login")}
    repo = build_layout(tmp_path, BmadLayout("two", files, layout.board, layout.story_files))
    code, report = validate(repo)
    assert code == 2
    (message,) = errors(report)
    assert "story 1-2-login" in message
    assert f"{IMPL}/1-2-login.md" in message and f"{IMPL}/spec-1-2-login.md" in message


def test_a_policy_story_dir_outside_the_repository_stays_an_error(tmp_path):
    repo = build_layout(tmp_path, LAYOUTS[0])
    repo.write_policy('[stories]\nstory_dir = "../elsewhere"\n')
    code, report = validate(repo)
    assert code == 2
    assert any("[stories] story_dir" in e and "outside the repository" in e for e in errors(report))


def test_a_policy_story_dir_wins_over_the_board(tmp_path):
    layout = LAYOUTS[0]
    files = {**layout.committed, "mine/1-2-login.md": story_text("1-2-login")}
    repo = build_layout(tmp_path, BmadLayout("mine", files, layout.board, layout.story_files))
    repo.write_policy('[stories]\nstory_dir = "mine"\n')
    code, report = validate(repo)
    assert code == 0, report
    assert {s["key"]: s["file"] for s in report["stories"]} == {
        "1-2-login": "mine/1-2-login.md", "1-3-logout": "mine/1-3-logout.md"}


# --- one source of truth: the committed target ---


def test_an_uncommitted_board_edit_fails_validate_and_run_exits_2_naming_it(tmp_path):
    layout = LAYOUTS[0]
    repo = build_layout(tmp_path, layout, policy=RUN_POLICY)
    board = repo.root / layout.board
    board.write_text(board.read_text().replace("1-1-scaffold: done", "1-1-scaffold: review"))
    code, report = validate(repo)
    assert code == 2
    (message,) = errors(report)
    assert layout.board in message and "commit them first" in message
    result = repo.cli("run")
    assert result.exit_code == 2
    assert layout.board in result.output and "commit them first" in result.output
    assert repo.bmad_branches() == [] and not (repo.root / ".bmad-loop" / "state.db").exists()


def test_an_untracked_story_file_where_create_would_write_fails_until_committed(tmp_path):
    layout = LAYOUTS[0]
    repo = build_layout(tmp_path, layout)
    write(repo.root / IMPL / "1-3-logout.md", story_text("1-3-logout", files=["src/out.py"]))
    code, report = validate(repo)
    assert code == 2
    assert any(f"{IMPL}/1-3-logout.md (untracked)" in e for e in errors(report)), report
    # the plan is the committed one meanwhile: the story still has no file there
    assert {s["key"]: s["found"] for s in report["stories"]}["1-3-logout"] is False
    repo.commit_all("create-story 1-3")
    code, report = validate(repo)
    assert code == 0, report
    assert {s["key"]: s["found"] for s in report["stories"]}["1-3-logout"] is True


def test_an_uncommitted_change_to_an_unselected_story_does_not_block_a_run(tmp_path):
    layout = LAYOUTS[0]
    script = {"1-2-login": {"dev": [{"write": {"src/1-2-login.py": "x = 1\n"}}]}}
    repo = build_layout(tmp_path, layout, policy=RUN_POLICY, script=script)
    (repo.root / IMPL / "1-1-scaffold.md").write_text("edited, not committed\n")
    result = repo.cli("run", "--story", "1-2-login")
    assert result.exit_code == 0, result.output
    assert repo.story("1-2-login")["state"] == "integrated"


def test_a_board_only_in_the_working_copy_is_refused_as_not_committed(tmp_path):
    layout = LAYOUTS[2]
    files = {k: v for k, v in layout.committed.items() if not k.endswith("sprint-status.yaml")}
    repo = build_layout(tmp_path, BmadLayout("wc-board", files, layout.board, layout.story_files))
    write(repo.root / layout.board, layout.committed[layout.board])
    code, report = validate(repo)
    assert code == 2
    assert any("not committed on main" in e and "commit it first" in e for e in errors(report))


# --- from any folder ---


def test_validate_and_run_from_a_subfolder_find_the_project(tmp_path):
    layout = LAYOUTS[3]  # docs/sprint-artifacts
    script = {"1-2-login": {"dev": [{"write": {"src/1-2-login.py": "x = 1\n"}}]}}
    repo = build_layout(tmp_path, layout, policy=RUN_POLICY, script=script)
    sub = repo.root / "src" / "deep"
    sub.mkdir(parents=True)
    proc = subprocess.run(cli_argv("validate", "--json"), cwd=sub, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["board"]["path"] == layout.board
    proc = subprocess.run(cli_argv("run", "--story", "1-2-login"), cwd=sub, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert git(repo.root, "show", "main:src/1-2-login.py") == "x = 1"
    proc = subprocess.run(cli_argv("status", "--json", "--project", str(sub)), capture_output=True,
                          text=True)
    assert proc.returncode == 0 and json.loads(proc.stdout)["run"]["state"] == "completed"
    assert not (sub / ".bmad-loop").exists()


@pytest.mark.parametrize("layout", [LAYOUTS[5], LAYOUTS[9], LAYOUTS[12]], ids=lambda lay: lay.name)
def test_a_run_on_a_layout_integrates_and_only_status_tokens_change(tmp_path, layout):
    script = {"1-2-login": {"dev": [{"write": {"src/1-2-login.py": "x = 2\n"}}]}}
    repo = build_layout(tmp_path, layout, policy=RUN_POLICY, script=script)
    before = repo.git("show", f"main:{layout.board}")
    result = repo.cli("run", "--story", "1-2-login")
    assert result.exit_code == 0, result.output
    assert repo.story("1-2-login")["state"] == "integrated"
    after = repo.git("show", f"main:{layout.board}")
    assert after == before.replace("1-2-login: ready-for-dev", "1-2-login: done")
    (call,) = [c for c in repo.calls() if c["phase"] == "dev"]
    assert call["env"]["BMAD_LOOP_STORY_FILE"].endswith(layout.story_files["1-2-login"])
