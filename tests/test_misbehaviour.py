"""Misbehaviour while running: journaled with the reason, escalated per the brief, nothing lost.

Each test drives a real run (`bmad-loop run`: real huey consumers, real agent processes) on a
real repository. Agents are the scripted agent; notifiers are real commands (`false`, `sleep`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from support import StoryDef, agent_command, alive

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])


def adapter_section(repo, **extra) -> str:
    """The scripted agent as `[adapter] command`, with extra adapter keys (e.g. timeout_s)."""
    command = json.dumps(agent_command(repo.script_path))
    lines = ["[adapter]", f"command = {command}"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def attempt_rows(repo) -> list[dict]:
    with sqlite3.connect(repo.root / ".bmad-loop" / "state.db") as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute("SELECT phase, number, state, counted, exit_code, pid FROM attempts "
                            "ORDER BY id").fetchall()
    return [dict(row) for row in rows]


# ------------------------------------------------------------------------------ agents
@pytest.mark.usefixtures("unboxed")  # its pids and orphans: unboxed
def test_an_agent_that_hangs_past_its_timeout_is_killed_with_its_tree_and_uses_an_attempt(
        make_repo, tmp_path):
    grandchild = tmp_path / "grandchild.pid"
    repo = make_repo([ALPHA], script={"1-1-alpha": {"dev": [
        {"write": {"src/alpha.py": "half done\n"}, "spawn_grandchild": str(grandchild),
         "hang": True}]}})
    repo.write_policy("[limits]\nmax_dev_attempts = 1\n" + adapter_section(repo, timeout_s=1))

    started = time.monotonic()
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    assert time.monotonic() - started < 60  # the 600 s hang was cut short

    # The whole process tree is gone, grandchild included.
    pid = int(grandchild.read_text())
    assert not alive(pid), f"grandchild {pid} survived the timeout"

    # The attempt row and the journal say timed-out, and the attempt counted.
    rows = [r for r in attempt_rows(repo) if r["phase"] == "dev"]
    assert len(rows) == 1
    assert rows[0]["state"] == "timed-out" and rows[0]["counted"] == 1
    finished = [e for e in repo.events("attempt.finished") if e["data"]["phase"] == "dev"]
    assert [e["data"]["state"] for e in finished] == ["timed-out"]
    assert len([c for c in repo.calls() if c["phase"] == "dev"]) == 1

    status = repo.status()
    assert status["run"]["state"] == "paused"
    story = status["stories"][0]
    assert story["state"] == "escalated" and story["attempt"] == 1
    assert "dev attempts exhausted" in story["reason"] and "timed out" in story["reason"]
    escalated = repo.events("story.escalated")
    assert [e["story"] for e in escalated] == ["1-1-alpha"]
    # Nothing already done is lost: branch, worktree and the agent's half-done file are kept.
    assert f"refs/heads/{story['branch']}" in repo.bmad_branches()
    assert (Path(story["worktree"]) / "src/alpha.py").read_text() == "half done\n"
    assert repo.git("rev-parse", "main") == status["run"]["start_sha"]


def test_an_agent_that_crashes_on_every_attempt_escalates_after_max_dev_attempts(make_repo):
    repo = make_repo([ALPHA], script={"1-1-alpha": {"dev": [
        {"write": {"src/alpha.py": "partial\n"}, "say": "Traceback: boom", "exit": 7}]}})
    result = repo.cli("run")
    assert result.exit_code == 3, result.output

    dev = [r for r in attempt_rows(repo) if r["phase"] == "dev"]
    assert [(r["number"], r["state"], r["exit_code"], r["counted"]) for r in dev] == [
        (1, "failed", 7, 1), (2, "failed", 7, 1)]  # default max_dev_attempts = 2
    assert [c["attempt"] for c in repo.calls()] == [1, 2]
    assert all(c["phase"] == "dev" for c in repo.calls())  # never reviewed, never integrated

    status = repo.status()
    story = status["stories"][0]
    assert story["state"] == "escalated"
    assert "dev attempts exhausted (2)" in story["reason"] and "exited 7" in story["reason"]
    assert status["run"]["state"] == "paused"
    # The branch (and the worktree holding the agent's work) is kept; the target never moved.
    assert f"refs/heads/{story['branch']}" in repo.bmad_branches()
    assert (Path(story["worktree"]) / "src/alpha.py").read_text() == "partial\n"
    assert repo.git("rev-parse", "main") == status["run"]["start_sha"]
    assert "Traceback: boom" in Path(story["log"]).read_text()


# ------------------------------------------------------------------------------ the checkout
def test_local_changes_overlapping_the_story_escalate_it_before_the_target_moves(make_repo):
    repo = make_repo([ALPHA], files={"src/__init__.py": "", "src/alpha.py": "v0\n"},
                     script={"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "v1\n"}}]}})
    start = repo.git("rev-parse", "main")
    (repo.root / "src/alpha.py").write_text("my local edit\n")  # uncommitted, in the checkout

    result = repo.cli("run")
    assert result.exit_code == 3, result.output

    story = repo.status()["stories"][0]
    assert story["state"] == "escalated"
    assert "src/alpha.py" in story["reason"]
    escalation = repo.events("story.escalated")[-1]
    assert escalation["data"].get("phase") == "integrate"
    assert "src/alpha.py" in escalation["data"]["reason"]
    # The target did not move, the local change is intact, the story's work is kept.
    assert repo.git("rev-parse", "main") == start
    assert repo.git("rev-parse", "HEAD") == start
    assert (repo.root / "src/alpha.py").read_text() == "my local edit\n"
    assert repo.git("show", f"{story['head_sha']}:src/alpha.py") == "v1"
    assert f"refs/heads/{story['branch']}" in repo.bmad_branches()
    assert repo.events("target.advanced") == []


def test_unrelated_local_changes_survive_a_normal_integration_untouched(make_repo):
    repo = make_repo([ALPHA], script={"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "v1\n"}}]}})
    start = repo.git("rev-parse", "main")
    (repo.root / "README.md").write_text("# test repo\n\nmy unsaved notes\n")  # tracked, modified
    (repo.root / "scratch.txt").write_text("untracked scratch\n")  # untracked

    result = repo.cli("run")
    assert result.exit_code == 0, result.output

    assert repo.git("rev-parse", "main") != start
    assert repo.git("rev-parse", "HEAD") == repo.git("rev-parse", "main")
    assert repo.git("show", "main:src/alpha.py") == "v1"
    assert (repo.root / "src/alpha.py").read_text() == "v1\n"  # the checkout followed the advance
    assert (repo.root / "README.md").read_text() == "# test repo\n\nmy unsaved notes\n"
    assert (repo.root / "scratch.txt").read_text() == "untracked scratch\n"
    assert repo.git("diff", "--name-only") == "README.md"  # still modified, not staged
    assert repo.git("diff", "--cached", "--name-only") == ""
    assert repo.git("ls-files", "--others", "--exclude-standard") == "scratch.txt"


# ------------------------------------------------------------------------------ the ledger
def test_an_agent_editing_the_sprint_board_is_reverted_and_only_the_lane_marks_it_done(make_repo):
    repo = make_repo([ALPHA, StoryDef("1-2-beta", files=["src/beta.py"])])
    original = repo.board.read_text()
    tampered = original.replace("1-1-alpha: ready-for-dev", "1-1-alpha: review  # agent") \
                       .replace("1-2-beta: ready-for-dev", "1-2-beta: done")
    assert tampered != original
    repo.write_script({"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "v1\n",
                                                        repo.board_rel: tampered}}]}})

    result = repo.cli("run", "--story", "1-1-alpha")
    assert result.exit_code == 0, result.output

    reverted = repo.events("story.ledger_reverted")
    assert [e["story"] for e in reverted] == ["1-1-alpha"]
    assert repo.board_rel in reverted[0]["data"]["paths"]
    story = repo.status()["stories"][0]
    # The story's own commit does not touch the board; the lane's edit is the only one.
    changed = repo.git("diff", "--name-only", story["base_sha"], story["head_sha"]).splitlines()
    assert repo.board_rel not in changed and "src/alpha.py" in changed
    expected = original.replace("1-1-alpha: ready-for-dev", "1-1-alpha: done") \
                       .replace("epic-1: backlog", "epic-1: in-progress")  # its first story landed
    assert repo.git("show", f"main:{repo.board_rel}") + "\n" == expected
    assert repo.board_status("1-1-alpha") == "done"
    assert repo.board_status("1-2-beta") == "ready-for-dev"


# ------------------------------------------------------------------------------ notifiers
def test_a_failing_notifier_is_journaled_and_the_run_still_completes(make_repo):
    repo = make_repo([ALPHA], policy='[notify]\ncommand = ["false"]\n',
                     script={"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "v1\n"}}]}})
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert repo.status()["run"]["state"] == "completed"
    failed = repo.events("notify.failed")
    assert failed, "a failing notifier left no notify.failed event"
    assert failed[-1]["data"]["event"] == "run.completed"
    assert failed[-1]["data"]["channel"] == "command"
    assert "exited 1" in failed[-1]["data"]["error"]
    assert repo.git("show", "main:src/alpha.py") == "v1"


def test_a_hanging_notifier_is_cut_off_at_its_timeout_journaled_and_the_run_completes(make_repo):
    repo = make_repo([ALPHA], policy='[notify]\ncommand = ["sleep", "30"]\ntimeout_s = 1\n',
                     script={"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "v1\n"}}]}})
    started = time.monotonic()
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 25  # the notifier did not hold the run for 30 s
    assert repo.status()["run"]["state"] == "completed"
    failed = repo.events("notify.failed")
    assert failed, "a hanging notifier left no notify.failed event"
    assert failed[-1]["data"]["event"] == "run.completed"
    assert "timed out" in failed[-1]["data"]["error"]
    assert repo.git("show", "main:src/alpha.py") == "v1"
