"""Verdicts given under other checks do not land (issue 33, item 6).

Three stories at max_parallel 3 with stacked verification: their candidates verify at once
(the verify command in a candidate worktree touches `verifying-<candidate>` and waits for a
`pass` file), a real `stop` lets them finish as `verified`, and the run stops before any lands.
Then `resume --reload-policy` with a stricter `[verify] commands`, or `resume` after someone
moved the target: every kept verdict is dropped (`candidate.reverify_policy`) and verified again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from support import MERGE_NONE, StoryDef, query, wait_until, write_each

SPRINT = [StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"]),
          StoryDef("1-3-c", files=["src/c.py"])]

GATE = """\
import os, sys, time
bar, cwd = sys.argv[1], os.getcwd()
if "/candidates/" not in cwd:
    sys.exit(0)
open(os.path.join(bar, "verifying-" + os.path.basename(cwd)), "a").close()
while not os.path.exists(os.path.join(bar, "pass")):
    time.sleep(0.02)
"""

STRICT = """\
import os, sys
bar, cwd = sys.argv[1], os.getcwd()
if "/candidates/" in cwd:
    open(os.path.join(bar, "strict-" + os.path.basename(cwd)), "a").close()
    sys.exit(1)
"""


def _commands(bar: Path, *scripts: tuple[str, str]) -> str:
    argv = []
    for name, text in scripts:
        (bar / name).write_text(text)
        argv.append(f"{sys.executable} {bar / name} {bar}")
    return MERGE_NONE.format(n=3, strategy="merge") + f"[verify]\ncommands = {json.dumps(argv)}\n"


def _three_verified_then_stopped(make_repo, bar: Path, backend=None):
    extra = backend.policy_toml() if backend is not None else ""
    repo = make_repo(SPRINT, script=write_each(SPRINT), policy=_commands(bar, ("gate.py", GATE)) + extra)
    if backend is not None:
        backend.adopt_project(repo.root)
    proc = repo.spawn("run")
    wanted = {f"verifying-{s.key}-1" for s in SPRINT}
    wait_until(lambda: wanted <= {p.name for p in bar.glob("verifying-*")},
               what="three candidates verifying at once")
    run_id = repo.status()["run"]["id"]
    assert repo.cli("stop", run_id).exit_code == 0  # graceful: the verifications finish
    (bar / "pass").write_text("")
    assert proc.wait(timeout=60) == 4, repo.spawned_logs()
    assert sorted(c["state"] for c in repo.status()["candidates"]) == ["verified"] * 3
    assert repo.git("ls-tree", "--name-only", "main", "src/") == "src/__init__.py"
    return repo, run_id


def _reverified(repo) -> list[str]:
    return [e["story"] for e in repo.journal() if e["kind"] == "candidate.reverify_policy"]


def test_a_reload_with_stricter_verify_commands_verifies_the_kept_candidates_again(make_repo, bar,
                                                                                  backend, escalate_at_once):
    repo, run_id = _three_verified_then_stopped(make_repo, bar, backend)
    repo.write_policy(_commands(bar, ("gate.py", GATE), ("strict.py", STRICT)) + backend.policy_toml())
    result = repo.cli("resume", run_id, "--reload-policy")
    # Before the fix: exit 0, all three on main without the new command ever running.
    assert result.exit_code == 3, result.output
    assert _reverified(repo) == [s.key for s in SPRINT]
    assert (bar / "strict-1-1-a-2").exists()  # the new command ran on a's new candidate
    assert repo.git("ls-tree", "--name-only", "main", "src/") == "src/__init__.py"
    a = repo.story("1-1-a")
    assert a["state"] == "escalated" and "strict.py" in a["reason"]


def test_a_reload_that_leaves_the_checks_alone_keeps_the_verdicts(make_repo, bar):
    repo, run_id = _three_verified_then_stopped(make_repo, bar)
    policy = _commands(bar, ("gate.py", GATE)) + "[limits]\nmax_review_cycles = 4\n"
    repo.write_policy(policy)
    assert repo.cli("resume", run_id, "--reload-policy").exit_code == 0
    assert _reverified(repo) == []
    assert len(query(repo, "SELECT id FROM candidates")) == 3  # nothing composed again


def test_resume_adopting_a_moved_target_drops_the_verdicts_given_on_the_old_one(make_repo, bar):
    repo, run_id = _three_verified_then_stopped(make_repo, bar)
    (repo.root / "NOTES.md").write_text("a person's commit while the run was stopped\n")
    repo.commit_all("notes")
    assert repo.cli("resume", run_id).exit_code == 0
    assert any(e["kind"] == "target.adopted" for e in repo.journal())
    assert _reverified(repo) == [s.key for s in SPRINT]
    advanced = [c for c in repo.status()["candidates"] if c["state"] == "advanced"]
    assert [c["attempt"] for c in advanced] == [2, 2, 2]
    assert "NOTES.md" in repo.git("ls-tree", "--name-only", "main")
