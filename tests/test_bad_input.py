"""Bad input before anything runs: exit 2, one line naming the file, key or story, nothing changed.

"Nothing changed" means: no `runs` rows (or no state database at all), no refs under
refs/heads/bmad-loop or refs/bmad-loop, and no worktree besides the main checkout. Every case
goes through the real CLI on a real repository; `run` would start real huey consumers if the
input got that far.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pytest

from support import StoryDef, git, make_remote_project

TWO = [
    StoryDef("1-1-alpha", files=["src/alpha.py"]),
    StoryDef("1-2-beta", files=["src/beta.py"]),
]

ENTRY_POINTS = ["run", "enqueue"]

WITH_VALIDATE_OF_DEPENDENCIES = ENTRY_POINTS + ["validate"]


# ------------------------------------------------------------------------------ helpers
def run_rows(repo) -> list[tuple]:
    """The `runs` rows of the state database; [] when there is no database (or no table) yet."""
    path = repo.root / ".bmad-loop" / "state.db"
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        try:
            return conn.execute("SELECT id, state FROM runs ORDER BY id").fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise


def assert_nothing_changed(repo, *, runs_before: list[tuple] | None = None) -> None:
    assert run_rows(repo) == (runs_before or []), "bad input created run rows"
    if not runs_before:  # no database before: bad input makes neither the database nor the queue
        made = [name for name in ("state.db", "queue.db") if (repo.root / ".bmad-loop" / name).exists()]
        assert made == [], f"bad input created {made}"
    assert repo.bmad_branches() == [], "bad input created refs"
    assert repo.worktrees() == [str(repo.root)], "bad input created worktrees"


def assert_refused(repo, result, *needles: str, runs_before: list[tuple] | None = None) -> str:
    """Exit 2, exactly one error line on stderr that names every needle, nothing changed."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got: {result.stderr!r}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not named in: {lines[0]}"
    assert_nothing_changed(repo, runs_before=runs_before)
    return lines[0]


def assert_validate_refuses(repo, *needles: str) -> None:
    result = repo.cli("validate")
    assert result.exit_code == 2, result.output
    failed = [line for line in result.output.splitlines() if line.startswith("FAIL")]
    assert failed, f"validate reported no failure:\n{result.output}"
    for needle in needles:
        assert any(needle in line for line in failed), f"{needle!r} not in {failed}"
    assert_nothing_changed(repo)


def write_board(repo, body: str) -> None:
    repo.board.write_text(body)
    repo.commit_all("hand-written board")


# ------------------------------------------------------------------------------ the policy
@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_a_malformed_policy_toml_is_refused_naming_the_file(make_repo, command):
    repo = make_repo(TWO)
    repo.write_policy('[scm\nmax_parallel = 2\n', agent=False)
    assert_refused(repo, repo.cli(command), "policy.toml", "invalid TOML")


def test_validate_refuses_a_malformed_policy_toml_naming_the_file(make_repo):
    repo = make_repo(TWO)
    repo.write_policy('[scm\nmax_parallel = 2\n', agent=False)
    assert_validate_refuses(repo, "policy.toml")


@pytest.mark.parametrize("command", ENTRY_POINTS + ["validate"])
def test_an_unknown_policy_key_is_refused_naming_the_nearest_valid_key(make_repo, command):
    repo = make_repo(TWO, policy="[scm]\nmax_paralel = 2\n")
    if command == "validate":
        return assert_validate_refuses(repo, "max_paralel", "max_parallel")
    line = assert_refused(repo, repo.cli(command), "policy.toml", "[scm] max_paralel",
                          "max_parallel")
    assert "unknown key" in line


@pytest.mark.parametrize("command", ENTRY_POINTS + ["validate"])
def test_a_policy_value_of_the_wrong_type_is_refused_naming_the_key(make_repo, command):
    repo = make_repo(TWO, policy='[scm]\nmax_parallel = "two"\n')
    if command == "validate":
        return assert_validate_refuses(repo, "max_parallel", "integer")
    assert_refused(repo, repo.cli(command), "policy.toml", "[scm] max_parallel", "integer")


@pytest.mark.parametrize("command", ENTRY_POINTS + ["validate"])
def test_max_parallel_above_one_in_place_is_refused_naming_both_keys(make_repo, command):
    repo = make_repo(TWO, policy='[scm]\nmax_parallel = 2\nisolation = "none"\n')
    if command == "validate":
        return assert_validate_refuses(repo, "max_parallel", "isolation")
    assert_refused(repo, repo.cli(command), "policy.toml", "max_parallel", "isolation")


