"""`bmad-loop tui`, driven headless by textual's pilot against a real run's database."""

import asyncio
import json

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable, RichLog  # noqa: E402

from bmad_loop.engine.project import Project  # noqa: E402
from bmad_loop.operator.tui import BoardApp  # noqa: E402
from support import ALPHA_BETA as STORIES, REJECT_BAD_POLICY as POLICY, wait_until  # noqa: E402

SCRIPT = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]},
          "1-2-beta": {"dev": [{"write": {"src/beta.py": "bad\n"}, "say": "BETA WROTE BAD CODE"}]}}


def _rows(app, table_id):
    table = app.query_one(table_id, DataTable)
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


async def _settle(pilot, predicate, what, timeout=60.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if predicate():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_tui_shows_a_real_run_and_its_keys_stop_resume_and_clean_up(make_repo):
    repo = make_repo(STORIES, script=SCRIPT, policy=POLICY)
    assert repo.cli("run").exit_code == 3
    run_id = repo.status()["run"]["id"]
    project = Project.open(repo.root)

    async def first_session():
        app = BoardApp(project, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            assert _rows(app, "#runs") == [[run_id, "paused", "needs a human"]]
            stories = _rows(app, "#stories")
            assert [r[1:3] for r in stories] == [["1-1-alpha", "integrated"], ["1-2-beta", "escalated"]]
            assert "verify failed after 2 dev attempts" in stories[1][6]
            lane = app.lane_plain()
            assert "#1 1-1-alpha advanced" in lane
            assert "held back: 1-2-beta (escalated)" in lane
            assert any(" run.paused " in line for line in app.tail_lines)
            assert len(app.query_one("#tail", RichLog).lines) >= len(app.tail_lines) > 5

            # a: attach the tail pane to the selected story's session log; j: back to the journal.
            app.query_one("#stories", DataTable).focus()
            await pilot.press("down", "a")
            assert app.attached == "1-2-beta"
            assert app.tail_lines[0].endswith("dev-2.log <==")
            assert any("BETA WROTE BAD CODE" in line for line in app.tail_lines)
            await pilot.press("j")
            assert app.mode == "journal" and any(" run.created " in line for line in app.tail_lines)

            # s: the same stop as `bmad-loop stop`.
            await pilot.press("s")
            await _settle(pilot, lambda: _rows(app, "#runs")[0][1] == "stopped", "stopped")
            assert repo.status()["run"]["state"] == "stopped"

            # r: a detached `bmad-loop resume`; quitting the TUI right away does not stop it.
            repo.write_script({"1-2-beta": {"dev": [{"write": {"src/beta.py": "good\n"}}]}})
            await pilot.press("r")
            assert len(app.launched) == 1
            await pilot.press("q")
        return app

    app = asyncio.run(first_session())
    resumed = app.launched[0]
    wait_until(lambda: resumed.poll() is not None, what="the resumed run to end", timeout=120)
    assert resumed.returncode == 0
    status = repo.status()
    assert status["run"]["state"] == "completed"
    assert [s["state"] for s in status["stories"]] == ["integrated", "integrated"]

    async def second_session():
        app = BoardApp(project, run_ref=run_id, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            assert _rows(app, "#runs")[0][:3] == [run_id, "completed", "success"]
            assert "now: idle" in app.lane_plain()
            # c: the same clean-up as `bmad-loop cleanup`, off the UI thread.
            await pilot.press("c")
            await _settle(pilot, lambda: app.last_cleanup is not None, "clean-up")
            code, summary = app.last_cleanup
            assert code == 0, summary
            assert "removed" in summary
            # s on a completed run is refused with the CLI's own message, shown, not raised.
            await pilot.press("s")
            await pilot.pause()
        return app

    asyncio.run(second_session())
    assert json.loads(repo.cli("status", "--json").output)["run"]["state"] == "completed"
