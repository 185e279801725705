"""A failed story goes back to its agent: the repair phase, end to end on real repositories.

The everyday pair that parallel work creates: story A renames a function and updates every caller
in its tree; story B, developed at the same time on the same base, adds a module that calls the
old name. Each passes alone; B fails on top of A. The lane checks the target (A's result passes),
then sends B back to its agent with the target merged in; the agent follows the rename; B lands.
And the textual kind: both edit a file outside both footprints, git cannot merge it, the agent
resolves the markers bmad-loop left.

Stories are held with file barriers (B's dev starts before A's ends, so both start on the same
base), never sleeps. Repairs use the scripted agent (tests/agents/scripted_agent.py), whose
`repair` steps are what a real agent would write.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from bmad_loop.engine.crashpoints import CRASH_ENV, ONCE_ENV, REPAIR_CRASH_POINTS
from support import StoryDef, project_argv, query, stop_processes, wait_for_exit, wait_until

A = StoryDef("1-1-rename", files=["app/core.py", "app/main.py"])
B = StoryDef("1-2-caller", files=["app/b.py", "app/b-notes.txt"])

CORE = "def old_name():\n    return 1\n"
MAIN = "from app.core import old_name\n\nVALUE = old_name()\n"
# Imports every module of app/: a caller of a name that no longer exists fails.
CHECK = ("import importlib, pkgutil, app\n"
         "for m in pkgutil.iter_modules(app.__path__):\n"
         "    importlib.import_module('app.' + m.name)\n")
FILES = {"app/__init__.py": "", "app/core.py": CORE, "app/main.py": MAIN, "check.py": CHECK,
         "conf/settings.txt": "mode = base\n"}

B_OLD = "from app.core import old_name\n\nX = old_name()\n"
B_NEW = "from app.core import new_name\n\nX = new_name()\n"


def semantic_script(bar) -> dict:
    """A renames (after B's dev has started); B calls the old name, and its repair the new."""
    return {
        A.key: {"dev": [{"write": {"app/core.py": "def new_name():\n    return 1\n",
                                   "app/main.py": "from app.core import new_name\n\nVALUE = new_name()\n"},
                         "wait_for": str(bar / "in-b")}]},
        B.key: {"dev": [{"write": {"app/b.py": B_OLD}, "touch": [str(bar / "in-b")]}],
                "repair": [{"write": {"app/b.py": B_NEW},
                            "append": {"app/b-notes.txt": "followed the rename\n"}}]},
    }


def policy(n: int = 2, *, parallel: int | None = None, strategy: str = "merge", extra: str = "") -> str:
    verify = f'commands = ["{sys.executable} check.py"]\n'
    if parallel is not None:
        verify += f"parallel = {parallel}\n"
    return (f'[scm]\nmax_parallel = {n}\nmerge_strategy = "{strategy}"\n[gates]\nmode = "none"\n'
            f"[review]\nenabled = false\n[verify]\n{verify}{extra}")


def sessions(repo, key: str) -> list[str]:
    return [c["phase"] for c in repo.calls() if c["key"] == key]


@pytest.mark.parametrize("parallel", [1, 2], ids=["one-at-a-time", "speculative"])
def test_a_caller_of_a_renamed_function_is_repaired_by_its_agent_and_lands(make_repo, bar, parallel):
    repo = make_repo([A, B], script=semantic_script(bar), files=FILES,
                     policy=policy(parallel=parallel))
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert repo.git("show", "main:app/b.py") == B_NEW.rstrip("\n")
    # The final target passes the check, as the lane's last candidate did.
    repo.git("checkout", "-q", "main")
    assert repo.git("status", "--porcelain") == ""
    import subprocess
    assert subprocess.run([sys.executable, "check.py"], cwd=repo.root).returncode == 0

    assert sessions(repo, B.key) == ["dev", "repair"]
    asked = repo.events("repair.requested")
    assert [(e["story"], e["data"]["cause"], e["data"]["landed"]) for e in asked] == [
        (B.key, "verify-failed", [A.key])]
    checked = repo.events("target.checked")
    assert [(e["story"], e["data"]["state"]) for e in checked] == [(B.key, "passed")]
    started = repo.events("repair.started")
    a_sha = repo.story(A.key)["integrated_sha"]
    assert started[-1]["data"]["new_base"] == a_sha
    assert [e["data"]["outcome"] for e in repo.events("repair.finished")] == ["ready"]
    # The repair's commit is the merge of the target into the story, with the parents bmad-loop
    # chose: the story's head and the target it merged in.
    story_b = repo.story(B.key)
    first_head = next(e["data"]["head_sha"] for e in repo.journal()
                      if e["kind"] == "story.ready" and e["story"] == B.key)
    merges = [line.split() for line in repo.git("rev-list", "--parents", "main").splitlines()]
    assert [first_head, a_sha] in [m[1:] for m in merges]
    assert story_b["base_sha"] == a_sha
    assert query(repo, "SELECT repairs, dev_attempts FROM stories WHERE key = ?", B.key) == [(1, 1)]
    # The prompt told the agent what failed and what landed.
    prompt = next(c["prompt"] for c in repo.calls() if c["phase"] == "repair")
    assert "check.py" in prompt and A.key in prompt and "app/core.py" in prompt
    repair_call = next(c for c in repo.calls() if c["phase"] == "repair")
    assert repair_call["env"]["BMAD_LOOP_PHASE"] == "repair"
    assert repair_call["env"]["BMAD_LOOP_REPAIR_CAUSE"] == "verify-failed"
    assert repair_call["env"]["BMAD_LOOP_BASE_SHA"] == a_sha
    # The report and plain status say what the run got past on its own.
    report = repo.cli("report")
    assert report.exit_code == 0, report.output
    assert f"repair 1 of {B.key} (verify-failed): ready" in report.output
    assert f"repairs: {B.key} (1)" in repo.cli("status").output
    # The board on the target marks both stories done: nothing lane-owned was reverted.
    assert repo.board_status(A.key) == "done" and repo.board_status(B.key) == "done"


CONFLICT_A = StoryDef("1-1-left", files=["src/left.py"])
CONFLICT_B = StoryDef("1-2-right", files=["src/right.py"])


def conflict_script(bar, resolved: str | None) -> dict:
    """Both edit conf/settings.txt (outside both footprints: drift is a warning) on one line."""
    repair = [{"write": {"conf/settings.txt": resolved}}] if resolved is not None else [{"exit": 0}]
    return {
        CONFLICT_A.key: {"dev": [{"write": {"src/left.py": "L = 1\n", "conf/settings.txt": "mode = left\n"},
                                  "wait_for": str(bar / "in-b")}]},
        CONFLICT_B.key: {"dev": [{"write": {"src/right.py": "R = 1\n", "conf/settings.txt": "mode = right\n"},
                                  "touch": [str(bar / "in-b")]}],
                         "repair": repair},
    }


def conflict_policy(extra: str = "") -> str:
    return '[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n[review]\nenabled = false\n' + extra


def test_a_textual_conflict_is_resolved_by_the_agent_from_the_markers_bmad_loop_left(make_repo, bar):
    repo = make_repo([CONFLICT_A, CONFLICT_B], script=conflict_script(bar, "mode = left+right\n"),
                     files=FILES, policy=conflict_policy())
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert repo.git("show", "main:conf/settings.txt") == "mode = left+right"
    assert "<<<<<<<" not in repo.git("show", "main:conf/settings.txt")
    asked = repo.events("repair.requested")
    assert [(e["data"]["cause"]) for e in asked] == ["conflict"]
    assert repo.events("repair.started")[-1]["data"]["conflicts"] == ["conf/settings.txt"]
    call = next(c for c in repo.calls() if c["phase"] == "repair")
    assert call["env"]["BMAD_LOOP_REPAIR_CAUSE"] == "conflict"
    assert call["env"]["BMAD_LOOP_REPAIR_EVIDENCE"].endswith("/.bmad-loop-session/repair-1.json")
    # The worktree is gone with the landed story; the evidence's copy stays with the run.
    run_id = repo.status()["run"]["id"]
    kept = repo.root / ".bmad-loop" / "evidence" / run_id / f"{CONFLICT_B.key}-repair-1.json"
    evidence = json.loads(kept.read_text())
    assert evidence["conflicts"] == ["conf/settings.txt"]
    assert [x["key"] for x in evidence["landed"]] == [CONFLICT_A.key]
    assert "conf/settings.txt" in call["prompt"]
    assert not repo.events("target.checked")  # a conflict needs no look at the target


def test_a_repair_that_leaves_markers_is_tried_until_max_repairs_then_escalates_and_resume_gives_a_fresh_budget(
        make_repo, bar):
    repo = make_repo([CONFLICT_A, CONFLICT_B], script=conflict_script(bar, None), files=FILES,
                     policy=conflict_policy())
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    story = repo.story(CONFLICT_B.key)
    assert story["state"] == "escalated"
    assert "repairs used up (2 of max_repairs = 2)" in story["reason"]
    assert "conflict markers" in story["reason"]
    assert sessions(repo, CONFLICT_B.key) == ["dev", "repair", "repair"]
    assert [e["data"]["outcome"] for e in repo.events("repair.finished")] == ["again", "escalated"]
    assert repo.story(CONFLICT_A.key)["state"] == "integrated"
    # Fixed agent, fresh budget: resume repairs it again, from a fresh merge.
    repo.write_script(conflict_script(bar, "mode = both\n"))
    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    assert repo.git("show", "main:conf/settings.txt") == "mode = both"
    assert sessions(repo, CONFLICT_B.key) == ["dev", "repair", "repair", "repair"]


def test_max_repairs_zero_escalates_at_once_as_before_repairs_existed(make_repo, bar):
    repo = make_repo([CONFLICT_A, CONFLICT_B], script=conflict_script(bar, "mode = x\n"),
                     files=FILES, policy=conflict_policy("[limits]\nmax_repairs = 0\n"))
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    story = repo.story(CONFLICT_B.key)
    assert story["state"] == "escalated" and "merge conflict" in story["reason"]
    assert "repair" not in sessions(repo, CONFLICT_B.key)
    assert not repo.events("repair.requested")


def test_later_stories_wait_ready_while_an_earlier_one_repairs_and_land_after_it_in_plan_order(
        make_repo, bar):
    c = StoryDef("1-3-later", files=["app/c.py"])
    script = semantic_script(bar)
    script[c.key] = {"dev": [{"write": {"app/c.py": "C = 1\n"}, "touch": [str(bar / "in-c")]}]}
    # B's repair waits until the later story is ready, so the lane has it to (not) land meanwhile.
    script[B.key]["repair"][0]["wait_for"] = str(bar / "in-c")
    repo = make_repo([A, B, c], script=script, files=FILES, policy=policy(n=3))
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    landed = [e["story"] for e in repo.journal() if e["kind"] == "story.integrated"]
    assert landed == [A.key, B.key, c.key]


# ------------------------------------------------------------------------------ kill -9 at each step
def crash_sprint(make_repo, bar, name: str):
    """The semantic pair with story A's first candidate check flaking: a sprint that reaches
    every point of `REPAIR_CRASH_POINTS` (the lane one candidate at a time, checks unboxed so
    the flake's memory can live outside the tree)."""
    bar.mkdir(exist_ok=True)
    flaky = (f'case "$PWD" in */candidates/*/1-1-rename-*) if [ ! -e {bar}/fa ]; then : > {bar}/fa; '
             f'exit 1; fi;; esac; {sys.executable} check.py')
    verify = f"commands = ['{flaky}']\nsandbox = \"off\"\nparallel = 1\n"
    body = (f'[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n[review]\nenabled = false\n'
            f"[verify]\n{verify}")
    return make_repo([A, B], script=semantic_script(bar), files=FILES, policy=body, name=name)


@pytest.mark.parametrize("point", REPAIR_CRASH_POINTS)
def test_a_kill_9_at_each_step_of_a_repair_resumes_without_losing_or_doubling_it(
        make_repo, tmp_path, point):
    reference = crash_sprint(make_repo, tmp_path / "bar-reference", "reference")
    assert reference.cli("run").exit_code == 0
    repo = crash_sprint(make_repo, tmp_path / "bar-crash", "repo")
    log = tmp_path / "worker.log"
    marker = tmp_path / "crashed.marker"
    env = dict(os.environ, **{CRASH_ENV: point, ONCE_ENV: str(marker)})
    enqueued = repo.cli("enqueue")
    assert enqueued.exit_code == 0, enqueued.output
    run_id = enqueued.output.strip().splitlines()[-1]
    argv = project_argv(repo, "worker", "--queue", "all", "-w", "2")
    with open(log, "ab") as out:
        first = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    assert wait_for_exit(first, 90, log) == -signal.SIGKILL, log.read_text()[-3000:]
    assert marker.read_text() == point
    with open(log, "ab") as out:
        second = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: query(repo, "SELECT state FROM runs WHERE id = ?", run_id)[0][0]
                   in ("completed", "paused", "failed"), timeout=120, interval=0.2,
                   what="the resumed run to settle")
    finally:
        stop_processes(second)
    status = repo.status(run_id)
    assert status["run"]["state"] == "completed", (status["run"], log.read_text()[-3000:])
    trees = [c["tree"] for c in repo.first_parent_trees("main")]
    assert trees == [c["tree"] for c in reference.first_parent_trees("main")]
    assert repo.git("show", "main:app/b-notes.txt") == "followed the rename"  # once, not twice
    counted = query(repo, "SELECT COUNT(*) FROM attempts a JOIN stories s ON s.id = a.story_id "
                          "WHERE s.key = ? AND a.phase = 'repair' AND a.counted", B.key)
    assert counted == [(1,)]
    assert repo.git("for-each-ref", "refs/bmad-loop/repair") == ""
