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


def _run_ci(repo, tmp_path, umask: int, *selection: str):
    """`bmad-loop run --ci --report --junit` as a real process under `umask`."""
    import os
    import subprocess

    from support import project_argv

    report, junit = tmp_path / f"u{umask:o}" / "report.json", tmp_path / f"u{umask:o}" / "junit.xml"
    proc = subprocess.run(project_argv(repo, "run", "--ci", "--report", str(report), "--junit",
                                       str(junit), *selection),
                          capture_output=True, text=True, preexec_fn=lambda: os.umask(umask))
    return proc, report, junit


def test_a_ci_run_with_nothing_to_do_still_writes_both_files_junit_with_zero_tests(make_repo, tmp_path):
    done = StoryDef("1-1-ok", files=["src/ok.py"], status="done")
    repo = make_repo([done])
    proc, report, junit = _run_ci(repo, tmp_path, 0o022)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing to do" in proc.stdout
    data = json.loads(report.read_text())
    assert data["run"] is None and data["exit_code"] == 0 and data["stories"] == []
    assert data["summary"]["stories"] == 0 and "no actionable story" in data["reason"]
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    assert root.get("tests") == "0" and suite.get("tests") == "0" and suite.get("failures") == "0"
    assert list(root.iter("testcase")) == []


def test_report_files_follow_the_umask(make_repo, tmp_path):
    ok = StoryDef("1-1-ok", files=["src/ok.py"])
    repo = make_repo([ok], script={ok.key: {"dev": [{"write": {"src/ok.py": "OK"}}]}},
                     policy='[gates]\nmode = "none"\n')
    for umask, mode in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        proc, report, junit = _run_ci(repo, tmp_path, umask)  # a run, then nothing to do
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for path in (report, junit):
            assert path.stat().st_mode & 0o777 == mode, (oct(umask), path)
        assert not [p for p in report.parent.iterdir() if p.name.startswith(".")]  # no temp left
