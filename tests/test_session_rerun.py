"""An agent session run again after a kill -9 starts from the tree its first run started from
(issue 45, item 11).

An appending agent appends to a tracked file, then is cut short: bmad-loop is killed -9 while
the agent waits on a barrier. The restarted worker runs the session again (uncounted); without
a record of where the session started, the re-run appended a second time and the entry landed
on main twice. Now the re-run starts from the session's start tree, the cut-short run's output
is kept at `refs/bmad-loop/<run>/sessions/<story>/<phase>-<n>.cut`, and the target's history
equals an uninterrupted run's. The mechanism knows no phase: dev and review are both cut here.
Real `worker` processes, the scripted agent, file barriers.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from support import StoryDef, poll, project_argv, query, stop_processes, wait_until

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py", "notes.md"])
BASE = "# notes\n"
POLICY = '[scm]\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n[leases]\nttl_s = 3\n'


def _script(phase: str, bar: Path) -> dict:
    appending = {"append": {"notes.md": f"- {phase}: an entry\n"},
                 "touch": [str(bar / "inside")], "wait_for": str(bar / "release")}
    steps = {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}
    steps[phase] = [{**steps.get(phase, [{}])[0], **appending}]
    return {ALPHA.key: steps}


def _worker(repo, log: Path) -> subprocess.Popen:
    with open(log, "ab") as handle:
        return subprocess.Popen(project_argv(repo, "worker", "--queue", "all", "-w", "1"),
                                stdout=handle, stderr=subprocess.STDOUT)


def _settled(repo, run_id: str, proc, log: Path) -> None:
    def done() -> bool:
        assert proc.poll() is None, log.read_text()[-4000:]
        return query(repo, "SELECT state FROM runs WHERE id = ?", run_id)[0][0] in (
            "completed", "paused", "failed")
    wait_until(done, timeout=60, interval=0.2, what="the run to settle")


@pytest.mark.parametrize("phase", ["dev", "review"])
def test_a_session_rerun_after_kill_9_starts_from_its_start_tree_and_lands_the_entry_once(
        make_repo, tmp_path, phase):
    bar = tmp_path / "bar"
    bar.mkdir()
    reference = make_repo([ALPHA], script=_script(phase, bar), policy=POLICY,
                          files={"src/__init__.py": "", "notes.md": BASE}, name="reference")
    (bar / "release").write_text("go")  # the uninterrupted run passes its barrier at once
    assert reference.cli("run").exit_code == 0
    (bar / "release").unlink()
    (bar / "inside").unlink()

    repo = make_repo([ALPHA], script=_script(phase, bar), policy=POLICY,
                     files={"src/__init__.py": "", "notes.md": BASE})
    run_id = repo.cli("enqueue").output.strip().splitlines()[-1]
    log = tmp_path / "worker.log"
    first = _worker(repo, log)
    poll((bar / "inside").exists, timeout=60)  # the agent appended, and waits
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    (bar / "release").write_text("go")  # the orphan ends; the re-run passes at once
    second = _worker(repo, log)
    try:
        _settled(repo, run_id, second, log)
    finally:
        stop_processes(second)
    assert repo.story(ALPHA.key)["state"] == "integrated", log.read_text()[-4000:]
    sessions = [c for c in repo.calls() if c["phase"] == phase]
    assert len(sessions) == 2  # the cut-short run and its re-run
    assert repo.git("show", "main:notes.md") + "\n" == BASE + f"- {phase}: an entry\n"
    assert [t["tree"] for t in repo.first_parent_trees()] == \
        [t["tree"] for t in reference.first_parent_trees()]
    restored = [e for e in repo.journal() if e["kind"] == "session.restored"]
    assert [(e["data"]["phase"], e["data"]["attempt"]) for e in restored] == [(phase, 1)]
    cut = f"refs/bmad-loop/{run_id}/sessions/{ALPHA.key}/{phase}-1.cut"
    assert restored[0]["data"]["cut_ref"] == cut
    # The evidence: what the cut-short run left, its entry included.
    assert repo.git("show", f"{cut}:notes.md") + "\n" == BASE + f"- {phase}: an entry\n"
    # The start records went when the story was ready; the evidence stays.
    assert repo.git("for-each-ref", "--format=%(refname)",
                    f"refs/bmad-loop/{run_id}/sessions").splitlines() == [cut]