# ------------------------------------------------------------------------------ the board
@pytest.mark.parametrize("command", ENTRY_POINTS + ["validate"])
def test_a_malformed_sprint_status_is_refused_naming_the_file(make_repo, command):
    repo = make_repo(TWO)
    write_board(repo, "development_status:\n  1-1-alpha: ready-for-dev\n   1-2-beta: [unclosed\n")
    if command == "validate":
        return assert_validate_refuses(repo, "sprint-status.yaml")
    assert_refused(repo, repo.cli(command), "sprint-status.yaml")


@pytest.mark.parametrize("command", ENTRY_POINTS + ["validate"])
def test_a_story_key_that_would_escape_the_worktree_root_is_refused_naming_it(make_repo, command):
    repo = make_repo(TWO)
    write_board(repo, "development_status:\n  epic-1: backlog\n  1-1-alpha: ready-for-dev\n"
                      "  1-9-../../evil: ready-for-dev\n")
    if command == "validate":
        return assert_validate_refuses(repo, "1-9-../../evil")
    assert_refused(repo, repo.cli(command), "sprint-status.yaml", "1-9-../../evil")
    assert not (repo.root.parent / "evil").exists()


@pytest.mark.parametrize("command", ENTRY_POINTS + ["validate"])
def test_a_story_key_git_refuses_in_a_branch_name_is_refused_naming_it(make_repo, command):
    repo = make_repo(TWO)
    write_board(repo, "development_status:\n  epic-1: backlog\n  1-1-alpha: ready-for-dev\n"
                      "  1-9-bad~name: ready-for-dev\n")
    if command == "validate":
        return assert_validate_refuses(repo, "1-9-bad~name")
    assert_refused(repo, repo.cli(command), "sprint-status.yaml", "1-9-bad~name")


# ------------------------------------------------------------------------------ environment
@pytest.mark.parametrize("command", ENTRY_POINTS + ["validate"])
def test_a_missing_agent_binary_is_refused_naming_it(make_repo, command):
    repo = make_repo(TWO)
    repo.write_policy('[adapter]\ncommand = ["definitely-not-installed-agent"]\n')
    if command == "validate":
        return assert_validate_refuses(repo, "definitely-not-installed-agent")
    assert_refused(repo, repo.cli(command), "definitely-not-installed-agent", "policy.toml")


@pytest.mark.parametrize("command", ENTRY_POINTS + ["validate"])
def test_a_detached_head_without_target_branch_is_refused(make_repo, command):
    repo = make_repo(TWO)
    repo.git("checkout", "-q", "--detach")
    if command == "validate":
        return assert_validate_refuses(repo, "detached", "target_branch")
    assert_refused(repo, repo.cli(command), "detached", "target_branch")


# ------------------------------------------------------------------------------ selectors
@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_selecting_an_unknown_story_is_refused_naming_it(make_repo, command):
    repo = make_repo(TWO)
    assert_refused(repo, repo.cli(command, "--story", "7-7-nowhere"), "7-7-nowhere")


@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_selecting_a_done_story_is_refused_naming_it_and_its_status(make_repo, command):
    repo = make_repo([StoryDef("1-1-alpha", files=["src/alpha.py"], status="done"),
                      StoryDef("1-2-beta", files=["src/beta.py"])])
    assert_refused(repo, repo.cli(command, "--story", "1-1-alpha"), "1-1-alpha", "done")


@pytest.mark.parametrize("command", ENTRY_POINTS)
@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_a_parallel_override_that_is_not_a_positive_integer_is_refused(make_repo, command, value):
    repo = make_repo(TWO)
    assert_refused(repo, repo.cli(command, "--parallel", value), "--parallel", value)


# ------------------------------------------------------------------------------ dependencies
@pytest.mark.parametrize("command", WITH_VALIDATE_OF_DEPENDENCIES)
def test_an_unknown_dependency_is_refused_naming_the_story_and_the_dependency(make_repo, command):
    repo = make_repo([
        StoryDef("1-1-alpha", files=["src/alpha.py"]),
        StoryDef("1-2-beta", files=["src/beta.py"],
                 extra_front_matter={"depends_on": ["1-7-ghost"]}),
    ])
    if command == "validate":
        return assert_validate_refuses(repo, "1-2-beta", "1-7-ghost")
    assert_refused(repo, repo.cli(command), "1-2-beta", "1-7-ghost")


@pytest.mark.parametrize("command", WITH_VALIDATE_OF_DEPENDENCIES)
def test_a_dependency_cycle_is_refused_naming_the_cycle(make_repo, command):
    repo = make_repo([
        StoryDef("1-1-alpha", files=["src/alpha.py"],
                 extra_front_matter={"depends_on": ["1-2-beta"]}),
        StoryDef("1-2-beta", files=["src/beta.py"],
                 extra_front_matter={"depends_on": ["1-1-alpha"]}),
    ])
    if command == "validate":
        return assert_validate_refuses(repo, "cycle", "1-1-alpha", "1-2-beta")
    assert_refused(repo, repo.cli(command), "cycle", "1-1-alpha", "1-2-beta")


