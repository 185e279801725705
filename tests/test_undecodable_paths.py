"""A file name that is not UTF-8 (issue 45, item 10): git accepts any bytes but NUL and `/` in a
name, so the lane must too.

Two stories conflict on `src/\\xff\\xfe-bad.txt`. The conflict is recorded (rows, journal,
evidence file), `status`, `journal` and `report` show the name escaped, every `resume` gets as
far as the same conflict, and the paths in the journal's JSON and the evidence file round-trip
to the very bytes git holds. Real repository, scripted agent, runs through the CLI.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from support import MERGE_NONE, StoryDef, barrier_script, go, inside, wait_until

pytestmark = pytest.mark.skipif(sys.platform == "darwin",
                                reason="APFS refuses a file name that is not UTF-8")

BAD = os.fsdecode(b"src/\xff\xfe-bad.txt")  # surrogates: how Python holds the bytes
SHOWN = "src/\\xff\\xfe-bad.txt"  # how bmad-loop prints them
A = StoryDef("1-1-a", files=["src/a.py"])
B = StoryDef("1-2-b", files=["src/b.py"])


def _conflicting(make_repo, bar):
    steps = {A.key: {"write": {BAD: "from a\n"}}, B.key: {"write": {BAD: "from b\n"}}}
    script = barrier_script([A, B], bar, steps)
    return make_repo([A, B], script=script, policy=MERGE_NONE.format(n=2, strategy="merge"))


def test_two_stories_conflicting_on_a_name_that_is_not_utf8_escalate_and_resume_gets_as_far(
        make_repo, bar, escalate_at_once):
    repo = _conflicting(make_repo, bar)
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, A.key)
    wait_until(lambda: repo.story(A.key)["state"] == "integrated", what="a landed")
    go(bar, B.key)
    assert proc.wait(timeout=90) == 3, repo.spawned_logs()
    assert "surrogates" not in repo.spawned_logs()
    assert repo.git("show", f"main:{BAD}") == "from a"
    story = repo.story(B.key)
    assert story["state"] == "escalated"
    assert story["reason"] == f"merge conflict with the target in {SHOWN}"
    conflict = [e for e in repo.journal() if e["kind"] == "candidate.conflict"][-1]
    assert conflict["data"]["paths"] == [BAD]  # the JSON holds the bytes, escaped
    evidence = json.loads(Path(conflict["data"]["evidence"]).read_text())
    assert evidence["conflicts"] == [BAD]
    assert os.fsencode(evidence["conflicts"][0]) == b"src/\xff\xfe-bad.txt"
    shown = repo.cli("journal")
    assert shown.exit_code == 0 and SHOWN in shown.output, shown.output
    report = repo.root.parent / "report.html"
    assert repo.cli("report", "--html", str(report)).exit_code == 0
    assert SHOWN in report.read_text(encoding="utf-8")
    run_id = repo.status()["run"]["id"]
    for _ in range(2):  # every resume reaches the same conflict, never a crash
        result = repo.cli("resume", run_id)
        assert result.exit_code == 3, result.output
        assert repo.story(B.key)["state"] == "escalated"
        assert repo.story(B.key)["reason"] == f"merge conflict with the target in {SHOWN}"


def test_a_repair_of_a_conflict_on_a_name_that_is_not_utf8_gets_the_name_and_lands(make_repo, bar):
    """With repairs on (the default), the same conflict goes back to story B's agent: its request,
    its evidence file and its prompt name the file (escaped where text, exact in JSON), it
    resolves the markers, and both stories land."""
    repo = _conflicting(make_repo, bar)
    script = json.loads(repo.script_path.read_text())
    script[B.key]["repair"] = [{"write": {BAD: "from a\nfrom b\n"}, "exit": 0}]
    repo.script_path.write_text(json.dumps(script))
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, A.key)
    wait_until(lambda: repo.story(A.key)["state"] == "integrated", what="a landed")
    go(bar, B.key)
    assert proc.wait(timeout=120) == 0, repo.spawned_logs()
    assert "surrogates" not in repo.spawned_logs()
    assert repo.git("show", f"main:{BAD}") == "from a\nfrom b"
    assert repo.story(B.key)["state"] == "integrated"
    started = [e for e in repo.journal() if e["kind"] == "repair.started"]
    assert [e["story"] for e in started] == [B.key]
    assert started[0]["data"]["conflicts"] == [BAD]  # the journal's JSON holds the bytes
    call = [c for c in repo.calls() if c["phase"] == "repair"][0]
    assert SHOWN in call["prompt"]  # the prompt shows the name escaped
    evidence = json.loads(call["evidence"])
    assert os.fsencode(evidence["conflicts"][0]) == b"src/\xff\xfe-bad.txt"
