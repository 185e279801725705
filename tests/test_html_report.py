"""The run report a person looks at (`report --html`, `run --report-html`, `history --html`),
looked at as a person would: rendered by headless Chromium, measured with its own layout.

A real run with something of everything (a speculative stack of three candidates, a retried
story, an escalation) is drawn; every story row, every phase bar and the lane are on the page,
and every bar is as wide as its duration on one scale. Finished, paused and crashed runs render
on SQLite and on PostgreSQL. Synthetic sprints made from rows keep the page small: 100 stories
under 2 MB; from 300 stories on the rows are grouped by epic and the page stays under 5 MB.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from browser import chromium  # noqa: F401  (the fixture)
from support import (ALPHA_BETA, BAD_BETA_SCRIPT, REJECT_BAD_POLICY, SETTLED, StoryDef,
                     barrier_script, everything_run, go, inside, run_everything,
                     wait_until, write_each)

PHASES = {"prepare", "create", "dev", "verify", "review", "fix", "commit"}

# Every bar and label of the page, as the browser laid them out.
MEASURE = """(() => {
  const bars = [...document.querySelectorAll('svg.rows rect.bar, svg.lane rect.bar')].map(r => {
    const box = r.getBoundingClientRect();
    return {block: r.closest('svg').dataset.block, kind: r.dataset.kind, story: r.dataset.story,
            start: +r.dataset.start, end: +r.dataset.end, open: r.dataset.open === '1',
            row: r.dataset.row === undefined ? null : +r.dataset.row,
            width: box.width, top: box.top};
  });
  const labels = [...document.querySelectorAll('svg.rows text.label')].map(t => t.dataset.label);
  const failures = [...document.querySelectorAll('div.failure')].map(d => ({
    story: d.dataset.story, text: d.textContent,
    links: [...d.querySelectorAll('a')].map(a => a.getAttribute('href'))}));
  return {bars, labels, failures, epics: document.querySelectorAll('details.epic').length,
          lane: document.querySelectorAll('svg.lane').length,
          slots: document.querySelectorAll('svg.slots polygon').length,
          scripts: document.scripts.length,
          external: [...document.querySelectorAll('[src],link[href]')].length};
})()"""


def _report_json(repo) -> dict:
    result = repo.cli("report", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _look(chromium, page):  # noqa: F811
    chromium.open(page)
    return chromium.evaluate(MEASURE)


def _assert_drawn_as_reported(seen: dict, report: dict) -> None:
    """Every story has its row and one bar per phase segment; every bar on one scale."""
    assert seen["labels"] == [s["key"] for s in report["stories"]]
    for story in report["stories"]:
        drawn = [(b["kind"], round(b["start"], 3)) for b in seen["bars"]
                 if b["block"] == "stories" and b["story"] == story["key"]]
        wanted = [(s["kind"], round(s["start"], 3)) for s in story["segments"]]
        assert drawn == wanted, story["key"]
    px_per_s = 1100 / report["span_s"]  # report_layout.CHART_W over the report's span
    for bar in seen["bars"]:
        expected = (bar["end"] - bar["start"]) * px_per_s
        assert bar["width"] == pytest.approx(max(expected, 0.75), abs=0.05), bar
    assert seen["lane"] == 1 and seen["slots"] == 1
    assert seen["scripts"] == 0 and seen["external"] == 0  # nothing runs, nothing is fetched


def test_a_real_runs_report_shows_every_story_its_phases_the_stack_and_the_failures(
        make_repo, bar, tmp_path, chromium):  # noqa: F811
    repo = everything_run(make_repo, bar)
    ci_page = tmp_path / "ci" / "report.html"
    assert run_everything(repo, bar, "--report-html", str(ci_page)) == 3, repo.spawned_logs()
    page = tmp_path / "morning" / "report.html"
    assert repo.cli("report", "--html", str(page)).exit_code == 0
    assert ci_page.read_text().count('class="bar ') == page.read_text().count('class="bar ')
    report = _report_json(repo)
    seen = _look(chromium, page)
    _assert_drawn_as_reported(seen, report)

    def kinds(key):
        return [b["kind"] for b in seen["bars"] if b["block"] == "stories" and b["story"] == key
                and b["kind"] in PHASES]

    assert kinds("2-1-d").count("dev") == 2 and kinds("2-1-d").count("verify") == 2  # the retry
    assert kinds("2-2-e")[-1] == "verify" and "review" not in kinds("2-2-e")  # escalated there
    verifies = [b for b in seen["bars"] if b["block"] == "lane" and b["kind"] == "verify"]
    stacked = [b for b in verifies if b["story"] in ("1-1-a", "1-2-b", "1-3-c")]
    assert len({b["row"] for b in stacked}) == 3 and len({b["top"] for b in stacked}) == 3
    latest_start = max(b["start"] for b in stacked)
    assert all(b["end"] > latest_start for b in stacked)  # the three verified at once
    escalation = next(f for f in seen["failures"] if f["story"] == "2-2-e"
                      and "escalated" in f["text"])
    assert "DIAGNOSIS: src/e.py says bad" in escalation["text"]  # the failing log's tail
    log_link = escalation["links"][0]
    assert not os.path.isabs(log_link) and (page.parent / log_link).is_file()
    shot = chromium.screenshot(tmp_path / "report.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


# ------------------------------------------------------------------------------ run states x back-ends
def _finished(make_repo, bar, extra):
    repo = make_repo(ALPHA_BETA, script=write_each(ALPHA_BETA),
                     policy='[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n' + extra)
    assert repo.cli("run", "--ci").exit_code == 0
    return repo, "completed"


def _paused(make_repo, bar, extra):
    repo = make_repo(ALPHA_BETA, script=BAD_BETA_SCRIPT, policy=REJECT_BAD_POLICY + extra)
    assert repo.cli("run", "--ci").exit_code == 3
    return repo, "paused"


def _crashed(make_repo, bar, extra):
    """Both stories held in dev by their barriers, then the run's process is SIGKILLed."""
    repo = make_repo(ALPHA_BETA, script=barrier_script(ALPHA_BETA, bar),
                     policy='[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n' + extra)
    proc = repo.spawn("run")
    wait_until(lambda: inside(bar) == ["1-1-alpha", "1-2-beta"], what="both in dev")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    repo.kill_spawned()
    for story in ALPHA_BETA:
        go(bar, story.key)
    return repo, "running"  # nobody said the run ended


@pytest.mark.parametrize("make_run", [_finished, _paused, _crashed])
def test_finished_paused_and_crashed_runs_render_on_each_back_end(make_repo, bar, tmp_path,
                                                                 backend, make_run, chromium):  # noqa: F811
    repo, state = make_run(make_repo, bar, backend.policy_toml())
    backend.adopt_project(repo.root)
    page = tmp_path / "report.html"
    result = repo.cli("report", "--html", str(page))
    assert result.exit_code == 0, result.output
    report = _report_json(repo)
    assert report["run"]["state"] == state
    seen = _look(chromium, page)
    _assert_drawn_as_reported(seen, report)
    phases = {b["story"] for b in seen["bars"] if b["kind"] in PHASES}
    assert phases == {"1-1-alpha", "1-2-beta"}
    if make_run is _crashed:  # the sessions the kill cut short are drawn open to the end
        open_bars = [b for b in seen["bars"] if b["open"] and b["kind"] == "dev"]
        assert {b["story"] for b in open_bars} == {"1-1-alpha", "1-2-beta"}
        assert all(b["end"] == pytest.approx(report["span_s"], abs=1e-3) for b in open_bars)
    else:
        assert report["run"]["state"] in SETTLED