# ------------------------------------------------------------------------------ not errors
@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_an_empty_selection_exits_zero_saying_there_is_nothing_to_do(make_repo, command):
    repo = make_repo([
        StoryDef("1-1-alpha", files=["src/alpha.py"], status="done"),
        StoryDef("1-2-beta", files=["src/beta.py"], status="done"),
        StoryDef("2-1-gamma", files=["src/gamma.py"]),
    ])
    result = repo.cli(command, "--epic", "1")
    assert result.exit_code == 0, result.output
    assert "nothing to do" in result.output
    assert_nothing_changed(repo)


@pytest.mark.parametrize("second", ENTRY_POINTS)
def test_a_second_enqueue_on_a_live_target_is_refused_naming_the_live_run(make_repo, second):
    repo = make_repo(TWO)
    first = repo.cli("enqueue")
    assert first.exit_code == 0, first.output
    run_id = first.stdout.strip().splitlines()[-1]
    before = run_rows(repo)
    assert before == [(run_id, "running")]
    stories_before = repo.status(run_id)["stories"]

    result = repo.cli(second)
    assert_refused(repo, result, run_id, "main", runs_before=before)
    after = repo.status(run_id)
    assert after["run"]["state"] == "running"
    assert [(s["key"], s["state"]) for s in after["stories"]] == \
        [(s["key"], s["state"]) for s in stories_before]
    assert [e["kind"] for e in repo.journal(run_id)] == ["run.created"]


# ------------------------------------------------------------------------------ remote mode
def worker_with_clone(repo, clone) -> SimpleNamespace:
    """`worker --clone CLONE` as a real process (a timeout, not a hang, if it starts after all)."""
    proc = subprocess.run([sys.executable, "-m", "bmad_loop", "worker", "--project", str(repo.root),
                           "--queue", "stories", "--clone", str(clone)],
                          capture_output=True, text=True, timeout=60)
    return SimpleNamespace(exit_code=proc.returncode, stderr=proc.stderr,
                           output=proc.stdout + proc.stderr)


def test_a_clone_in_local_mode_is_refused_naming_the_scm_remote_key(make_repo, tmp_path):
    repo = make_repo(TWO)
    clone = tmp_path / "clone"
    assert_refused(repo, worker_with_clone(repo, clone), "[scm] remote", str(clone))
    assert not clone.exists()


def test_a_clone_folder_that_is_not_empty_and_not_a_clone_is_refused_untouched(make_repo, tmp_path):
    repo, _ = make_remote_project(make_repo, TWO, {}, "[scm]\n")
    clone = tmp_path / "not-a-clone"
    clone.mkdir()
    (clone / "notes.txt").write_text("mine\n")
    assert_refused(repo, worker_with_clone(repo, clone), str(clone), "not empty")
    assert [p.name for p in clone.iterdir()] == ["notes.txt"]


def test_a_clone_folder_holding_a_clone_of_another_repository_is_refused(make_repo, tmp_path):
    repo, bare = make_remote_project(make_repo, TWO, {}, "[scm]\n")
    other = make_repo(TWO, name="other")
    clone = tmp_path / "other-clone"
    git(tmp_path, "clone", "-q", str(other.root), str(clone))
    refs_before = git(clone, "for-each-ref")
    assert_refused(repo, worker_with_clone(repo, clone), str(clone), "not a clone of", str(bare))
    assert git(clone, "for-each-ref") == refs_before
    assert git(clone, "status", "--porcelain") == ""


def test_validate_refuses_remote_mode_without_worktrees_naming_the_scm_remote_key(make_repo):
    repo, _ = make_remote_project(make_repo, TWO, {}, '[scm]\nisolation = "none"\n')
    assert_validate_refuses(repo, "[scm] remote", "isolation")


def test_a_remote_name_the_checkout_does_not_have_is_refused_naming_it(make_repo):
    repo = make_repo(TWO, policy='[scm]\nremote = "nosuchremote"\n')
    assert_refused(repo, repo.cli("enqueue"), "nosuchremote", "[scm] remote")
    assert not (repo.root / ".bmad-loop" / "state.db").exists()


# ------------------------------------------------------------------------------ the state database
UNREACHABLE_DB = "postgresql+psycopg://nobody:hunter2@127.0.0.1:1/none"


@pytest.mark.parametrize("command", ["status", "history", "enqueue", "run", "init"])
def test_an_unreachable_state_database_is_one_line_hiding_the_password(make_repo, command):
    pytest.importorskip("psycopg")
    repo = make_repo(TWO, policy=f'[database]\nurl = "{UNREACHABLE_DB}"\n')
    line = assert_refused(repo, repo.cli(command), "cannot reach the state database",
                          "postgresql+psycopg://nobody:***@127.0.0.1:1/none")
    assert "hunter2" not in line
