"""`run --ci --report --junit`: a batch run with one escalating story writes both summaries."""

import json
import xml.etree.ElementTree as ET

from support import StoryDef


def test_a_ci_run_with_one_escalating_story_writes_a_report_and_junit_and_exits_3(make_repo, tmp_path):
    ok, bad = StoryDef("1-1-ok", files=["src/ok.py"]), StoryDef("1-2-bad", files=["src/bad.py"])
    script = {ok.key: {"dev": [{"write": {"src/ok.py": "OK"}}]},
              bad.key: {"dev": [{"exit": 9, "say": "I give up"}]}}
    repo = make_repo([ok, bad], script=script,
                     policy='[limits]\nmax_dev_attempts = 1\n[gates]\nmode = "none"\n')
    report, junit = tmp_path / "out" / "report.json", tmp_path / "out" / "junit.xml"
    result = repo.cli("run", "--ci", "--report", str(report), "--junit", str(junit))
    assert result.exit_code == 3, result.output
    data = json.loads(report.read_text())
    assert data["exit_code"] == 3
    root = ET.parse(junit).getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) >= {ok.key, bad.key} or any(ok.key in n for n in cases)
    bad_case = next(c for n, c in cases.items() if bad.key in n)
    ok_case = next(c for n, c in cases.items() if ok.key in n)
    assert ok_case.find("failure") is None and ok_case.find("error") is None
    failure = bad_case.find("failure")
    assert failure is not None and "dev attempts exhausted" in (failure.get("message") or "") + (failure.text or "")
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert int(suite.get("failures")) == 1 and int(suite.get("tests")) == 2
