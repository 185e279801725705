"""Small things an operator meets in a night and a morning, each as the CLI shows it: what a
passed verify ran, a gate's wait journaled once, a vanished worktree said plainly, why
`cleanup` keeps what it keeps, `init` outside a repository, a board path from a variable."""

from __future__ import annotations

import shutil

from click.testing import CliRunner

from bmad_loop.cli import cli
from support import StoryDef, spawn_cli, wait_for_files

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])


def _writes(*stories):
    return {s.key: {"dev": [{"write": {s.files[0]: f"# {s.key}\n"}}]} for s in stories}


def test_verify_passed_names_the_commands_that_ran(make_repo):
    repo = make_repo([ALPHA], script=_writes(ALPHA),
                     policy='[verify]\ncommands = ["true", "test -d src"]\n[gates]\nmode = "none"\n')
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert "verify.passed 1-1-alpha command=true && test -d src exit_code=0" in result.output
    passed = [e for e in repo.journal() if e["kind"] == "verify.passed"]
    assert [e["data"]["command"] for e in passed] == ["true && test -d src"]


def test_a_gate_journals_its_wait_once(make_repo):
    """Two epics, two slots: the pass that finds the gate admits twice on the same rows (start
    first, then dispatch); the wait was journaled by both."""
    stories = [StoryDef(k, files=[f"src/{k}.py"]) for k in ("1-1-a", "1-2-b", "2-1-c", "2-2-d")]
    repo = make_repo(stories, script=_writes(*stories), policy="[scm]\nmax_parallel = 2\n")
    result = repo.cli("run")
    assert result.exit_code == 3 and "gate before epic 2" in result.output, result.output
    waits = [(e["story"], e["data"]["reason"]) for e in repo.journal() if e["kind"] == "story.waiting"]
    assert waits.count(("2-1-c", "gate before epic 2")) == 1, waits
    assert len(waits) == len(set(waits)), waits


def test_cleanup_says_why_it_keeps_and_a_vanished_worktree_is_said_to_be_harmless(make_repo, tmp_path):
    inside, release = tmp_path / "inside", tmp_path / "release"
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [
        {"write": {"src/alpha.py": "A = 1\n"}, "touch": [str(inside)], "wait_for": str(release)}]}},
        policy='[gates]\nmode = "none"\n')
    run = spawn_cli(repo, "run")
    try:
        wait_for_files(inside)
        run_id = repo.status()["run"]["id"]
        assert repo.cli("stop", run_id).exit_code == 0
        release.write_text("go")
        assert run.finish()[0] == 4
    finally:
        release.write_text("go")
        run.kill()
    story = repo.story(ALPHA.key)
    result = repo.cli("cleanup")
    assert result.exit_code == 0, result.output
    kept = result.output.splitlines()
    assert any(line.startswith("  kept ") and f"run {run_id} is stopped: `resume` needs them" in line
               for line in kept), result.output

    shutil.rmtree(story["worktree"])
    result = repo.cli("cleanup")
    assert result.exit_code == 0 and "rows marked 1" in result.output, result.output
    missing = [e for e in repo.journal() if e["kind"] == "story.worktree_missing"]
    assert len(missing) == 1
    reason = missing[0]["data"]["reason"]
    assert f"made again from branch {story['branch']}" in reason and "nothing to do" in reason
    result = repo.cli("resume", run_id)
    assert result.exit_code == 0, result.output


def test_init_outside_a_git_repository_is_exit_2_and_writes_nothing(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    result = CliRunner().invoke(cli, ["init", "--project", str(folder)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"bmad-loop: {folder.resolve()}: not a git repository; run `git init` (or clone the "
        "repository) first, then `bmad-loop init` in it"]
    assert list(folder.iterdir()) == []


def test_a_bad_board_path_from_the_environment_names_the_variable(make_repo, monkeypatch):
    repo = make_repo([ALPHA], script=_writes(ALPHA))
    monkeypatch.setenv("BMAD_LOOP_STORIES_SPRINT_STATUS", "nope.yaml")
    result = repo.cli("validate")
    assert result.exit_code == 2
    line = next(x for x in result.output.splitlines() if x.startswith("FAIL stories"))
    assert line.endswith("nope.yaml: sprint status file not found (BMAD_LOOP_STORIES_SPRINT_STATUS)")
    result = repo.cli("run")
    assert result.exit_code == 2 and "(BMAD_LOOP_STORIES_SPRINT_STATUS)" in result.output
    assert "policy [stories]" not in result.output
