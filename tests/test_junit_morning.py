"""The JUnit report the morning after: a failure's body ends with the failing log's last lines
(not only paths), and the suite's time is wall time, not the sum of parallel stories."""

import xml.etree.ElementTree as ET

from bmad_loop.operator.report.ci_summary import junit_tree, wall_time
from support import ALPHA_BETA, write

# alpha integrates; beta's verify prints a diagnosis on its last line and fails every attempt.
SCRIPT = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]},
          "1-2-beta": {"dev": [{"write": {"src/beta.py": "bad\n"}},
                               {"write": {"src/beta.py": "bad = 2\n"}}]}}
POLICY = ('[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n[verify]\ncommands = ['
          '"for i in $(seq 1 200); do echo noise line $i; done; '
          'if grep -q bad src/beta.py; then echo DIAGNOSIS: beta.py says bad; exit 1; fi"]\n')


def test_a_failed_storys_junit_body_ends_with_its_failing_logs_tail(make_repo, tmp_path, escalate_at_once):
    repo = make_repo(ALPHA_BETA, script=SCRIPT, policy=POLICY)
    junit = tmp_path / "junit.xml"
    assert repo.cli("run", "--ci", "--junit", str(junit)).exit_code == 3
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    body = cases["1-2-beta"].find("failure").text
    assert "branch: bmad-loop/" in body  # the paths are still there ...
    tail = body.split("--- the end of ", 1)[1]
    assert tail.splitlines()[0].endswith("verify-2-0.log ---")  # ... then the newest log
    assert "DIAGNOSIS: beta.py says bad" in tail
    assert "noise line 200" in tail and "noise line 100" not in tail  # only its last lines
    assert cases["1-1-alpha"].find("failure") is None


def _story(key, start, end, state="integrated"):
    return {"key": key, "seq": int(key[2]), "state": state, "started_at": start, "ended_at": end,
            "elapsed_s": None}


def test_the_suite_time_is_first_start_to_last_end_not_a_sum():
    run = {"id": "r", "state": "completed", "ended_at": "2026-01-01T12:30:00Z"}
    stories = [_story("1-1-a", "2026-01-01T12:00:00Z", "2026-01-01T12:10:00Z"),
               _story("1-2-b", "2026-01-01T12:05:00Z", "2026-01-01T12:20:00Z"),
               _story("1-3-c", None, None, "skipped")]
    status = {"run": run, "stories": stories, "candidates": []}
    assert wall_time(status) == 20 * 60  # not 25 minutes (the sum), not 30 (the run's end)
    root = junit_tree(status).getroot()
    assert root.get("time") == root.find("testsuite").get("time") == "1200.000"
    # A story still open at the end (the run paused) counts until the run ended.
    stories[1]["ended_at"] = None
    assert wall_time(status) == 30 * 60
    assert wall_time({"run": run, "stories": [stories[2]], "candidates": []}) == 0.0


def test_a_failed_story_without_any_log_keeps_a_plain_body(tmp_path):
    log = write(tmp_path / "logs" / "dev-1.log", "")
    story = {"key": "1-1-a", "seq": 1, "state": "escalated", "reason": "why", "log": str(log),
             "started_at": None, "ended_at": None}
    root = junit_tree({"run": {"id": "r", "state": "paused"}, "stories": [story],
                       "candidates": []}).getroot()
    body = root.find("testsuite/testcase/failure").text
    assert "reason: why" in body and "--- the end of" not in body  # an empty log adds nothing
