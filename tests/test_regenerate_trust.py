"""A regenerate rule's command is project code a story may edit: the lane trusts only the tree it
composed (issue 45, item 5).

The lane builds the regenerated candidate from the composed tree it recorded plus the files
under the rule's globs, never from the candidate worktree's HEAD or index; a command that moves
HEAD, or changes anything tracked outside the globs, fails the candidate. Real repositories, the
scripted agent as a real process, runs through the CLI, boxed (when bubblewrap works here) and
unboxed; barriers decide who finishes first.
"""

from __future__ import annotations

import json
import sys

import pytest

from support import MERGE_NONE, StoryDef, barrier_script, go, inside, wait_until

LOCKER = """import json, pathlib, subprocess, sys
{before}
deps = json.loads(pathlib.Path("deps.json").read_text())
pathlib.Path("app.lock").write_text(json.dumps(sorted(deps)) + "\\n")
"""
# The story's own edit of the lock script: it moves the candidate to the story's tip first
# (HEAD^2 of a merge candidate), which drops everything the target brought.
HOSTILE_BEFORE = {
    "checkout": 'subprocess.run(["git", "checkout", "-q", "--detach", "-f", "HEAD^2"], check=True)',
    "reset-soft": 'subprocess.run(["git", "reset", "-q", "--soft", "HEAD^2"], check=True)',
    "stage-other": ('pathlib.Path("src/a.py").unlink()\n'
                    'subprocess.run(["git", "rm", "-q", "--cached", "src/a.py"], check=True)'),
    "read-tree": 'subprocess.run(["git", "read-tree", "HEAD^2"], check=True)',
}
# What the escalation says: HEAD moved, or the index or files differ from the composed tree.
WHY = {"checkout": "moved the candidate's HEAD", "reset-soft": "moved the candidate's HEAD",
       "stage-other": "changed tracked files outside the rule",
       "read-tree": "changed tracked files outside the rule"}
A = StoryDef("1-1-a", files=["src/a.py"])
B = StoryDef("1-2-b", files=["src/b.py"])


def _project(make_repo, bar, before: str, sandbox: str):
    """Two stories that both add a dependency (deps.json merges, app.lock conflicts); b also
    edits the lock script so it runs `before` first."""
    def deps(*extra: str) -> str:  # lines apart, so git merges the two additions
        return json.dumps(sorted(("kilo", "lima", "mike", *extra)), indent=1) + "\n"

    files = {"src/__init__.py": "", "tools/lock.py": LOCKER.format(before=""),
             "deps.json": deps(), "app.lock": "[]\n"}
    steps = {A.key: {"write": {"src/a.py": "A = 1\n", "deps.json": deps("alpha"),
                               "app.lock": "a\n"}},
             B.key: {"write": {"src/b.py": "B = 1\n", "deps.json": deps("zulu"),
                               "app.lock": "b\n",
                               "tools/lock.py": LOCKER.format(before=before)}}}
    policy = (MERGE_NONE.format(n=2, strategy="merge")
              + f'[integration.merge]\n"app.lock" = {{ regenerate = [{json.dumps(sys.executable)}, '
              '"tools/lock.py"] }\n'
              f'[verify]\nsandbox = "{sandbox}"\n')
    return make_repo([A, B], script=barrier_script([A, B], bar, steps), files=files, policy=policy)


def _run_a_first(repo, bar) -> int:
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, A.key)
    wait_until(lambda: repo.story(A.key)["state"] in ("integrated", "escalated"), what="a landed")
    go(bar, B.key)
    return proc.wait(timeout=90)


@pytest.mark.parametrize("sandbox", ["off", "auto"])
@pytest.mark.parametrize("trick", sorted(HOSTILE_BEFORE))
def test_a_lock_script_that_moves_the_candidate_escalates_and_the_target_keeps_the_earlier_story(
        make_repo, bar, trick, sandbox, escalate_at_once):
    repo = _project(make_repo, bar, HOSTILE_BEFORE[trick], sandbox)
    code = _run_a_first(repo, bar)
    main_files = repo.git("ls-tree", "-r", "--name-only", "main").splitlines()
    assert "src/a.py" in main_files, repo.spawned_logs()  # a's work is never erased
    assert repo.board_status(A.key) == "done"
    assert repo.story(A.key)["state"] == "integrated"
    story = repo.story(B.key)
    assert code == 3 and story["state"] == "escalated", repo.spawned_logs()
    assert WHY[trick] in story["reason"]
    assert "moved" in story["reason"] or "src/a.py" in story["reason"]
    assert "src/b.py" not in main_files


def test_an_honest_lock_script_still_lands_both_with_the_lock_regenerated(make_repo, bar):
    repo = _project(make_repo, bar, "", "off")
    assert _run_a_first(repo, bar) == 0, repo.spawned_logs()
    assert json.loads(repo.git("show", "main:app.lock")) == ["alpha", "kilo", "lima", "mike",
                                                           "zulu"]
    files = repo.git("ls-tree", "-r", "--name-only", "main").splitlines()
    assert {"src/a.py", "src/b.py"} <= set(files)


@pytest.mark.parametrize("trick", ["checkout", "stage-other"])
def test_a_lock_script_the_story_broke_goes_back_to_its_agent_and_both_land_once_it_is_mended(
        make_repo, bar, trick):
    """With repairs on (the default), the failed regeneration is b's own fault: b's agent gets
    the generator, why it failed and its output, puts the lock script back, and both land
    with the lock regenerated from both stories' dependencies."""
    repo = _project(make_repo, bar, HOSTILE_BEFORE[trick], "off")
    script = json.loads(repo.script_path.read_text())
    script[B.key]["repair"] = [{"write": {"tools/lock.py": LOCKER.format(before="")}, "exit": 0}]
    repo.script_path.write_text(json.dumps(script))
    assert _run_a_first(repo, bar) == 0, repo.spawned_logs()
    files = repo.git("ls-tree", "-r", "--name-only", "main").splitlines()
    assert {"src/a.py", "src/b.py"} <= set(files)
    assert json.loads(repo.git("show", "main:app.lock")) == ["alpha", "kilo", "lima", "mike",
                                                           "zulu"]
    assert repo.git("show", "main:tools/lock.py") + "\n" == LOCKER.format(before="")
    requested = [e for e in repo.journal() if e["kind"] == "repair.requested"]
    assert [e["story"] for e in requested] == [B.key]
    assert WHY[trick] in requested[0]["data"]["reason"]
    call = [c for c in repo.calls() if c["phase"] == "repair"][0]
    assert "tools/lock.py" in call["prompt"] and WHY[trick] in call["prompt"]
