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
from support import (ALPHA_BETA, ALPHA_BETA_GAMMA, BAD_BETA_SCRIPT, REJECT_BAD_POLICY, SETTLED, StoryDef,
                     barrier_script, everything_run, go, inside, run_everything,
                     wait_until, write_each)

PHASES = {"prepare", "create", "dev", "verify", "review", "fix", "commit"}

# Every bar and label of the page, as the browser laid them out.
MEASURE = """(() => {
  const bars = [...document.querySelectorAll('svg.rows rect.bar, svg.lane rect.bar')].map(r => {
    const box = r.getBoundingClientRect();
    const kind = [...r.classList].find(c => c.startsWith('k-')).slice(2);
    return {block: r.closest('svg').dataset.block, kind, story: r.closest('[data-story]').dataset.story,
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
        drawn = [(b["kind"], b["start"]) for b in seen["bars"]
                 if b["block"] == "stories" and b["story"] == story["key"]]
        wanted = [(s["kind"], s["start"]) for s in story["segments"]]
        assert [k for k, _ in drawn] == [k for k, _ in wanted], story["key"]
        assert [t for _, t in drawn] == pytest.approx([t for _, t in wanted], abs=1e-3)
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
    assert kinds("1-3-c")[-5:] == ["review", "fix", "verify", "review", "commit"]  # a fix cycle
    assert kinds("2-2-e")[-1] == "verify" and "review" not in kinds("2-2-e")  # escalated there
    verifies = [b for b in seen["bars"] if b["block"] == "lane" and b["kind"] == "verify"]
    stacked = [b for b in verifies if b["story"] in ("1-1-a", "1-2-b", "1-3-c")]
    assert len({b["row"] for b in stacked}) == 3 and len({b["top"] for b in stacked}) == 3
    latest_start = max(b["start"] for b in stacked)
    assert all(b["end"] > latest_start for b in stacked)  # the three verified at once
    assert max(busy for _, busy in report["slots"]["steps"]) == 3  # all N slots were in use
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


# ------------------------------------------------------------------------------ synthetic sprints
class _Night:
    """The rows and the journal of a synthetic finished run, story by story (`add`)."""

    def __init__(self, n: int):
        import datetime as dt

        self.origin = dt.datetime(2026, 12, 1, 22, 0, tzinfo=dt.timezone.utc)
        self.free = [0.0] * n  # when each worker slot is free again
        self.lane_free = 0.0
        self.n = n
        self.stories, self.attempts, self.events = [], [], []

    def at(self, seconds: float):
        import datetime as dt

        return self.origin + dt.timedelta(seconds=seconds)

    def event(self, t, kind, key=None, **data):
        self.events.append({"run_id": "r1", "ts": self.at(t), "kind": kind, "story": key,
                            "data": data})

    def sessions(self, i: int, key: str, start: float) -> float:
        """prepare, dev (every fifth story twice, after a failed verify), verify, review and
        commit, each dev and review session with tokens and a cost; returns the end."""
        phases = [("prepare", 5), ("dev", 600), ("verify", 60)] + \
            ([("dev", 300), ("verify", 60)] if i % 5 == 0 else []) + [("review", 200), ("commit", 5)]
        t = start
        for number, (phase, length) in enumerate(phases, 1):
            self.event(t, "story.phase", key, phase=phase)
            if phase in ("dev", "review"):
                self.attempts.append({"run_id": "r1", "story_id": i + 1, "phase": phase,
                                      "number": number, "state": "succeeded", "counted": True,
                                      "started_at": self.at(t), "ended_at": self.at(t + length),
                                      "duration_s": length, "input_tokens": 12000 + i,
                                      "output_tokens": 3000, "cost_usd": 0.42})
            if phase == "verify":
                self.event(t + length, "verify.passed", key, duration_s=length, exit_code=0)
            t += length
        return t

    def add(self, i: int, epics: int) -> None:
        key = f"{i % epics + 1}-{i // epics + 1}-story-{i}"
        slot = min(range(self.n), key=lambda k: self.free[k])
        start = self.free[slot] + 1
        self.event(0.5, "story.waiting", key, reason=f"all {self.n} worker slot(s) busy")
        self.event(start, "story.queued", key, seq=i + 1)
        self.event(start, "story.started", key, host="h1", phase="prepare")
        ready = self.sessions(i, key, start)
        self.event(ready, "story.ready", key)
        compose = max(ready, self.lane_free)
        self.event(compose, "story.integrating", key, stack=1)
        self.event(compose + 10, "candidate.composed", key, attempt=1, stack=1)
        self.event(compose + 70, "candidate.verified", key, attempt=1, duration_s=60)
        self.event(compose + 72, "target.advanced", key, attempt=1, new=f"{i:040x}", strategy="merge")
        self.event(compose + 72, "story.integrated", key, sha=f"{i:040x}")
        self.lane_free, self.free[slot] = compose + 72, ready
        self.stories.append({"id": i + 1, "run_id": "r1", "key": key, "seq": i + 1,
                             "epic": str(i % epics + 1), "state": "integrated",
                             "footprint": {"files": [f"src/s{i}.py"], "shared": [], "resources": []},
                             "depends_on": [], "started_at": self.at(start),
                             "ended_at": self.at(compose + 72)})


def _synthetic_run(folder, stories: int, epics: int, n: int = 4):
    """A finished run of `stories` stories over `epics` epics at N = `n`, written as the engine
    would have left its rows and journal (`_Night`): each story waits for a slot, works, then
    the lane composes, verifies and advances it. Returns the database."""
    from sqlalchemy import insert, update

    from bmad_loop.db.models import Attempt, Event, Run, Story
    from support import state_database

    database = state_database(folder, max_parallel=n)
    night = _Night(n)
    for i in range(stories):
        night.add(i, epics)
    with database.transaction() as s:
        s.execute(update(Run).where(Run.id == "r1").values(
            state="completed", created_at=night.origin, started_at=night.origin,
            ended_at=night.at(night.lane_free)))
        for table, rows in ((Story, night.stories), (Attempt, night.attempts),
                            (Event, sorted(night.events, key=lambda e: e["ts"]))):
            if rows:  # an empty list would insert one row of defaults
                s.execute(insert(table), rows)
    return database


def _synthetic_page(tmp_path, stories: int, epics: int):
    from bmad_loop.db.models import Run
    from bmad_loop.operator.report.html import write_run_report

    database = _synthetic_run(tmp_path, stories, epics)
    page = tmp_path / "report.html"
    with database.transaction() as s:
        write_run_report(s, s.get(Run, "r1"), tmp_path / "state", page)
    return page


def test_a_hundred_story_night_renders_under_two_megabytes(tmp_path, chromium):  # noqa: F811
    page = _synthetic_page(tmp_path, 100, 5)
    assert page.stat().st_size < 2 * 1024 * 1024
    seen = _look(chromium, page)
    assert len(seen["labels"]) == 100 and seen["epics"] == 0  # one row per story
    assert len([b for b in seen["bars"] if b["kind"] == "dev"]) == 120  # every fifth twice
    text = page.read_text()
    cost = text.split('id="cost"', 1)[1].split("<h2", 1)[0]
    assert cost.count("<tr>") == 1 + 200 + 1  # header, a row per story and phase, the total
    assert "<td>1-1-story-0</td><td>dev</td><td class=num>24,000</td>" in cost  # dev twice
    assert "$0.84" in cost and "$92.40" in cost  # ... at $0.42 each; 220 sessions in all


def test_from_three_hundred_stories_the_timeline_groups_rows_by_epic_under_five_megabytes(
        tmp_path, chromium):  # noqa: F811
    page = _synthetic_page(tmp_path, 320, 16)
    assert page.stat().st_size < 5 * 1024 * 1024
    seen = _look(chromium, page)
    assert seen["epics"] == 16 and len(seen["labels"]) == 320
    assert len([b for b in seen["bars"] if b["kind"] == "verify" and b["block"] != "lane"]) == 320 + 64


def test_a_thousand_story_night_stays_under_five_megabytes(tmp_path):
    page = _synthetic_page(tmp_path, 1000, 40)
    assert page.stat().st_size < 5 * 1024 * 1024
    assert page.read_text().count('<details class="epic"') == 40


# ------------------------------------------------------------------------------ the commands
def test_history_html_writes_an_index_linking_one_report_per_run(make_repo, tmp_path, chromium):  # noqa: F811
    script = {**BAD_BETA_SCRIPT, "1-3-gamma": {"dev": [{"write": {"src/gamma.py": "G = 1\n"}}]}}
    repo = make_repo(ALPHA_BETA_GAMMA, script=script, policy=REJECT_BAD_POLICY)
    assert repo.cli("run", "--ci", "--story", "1-3-gamma").exit_code == 0  # the first run
    assert repo.cli("run", "--ci").exit_code == 3  # the second: beta escalates, it pauses
    repo.write_script(write_each(ALPHA_BETA))
    resumed = tmp_path / "ci" / "resumed.html"
    assert repo.cli("resume", "--report-html", str(resumed)).exit_code == 0  # ... completes
    text = resumed.read_text()  # the whole run, not only what followed the resume:
    assert '<rect class="paused"' in text and 'class="failure" data-story="1-2-beta"' in text
    out = tmp_path / "site"
    result = repo.cli("history", "--html", str(out), "--json")
    assert result.exit_code == 0
    runs = [e["id"] for e in json.loads(result.stdout)]
    chromium.open(out / "index.html")
    links = chromium.evaluate("[...document.querySelectorAll('tr[data-run] a')]"
                              ".map(a => [a.textContent, a.getAttribute('href')])")
    assert [text for text, _ in links] == runs and len(runs) == 2
    newest, first = (_look(chromium, out / href) for _, href in links)
    assert first["labels"] == ["1-3-gamma"] and not first["failures"]
    assert newest["labels"] == ["1-1-alpha", "1-2-beta"]
    assert {f["story"] for f in newest["failures"]} == {"1-2-beta"}
    chromium.open(out / links[0][1])  # the pause before the resume is shaded
    assert chromium.evaluate("document.querySelectorAll('svg.rows rect.paused').length") == 1


def test_report_text_json_and_bad_references(make_repo, tmp_path):
    repo = make_repo(ALPHA_BETA, script=write_each(ALPHA_BETA),
                     policy='[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n')
    missing = repo.cli("report", "--html", str(tmp_path / "r.html"))
    assert missing.exit_code == 2 and "no runs yet" in missing.output
    assert not (repo.root / ".bmad-loop" / "state.db").exists()  # a refused read made nothing
    assert not (tmp_path / "r.html").exists()
    assert repo.cli("run", "--ci").exit_code == 0
    text = repo.cli("report").output
    assert "makespan" in text and "lower bound" in text and "1-2-beta" in text
    unknown = repo.cli("report", "nosuchrun", "--html", str(tmp_path / "r.html"))
    assert unknown.exit_code == 2 and "no run matches 'nosuchrun'" in unknown.output
    assert not (tmp_path / "r.html").exists()
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    refused = repo.cli("history", "--html", str(taken))
    assert refused.exit_code == 2 and "notes.txt" in refused.output and taken.read_text() == "mine"
    report = _report_json(repo)
    assert report["bound"]["lower_bound_s"] <= report["makespan_s"]
    assert [c["story"] for c in report["commits"]] == ["1-1-alpha", "1-2-beta"]
    assert report["commits"][-1]["sha"] == repo.git("rev-parse", "main")


def test_what_a_run_says_is_shown_as_text_never_as_markup(tmp_path, chromium):  # noqa: F811
    """A reason or a story key holding markup (agents and verify commands print anything) is
    escaped: the page runs no script and shows the words."""
    from sqlalchemy import insert, update

    from bmad_loop.db.models import Event, Run, Story
    from bmad_loop.operator.report.html import write_run_report

    database = _synthetic_run(tmp_path, 3, 1)
    hostile = '<script>document.title="owned"</script><img src=x onerror=alert(1)>'
    with database.transaction() as s:
        run = s.get(Run, "r1")
        s.execute(update(Story).where(Story.seq == 3).values(state="escalated", reason=hostile))
        s.execute(insert(Event), [{"run_id": "r1", "ts": run.ended_at, "kind": "story.escalated",
                                   "story": "1-3-story-2", "data": {"reason": hostile}}])
    page = tmp_path / "report.html"
    with database.transaction() as s:
        write_run_report(s, s.get(Run, "r1"), tmp_path / "state", page)
    seen = _look(chromium, page)
    assert seen["scripts"] == 0 and seen["external"] == 0
    assert chromium.evaluate("document.title") == "bmad-loop run r1"
    assert hostile in chromium.evaluate("document.body.textContent")


def test_a_run_without_any_story_event_still_renders(tmp_path, chromium):  # noqa: F811
    from bmad_loop.db.models import Run
    from bmad_loop.operator.report.html import write_run_report

    database = _synthetic_run(tmp_path, 0, 1)
    page = tmp_path / "report.html"
    with database.transaction() as s:
        write_run_report(s, s.get(Run, "r1"), tmp_path / "state", page)
    seen = _look(chromium, page)
    assert seen["labels"] == [] and seen["lane"] == 1 and seen["slots"] == 1


def test_a_log_written_on_another_host_is_named_with_its_host(make_repo, tmp_path, monkeypatch,
                                                              chromium):  # noqa: F811
    repo = make_repo(ALPHA_BETA, script=BAD_BETA_SCRIPT, policy=REJECT_BAD_POLICY)
    monkeypatch.setenv("BMAD_LOOP_HOST", "nightbox")  # the run's worker ...
    assert repo.cli("run", "--ci").exit_code == 3
    monkeypatch.setenv("BMAD_LOOP_HOST", "morningbox")  # ... is not where the report is made
    page = tmp_path / "report.html"
    assert repo.cli("report", "--html", str(page)).exit_code == 0
    failures = _look(chromium, page)["failures"]
    assert failures and all(f["story"] == "1-2-beta" for f in failures)
    assert all("log on host nightbox" in f["text"] and not f["links"] for f in failures)
    assert chromium.evaluate("document.querySelectorAll('div.failure pre').length") == 0


def test_a_run_silent_for_long_though_not_settled_is_called_crashed(tmp_path, chromium):  # noqa: F811
    """The synthetic night was long ago; with no end written, its report says that nothing
    has been heard since and how to continue."""
    from sqlalchemy import update

    from bmad_loop.db.models import Run
    from bmad_loop.operator.report.html import write_run_report

    database = _synthetic_run(tmp_path, 3, 1)
    with database.transaction() as s:
        s.execute(update(Run).where(Run.id == "r1").values(state="running", ended_at=None))
    page = tmp_path / "report.html"
    with database.transaction() as s:
        write_run_report(s, s.get(Run, "r1"), tmp_path / "state", page)
    _look(chromium, page)
    said = chromium.evaluate("document.querySelector('p.silent').textContent")
    assert "crashed or its workers stopped" in said and "bmad-loop resume r1" in said
