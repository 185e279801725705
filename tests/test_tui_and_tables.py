"""The TUI's `a` starts on live work, a story's elapsed time is its time in a worker, and the
plain tables stay aligned whatever the length of a key."""

import asyncio
import os
import subprocess

import pytest

from support import (ALPHA_BETA, BAD_BETA_SCRIPT, REJECT_BAD_POLICY, StoryDef, go, inside,
                     states, wait_until)

pytest.importorskip("textual")

from textual.widgets import DataTable  # noqa: E402

from bmad_loop.engine.project import Project  # noqa: E402
from bmad_loop.operator.tui import BoardApp  # noqa: E402

ALPHA, BETA = ALPHA_BETA
SERIAL = '[scm]\nmax_parallel = 1\n[gates]\nmode = "none"\n'


def _cursor_key(app) -> str:
    table = app.query_one("#stories", DataTable)
    return str(table.get_row_at(table.cursor_row)[1])


def _tui(project, body):
    async def session():
        app = BoardApp(project, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            app.query_one("#stories", DataTable).focus()
            await body(app, pilot)
    asyncio.run(session())


def test_a_starts_on_the_first_story_in_flight_not_on_an_integrated_one(make_repo, bar):
    script = {ALPHA.key: {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]},
              BETA.key: {"dev": [{"write": {"src/beta.py": "B = 1\n"}, "say": "BETA AT WORK",
                                  "touch": [str(bar / f"in-{BETA.key}")],
                                  "wait_for": str(bar / f"go-{BETA.key}")}]}}
    repo = make_repo(ALPHA_BETA, script=script, policy=SERIAL)
    proc = repo.spawn("run")
    try:
        wait_until(lambda: inside(bar) == [BETA.key], what="beta inside dev")
        wait_until(lambda: states(repo)[ALPHA.key] == "integrated", what="alpha integrated")

        async def body(app, pilot):
            assert _cursor_key(app) == BETA.key  # row 2: the one story in flight
            await pilot.press("a")
            assert app.attached == BETA.key
        _tui(Project.open(repo.root), body)
    finally:
        go(bar, BETA.key)
        assert proc.wait(timeout=120) == 0, repo.spawned_logs()


def test_with_nothing_in_flight_a_says_so_and_attaches_nothing(make_repo):
    repo = make_repo(ALPHA_BETA, script=BAD_BETA_SCRIPT, policy=REJECT_BAD_POLICY)
    assert repo.cli("run").exit_code == 3

    async def body(app, pilot):
        await pilot.press("a")
        assert app.attached is None and app.mode == "journal"
        assert any("nothing in flight" in str(n.message) for n in app._notifications)
        await pilot.press("down", "a")  # a row the person picked: its log
        assert app.attached == BETA.key
    _tui(Project.open(repo.root), body)


def _worker_spans(journal, key) -> float:
    """The story's time in a worker, read from the journal independently of bmad-loop."""
    from datetime import datetime

    leaves = {"story.ready", "story.escalated", "story.failed", "story.interrupted",
              "story.restacked", "story.recovered", "story.skipped"}
    total, opened = 0.0, None
    for e in journal:
        if e["story"] != key:
            continue
        ts = datetime.fromisoformat(e["ts"].rstrip("Z"))
        if e["kind"] == "story.phase" and opened is None:
            opened = ts
        elif e["kind"] in leaves and opened is not None:
            total, opened = total + (ts - opened).total_seconds(), None
    return total


def test_an_interrupted_pending_story_has_no_elapsed_time_until_it_runs_again(make_repo, bar):
    script = {ALPHA.key: {"dev": [{"write": {"src/alpha.py": "A = 1\n"},
                                   "touch": [str(bar / f"in-{ALPHA.key}")],
                                   "wait_for": str(bar / f"go-{ALPHA.key}")}]}}
    repo = make_repo([ALPHA], script=script, policy=SERIAL)
    proc = repo.spawn("run")
    wait_until(lambda: inside(bar) == [ALPHA.key], what="alpha inside dev")
    assert repo.cli("stop", "--now").exit_code == 0
    assert proc.wait(timeout=120) == 4, repo.spawned_logs()
    story = repo.story(ALPHA.key)
    assert story["state"] == "pending" and story["elapsed_s"] is None

    async def body(app, pilot):
        row = app.query_one("#stories", DataTable).get_row_at(0)
        assert str(row[4]) == "—"
    _tui(Project.open(repo.root), body)


def test_a_hand_fixed_story_shows_the_time_its_workers_spent(make_repo):
    repo = make_repo(ALPHA_BETA, script=BAD_BETA_SCRIPT, policy=REJECT_BAD_POLICY)
    assert repo.cli("run").exit_code == 3
    beta = repo.story(BETA.key)
    with open(f"{beta['worktree']}/src/beta.py", "w") as fixed:
        fixed.write("B = 1\n")
    person = {**os.environ, "GIT_AUTHOR_NAME": "P", "GIT_AUTHOR_EMAIL": "p@example.com",
              "GIT_COMMITTER_NAME": "P", "GIT_COMMITTER_EMAIL": "p@example.com"}
    subprocess.run(["git", "-C", beta["worktree"], "add", "-A"], check=True)
    subprocess.run(["git", "-C", beta["worktree"], "commit", "-qm", "fix"], check=True, env=person)
    assert repo.cli("resume").exit_code == 0
    beta = repo.story(BETA.key)
    assert beta["state"] == "integrated"
    expected = _worker_spans(repo.journal(), BETA.key)
    assert expected > 0 and beta["elapsed_s"] == pytest.approx(expected, abs=0.11)


def test_plain_status_and_the_end_of_run_table_align_with_long_keys(make_repo):
    long_key = "1-1-" + "a-very-long-story-name-that-keeps-going" * 2
    stories = [StoryDef(long_key, files=["src/long.py"]), StoryDef("1-2-b", files=["src/b.py"])]
    script = {s.key: {"dev": [{"write": {s.files[0]: "X = 1\n"}}]} for s in stories}
    repo = make_repo(stories, script=script, policy=SERIAL)
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    table = [line for line in result.output.splitlines() if line.rstrip().endswith("integrated")]
    status = repo.cli("status").output.splitlines()
    listed = [line for line in status[status.index("stories:") + 1:] if "integrated" in line]
    for lines in (table, listed):
        assert len(lines) == 2, lines
        assert long_key in lines[0]  # whole, never cut
        assert len({line.index("integrated") for line in lines}) == 1, lines
