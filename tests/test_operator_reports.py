"""CI summaries: the JSON report and the JUnit file of a real run with one escalating story."""

import json
import xml.etree.ElementTree as ET

from bmad_loop.operator.report.ci_summary import write_json_report, write_junit
from support import StoryDef, BAD_BETA_SCRIPT as SCRIPT, REJECT_BAD_POLICY as POLICY

STORIES = [
    StoryDef("1-1-alpha", files=["src/alpha.py"]),
    StoryDef("1-2-beta", files=["src/beta.py"]),
    StoryDef("1-3-gamma", files=["src/beta.py"]),  # waits for beta, which escalates
]


def test_a_ci_run_with_an_escalating_story_exits_3_and_its_reports_say_why(make_repo, tmp_path):
    repo = make_repo(STORIES, script=SCRIPT, policy=POLICY)
    report_path, junit_path = tmp_path / "out" / "report.json", tmp_path / "out" / "junit.xml"
    result = repo.cli("run", "--ci", "--report", str(report_path), "--junit", str(junit_path))
    assert result.exit_code == 3, result.output
    status = repo.status()

    report = json.loads(report_path.read_text())
    assert report["exit_code"] == 3 and report["run"]["id"] == status["run"]["id"]
    assert report["summary"] == {"stories": 3, "passed": 1, "failed": 1, "skipped": 1,
                                 "by_state": {"integrated": 1, "escalated": 1, "pending": 1}}
    assert [s["key"] for s in report["stories"]] == ["1-1-alpha", "1-2-beta", "1-3-gamma"]
    assert report["candidates"][0]["state"] == "advanced"

    assert [s["state"] for s in report["stories"]] == [s["state"] for s in status["stories"]]
    root = ET.parse(junit_path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped"), suite.get("errors")) \
        == ("3", "1", "1", "0")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == ["1-1-alpha", "1-2-beta", "1-3-gamma"]
    assert all(c.get("classname") == "bmad-loop.epic-1" for c in cases.values())
    assert cases["1-1-alpha"].find("failure") is None and cases["1-1-alpha"].find("skipped") is None
    failure = cases["1-2-beta"].find("failure")
    assert failure.get("type") == "escalated"
    assert "verify failed after 2 dev attempts" in failure.get("message")
    assert "branch: bmad-loop/" in failure.text and "worktree: " in failure.text
    skipped = cases["1-3-gamma"].find("skipped")
    assert skipped.get("message").startswith("not finished: pending") and "run paused" in skipped.get("message")
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["run.state"] == "paused" and props["run.target_branch"] == "main"
    assert float(suite.get("time")) >= 0


def test_a_clean_run_reports_every_story_as_passed(make_repo, tmp_path):
    repo = make_repo(STORIES[:2], policy='[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n')
    assert repo.cli("run", "--ci").exit_code == 0
    status = repo.status()
    root = ET.parse(write_junit(status, tmp_path / "junit.xml")).getroot()
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("2", "0", "0")
    report = json.loads(write_json_report(status, tmp_path / "r.json", exit_code=0).read_text())
    assert report["summary"]["passed"] == 2 and report["exit_code"] == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # atomic writes
