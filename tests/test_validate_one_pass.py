"""`validate` shows every problem of a board in one pass, and suggests the word a typo meant."""

import json

from support import STORY_DIR, StoryDef


def _broken_board(make_repo):
    """Four problems at once: a story file whose front matter is not YAML, a dependency on a
    story that does not exist, a status typo on the board and a footprint key typo."""
    repo = make_repo([StoryDef("1-1-alpha", files=["src/alpha.py"]),
                      StoryDef("1-2-beta", files=["src/beta.py"],
                               extra_front_matter={"depends_on": ["9-9-nowhere"]}),
                      StoryDef("1-3-gamma", files=["src/gamma.py"]),
                      StoryDef("1-4-delta", files=["src/delta.py"], footprint=False,
                               extra_front_matter={"footprint": {"file": ["src/delta.py"]}})])
    folder = repo.root / STORY_DIR
    (folder / "1-1-alpha.md").write_text("---\ntitle: [unclosed\n---\n# Story 1.1: Alpha\n")
    board = folder / "sprint-status.yaml"
    board.write_text(board.read_text().replace("1-3-gamma: ready-for-dev", "1-3-gamma: ready-for-dve"))
    repo.commit_all("a board with four problems")
    return repo


def test_validate_reports_every_story_problem_and_still_checks_the_board_and_footprints(make_repo):
    repo = _broken_board(make_repo)
    result = repo.cli("validate")
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    fails = [line for line in lines if line.startswith("FAIL stories: ")]
    assert any("1-1-alpha.md" in line and "front matter is not valid YAML" in line for line in fails), lines
    assert any("1-2-beta.md" in line and "depends on unknown story '9-9-nowhere'" in line
               for line in fails), lines
    # The checks after the story files ran too: the board's status and the footprint typo.
    assert any(line.startswith("warn board: ") and "1-3-gamma" in line
               and "did you mean 'ready-for-dev'?" in line for line in lines), lines
    assert any(line.startswith("warn footprint: ") and "1-4-delta" in line
               and "unknown key 'file' (did you mean 'files'?)" in line for line in lines), lines
    # Each problem once, on its own line; the exit once at the end.
    assert sum("9-9-nowhere" in line for line in lines) == 1
    assert sum("front matter is not valid YAML" in line for line in lines) == 1


def test_validate_json_lists_each_problem_as_its_own_error(make_repo):
    repo = _broken_board(make_repo)
    result = repo.cli("validate", "--json")
    assert result.exit_code == 2
    report = json.loads(result.output)
    assert report["ok"] is False
    errors = [c["detail"] for c in report["checks"] if c["status"] == "error"]
    assert any("1-1-alpha.md" in e for e in errors) and any("9-9-nowhere" in e for e in errors)
    assert any(c["name"] == "board" and c["status"] == "ok" for c in report["checks"])


def test_run_still_refuses_the_first_story_problem_with_one_line_and_writes_nothing(make_repo):
    repo = _broken_board(make_repo)
    result = repo.cli("run")
    assert result.exit_code == 2
    assert "1-1-alpha.md" in result.output and "front matter is not valid YAML" in result.output
    assert not (repo.root / ".bmad-loop" / "state.db").exists()


def test_a_status_typo_and_a_footprint_key_typo_get_the_nearest_known_word(make_repo):
    repo = make_repo([StoryDef("1-1-alpha", files=["src/alpha.py"], status="ready-for-dve"),
                      StoryDef("1-2-beta", footprint=False,
                               extra_front_matter={"footprint": {"file": ["src/beta.py"]}})])
    result = repo.cli("validate")
    assert result.exit_code == 0, result.output  # both are warnings, never errors
    assert "has status 'ready-for-dve', which bmad-loop does not know; it is not run " \
           "(did you mean 'ready-for-dev'?)" in result.output
    assert "story 1-2-beta: footprint invalid: unknown key 'file' (did you mean 'files'?)" \
           in result.output
