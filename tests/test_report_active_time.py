"""The run report measures the work: time paused or stopped is not active time, the ratio is
active time to the lower bound, the stop is a collapsed gap on the timeline, an interrupted
session is not a failed one, agent time never exceeds worker time, durations round alike in
the terminal and the page, and a long key is whole in a title and in --json."""

import json
import re
from datetime import datetime

import pytest

from bmad_loop.operator.report.geometry import LABEL_W, CHART_W
from bmad_loop.operator.style import format_duration
from support import StoryDef, go, inside, wait_until

LONG = "1-2-" + "a-story-name-far-too-long-for-the-label-column-of-the-timeline"
ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
STORIES = [ALPHA, StoryDef(LONG, files=["src/long.py"])]


def _ts(event) -> datetime:
    return datetime.fromisoformat(event["ts"].rstrip("Z"))


@pytest.fixture
def stopped_and_resumed(make_repo, bar):
    """Alpha's first dev session is cut by `stop --now` (interrupted, not counted); the run
    stays stopped a while, then resumes and completes."""
    script = {ALPHA.key: {"dev": [{"write": {"src/alpha.py": "A = 1\n"},
                                   "touch": [str(bar / f"in-{ALPHA.key}")],
                                   "wait_for": str(bar / f"go-{ALPHA.key}")}]},
              LONG: {"dev": [{"write": {"src/long.py": "L = 1\n"}}]}}
    repo = make_repo(STORIES, script=script, policy='[scm]\nmax_parallel = 1\n[gates]\nmode = "none"\n')
    proc = repo.spawn("run")
    wait_until(lambda: inside(bar) == [ALPHA.key], what="alpha inside dev")
    assert repo.cli("stop", "--now").exit_code == 0
    assert proc.wait(timeout=120) == 4, repo.spawned_logs()
    # However long the stop is, the journal says how long: the tests read it from there.
    go(bar, ALPHA.key)
    assert repo.cli("resume").exit_code == 0
    return repo


def test_active_time_leaves_out_the_stop_and_the_ratio_uses_it(stopped_and_resumed):
    repo = stopped_and_resumed
    report = json.loads(repo.cli("report", "--json").output)
    journal = repo.journal()
    stopped = next(_ts(e) for e in journal if e["kind"] == "run.stopped")
    resumed = next(_ts(e) for e in journal if e["kind"] == "run.resumed")
    assert report["paused_s"] == pytest.approx((resumed - stopped).total_seconds(), abs=0.01)
    assert report["paused_s"] > 0
    assert report["active_s"] == pytest.approx(report["makespan_s"] - report["paused_s"], abs=0.01)
    bound = report["bound"]
    assert bound["ratio"] == round(report["active_s"] / bound["lower_bound_s"], 2)
    text = repo.cli("report").output
    assert f"active {format_duration(report['active_s'])}" in text
    assert f"({bound['ratio']:.2f}× active)" in text


def test_an_interrupted_session_is_not_failed_and_agent_time_stays_inside_worker_time(stopped_and_resumed):
    report = json.loads(stopped_and_resumed.cli("report", "--json").output)
    alpha = next(s for s in report["stories"] if s["key"] == ALPHA.key)
    assert alpha["sessions"] == 3 and alpha["interrupted_sessions"] == 1  # dev cut, dev, review
    assert alpha["failed_sessions"] == 0
    for story in report["stories"]:
        assert story["agent_s"] <= story["work_s"] + 1e-6, story
    text = stopped_and_resumed.cli("report").output
    assert re.search(r"1-1-alpha .* 3 \(0 failed, 1 interrupted\)$", text, re.M), text


def test_the_stop_is_a_collapsed_gap_and_durations_round_alike(stopped_and_resumed, tmp_path):
    from bmad_loop.operator.report.geometry import GAP_W

    repo = stopped_and_resumed
    page = tmp_path / "report.html"
    assert repo.cli("report", "--html", str(page)).exit_code == 0
    html = page.read_text()
    gaps = re.findall(r'<rect class="paused" x="([\d.]+)" y="0" width="([\d.]+)"', html)
    assert gaps and {float(w) for _, w in gaps} == {GAP_W}
    ends = [float(x) + float(w) for x, w in re.findall(r'<rect class="bar [^"]*" x="([\d.]+)" y="[\d.]+" '
                                                       r'width="([\d.]+)"', html)]
    assert max(ends) <= LABEL_W + CHART_W + 0.01
    report = json.loads(repo.cli("report", "--json").output)
    alpha = next(s for s in report["stories"] if s["key"] == ALPHA.key)
    text = repo.cli("report").output
    worker = format_duration(alpha["work_s"])
    assert re.search(rf"^  1-1-alpha +integrated +{re.escape(worker)} ", text, re.M), text
    assert f"<td class=num>{worker}</td>" in html
    # The full key: in a title where the label column cuts it, and whole in --json.
    assert f'title="{LONG}"' in html and f'data-label="{LONG}"' in html
    assert LONG in {s["key"] for s in report["stories"]}


@pytest.mark.parametrize("seconds, shown", [(0.5, "1s"), (2.5, "3s"), (24.5, "25s"), (59.5, "1m00s"),
                                            (119.6, "2m00s"), (0.49, "0s")])
def test_durations_are_whole_seconds_rounded_half_up(seconds, shown):
    from bmad_loop.operator.report.svg import format_seconds

    assert format_duration(seconds) == shown == format_seconds(seconds)
