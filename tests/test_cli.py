"""The command line as users and scripts see it: help, docs, init, validate, and the JSON contracts."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bmad_loop.cli import cli
from bmad_loop.policy import default_policy_text
from support import StoryDef, init_repo, write_each

REPO_ROOT = Path(__file__).resolve().parents[1]
CLI_DOC = REPO_ROOT / "docs" / "cli.md"
COMMANDS = sorted(cli.commands)

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
BETA = StoryDef("1-2-beta", files=["src/beta.py"])
WRITE_EACH = write_each((ALPHA, BETA))

# The brief's `status --json` contract (more fields may follow; these must be there).
RUN_FIELDS = {"id", "state", "target_branch", "target_sha", "max_parallel"}
STORY_FIELDS = {"key", "seq", "state", "phase", "worktree", "branch", "base_sha", "head_sha",
                "session", "log", "attempt", "footprint", "footprint_reason", "host",
                "heartbeat_at", "elapsed_s"}
CANDIDATE_FIELDS = {"story", "attempt", "state", "ref", "worktree", "target_sha", "candidate_sha",
                    "evidence"}
JOURNAL_FIELDS = {"seq", "ts", "kind", "story", "data"}


# ------------------------------------------------------------------------------ help and docs
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    result = CliRunner().invoke(cli, [command, "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"Usage: cli {command}" in result.output or f"{command} [OPTIONS]" in result.output
    assert cli.commands[command].help, f"`{command}` has no help text"


def test_the_top_level_help_lists_every_command():
    result = CliRunner().invoke(cli, ["--help"], catch_exceptions=False)
    assert result.exit_code == 0
    for command in COMMANDS:
        assert re.search(rf"^\s+{re.escape(command)}\b", result.output, re.M), command


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_is_documented_in_docs_cli_md(command):
    if not CLI_DOC.exists():
        pytest.skip("docs/cli.md does not exist yet; once it does, every command must be in it")
    text = CLI_DOC.read_text()
    mentioned = re.search(rf"bmad-loop\s+{re.escape(command)}\b", text) or re.search(
        rf"^#+ .*\b{re.escape(command)}\b", text, re.M)
    assert mentioned, f"docs/cli.md does not mention `bmad-loop {command}`"


# ------------------------------------------------------------------------------ init
def test_init_twice_keeps_an_existing_policy_and_force_rewrites_it(make_repo):
    repo = make_repo([ALPHA])
    policy = repo.root / ".bmad-loop" / "policy.toml"
    mine = policy.read_text() + "# my own edits\n"
    policy.write_text(mine)

    for _ in range(2):
        result = repo.cli("init")
        assert result.exit_code == 0, result.output
        assert "kept existing" in result.output
        assert policy.read_text() == mine
    assert (repo.root / ".bmad-loop" / "state.db").is_file()

    result = repo.cli("init", "--force")
    assert result.exit_code == 0, result.output
    assert policy.read_text() == default_policy_text()
    assert repo.cli("init").exit_code == 0  # and again after --force: still harmless
    assert policy.read_text() == default_policy_text()


def test_init_in_a_fresh_repository_writes_the_default_policy_and_a_state_database(tmp_path):
    root = init_repo(tmp_path / "fresh")
    result = CliRunner().invoke(cli, ["init", "--project", str(root)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (root / ".bmad-loop" / "policy.toml").read_text() == default_policy_text()
    assert (root / ".bmad-loop" / "state.db").is_file()
    assert (root / ".bmad-loop" / ".gitignore").is_file()


def test_init_gitignores_runtime_files_so_git_status_stays_clean_through_a_run(make_repo):
    repo = make_repo([ALPHA], script=WRITE_EACH)
    repo.git("rm", "-q", ".gitignore")  # make_repo's own ignore rule would hide the point
    repo.git("commit", "-q", "-m", "no top-level ignore rule")
    result = repo.cli("init")
    assert result.exit_code == 0, result.output
    # Runtime files (state.db, its WAL, locks) are ignored; only what teams commit shows up.
    untracked = repo.git("ls-files", "--others", "--exclude-standard").splitlines()
    assert sorted(untracked) == [".bmad-loop/.gitignore", ".bmad-loop/policy.toml"]
    repo.commit_all("bmad-loop policy")
    assert repo.git("status", "--porcelain") == ""

    result = repo.cli("run")  # queue, worktrees, logs, prompts, evidence: all under .bmad-loop/
    assert result.exit_code == 0, result.output
    assert repo.git("status", "--porcelain", "--untracked-files=all") == ""


# ------------------------------------------------------------------------------ validate
def test_validate_json_on_a_good_repository_reports_ok(make_repo):
    repo = make_repo([ALPHA, BETA], policy='[verify]\ncommands = ["true"]\n')  # none: a warning
    result = repo.cli("validate", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ok"] is True
    assert report["checks"], "no checks reported"
    assert all(set(c) >= {"name", "status", "detail"} for c in report["checks"])
    assert [c for c in report["checks"] if c["status"] != "ok"] == []


def test_validate_json_warns_about_a_story_without_a_footprint(make_repo):
    repo = make_repo([ALPHA, StoryDef("1-2-beta", footprint=False)])
    result = repo.cli("validate", "--json")
    assert result.exit_code == 0, result.output  # a warning is not an error
    report = json.loads(result.output)
    assert report["ok"] is True
    warnings = [c for c in report["checks"] if c["status"] == "warn"]
    assert any("1-2-beta" in c["detail"] and "missing" in c["detail"] for c in warnings), warnings
    assert not any("1-1-alpha" in c["detail"] for c in warnings), warnings


# ------------------------------------------------------------------------------ JSON contracts
@pytest.fixture
def finished_repo(make_repo):
    """A repository with one completed run of one story (so there is a candidate row too)."""
    repo = make_repo([ALPHA], script=WRITE_EACH)
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    return repo


def test_status_json_has_the_contract_fields_for_run_stories_and_candidates(finished_repo):
    status = finished_repo.status()
    assert set(status) == {"run", "stories", "candidates", "consumers", "warnings", "flakes",
                           "target_checks"}
    run = status["run"]
    assert RUN_FIELDS <= set(run), RUN_FIELDS - set(run)
    assert run["state"] == "completed" and run["target_branch"] == "main"
    assert run["target_sha"] == finished_repo.git("rev-parse", "main")
    assert run["max_parallel"] == 1
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", run["id"]), run["id"]

    (story,) = status["stories"]
    assert STORY_FIELDS <= set(story), STORY_FIELDS - set(story)
    assert set(story["footprint"]) == {"files", "shared", "resources"}
    assert story["key"] == "1-1-alpha" and story["seq"] == 1 and story["state"] == "integrated"
    assert "src/alpha.py" in story["footprint"]["files"]
    assert isinstance(story["elapsed_s"], (int, float))
    assert story["session"] and story["log"] and Path(story["log"]).is_file()

    assert status["candidates"], "an integrated story leaves its candidate row"
    for candidate in status["candidates"]:
        assert CANDIDATE_FIELDS <= set(candidate), CANDIDATE_FIELDS - set(candidate)
    assert status["candidates"][-1]["story"] == "1-1-alpha"
    assert status["candidates"][-1]["state"] == "advanced"
    assert status["candidates"][-1]["candidate_sha"] == run["target_sha"]


def test_journal_json_lines_have_seq_ts_kind_story_and_data(finished_repo):
    result = finished_repo.cli("journal", "--json")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines() if line.strip()]
    assert lines and lines[0]["kind"] == "run.created" and lines[-1]["kind"] == "run.completed"
    seqs = [line["seq"] for line in lines]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for line in lines:
        assert set(line) == JOURNAL_FIELDS, line
        assert isinstance(line["seq"], int) and isinstance(line["kind"], str)
        assert line["story"] is None or isinstance(line["story"], str)
        assert isinstance(line["data"], dict)
        assert line["ts"].endswith("Z"), line["ts"]
        ts = dt.datetime.fromisoformat(line["ts"][:-1] + "+00:00")
        assert ts.utcoffset() == dt.timedelta(0)
    assert {line["story"] for line in lines} >= {None, "1-1-alpha"}


# ------------------------------------------------------------------------------ run ids
def _shortest_unique(ids: list[str], target: str, *, prefix: bool) -> str:
    """The shortest prefix (or suffix) of `target` that no other id starts or ends with."""
    others = [i for i in ids if i != target]
    for k in range(1, len(target)):
        part = target[:k] if prefix else target[-k:]
        if not any(o.startswith(part) or o.endswith(part) for o in others):
            return part
    raise AssertionError(f"{target} has no unique {'prefix' if prefix else 'suffix'}")


@pytest.fixture
def two_runs(make_repo):
    """Two completed runs in one repository; returns (repo, [first id, second id])."""
    repo = make_repo([ALPHA, BETA], script=WRITE_EACH)
    ids = []
    for key in ("1-1-alpha", "1-2-beta"):
        result = repo.cli("run", "--story", key)
        assert result.exit_code == 0, result.output
        ids.append(re.match(r"run (\S+):", result.stdout).group(1))
    assert ids[0] != ids[1]
    return repo, ids


@pytest.mark.parametrize("command", ["status", "journal"])
def test_run_ids_resolve_by_unique_prefix_and_by_unique_suffix(two_runs, command):
    repo, ids = two_runs
    for run_id in ids:
        for ref in (run_id, _shortest_unique(ids, run_id, prefix=True),
                    _shortest_unique(ids, run_id, prefix=False)):
            assert ref == run_id or len(ref) < len(run_id)
            result = repo.cli(command, ref, "--json")
            assert result.exit_code == 0, (ref, result.output)
            if command == "status":
                assert json.loads(result.output)["run"]["id"] == run_id, ref
            else:
                first = json.loads(result.output.splitlines()[0])
                assert first["kind"] == "run.created"
                assert first["data"]["plan"] == [("1-1-alpha", "1-2-beta")[ids.index(run_id)]]


@pytest.mark.parametrize("command", ["status", "journal", "resume", "stop"])
def test_an_ambiguous_run_id_is_exit_2_listing_the_matches(two_runs, command):
    repo, ids = two_runs
    common = next(ids[0][:k] for k in range(len(ids[0]), 0, -1) if ids[1].startswith(ids[0][:k]))
    result = repo.cli(command, common)
    assert result.exit_code == 2, result.output
    assert "ambiguous" in result.stderr
    assert ids[0] in result.stderr and ids[1] in result.stderr


@pytest.mark.parametrize("command", ["status", "journal", "resume", "stop"])
def test_an_unknown_run_id_is_exit_2_naming_it(two_runs, command):
    repo, _ = two_runs
    result = repo.cli(command, "zz-no-such-run")
    assert result.exit_code == 2, result.output
    assert "zz-no-such-run" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
