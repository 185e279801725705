"""`bmad-loop tui` stays usable on an 80×24 terminal: the stories panel shows its rows (it used
to collapse to nothing below about 160×45), and the runs, lane and journal panels are still there."""

import asyncio

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable  # noqa: E402

from bmad_loop.engine.project import Project  # noqa: E402
from bmad_loop.operator.tui import BoardApp  # noqa: E402
from support import ALPHA_BETA_GAMMA as STORIES, write_each  # noqa: E402

POLICY = '[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n'


def _visible_rows(app) -> int:
    """Story rows the stories panel has room to show (its table header takes one line)."""
    table = app.query_one("#stories", DataTable)
    return min(table.row_count, max(table.content_region.height - 1, 0))


def test_the_stories_panel_shows_every_row_at_80x24_and_after_a_resize(make_repo):
    repo = make_repo(STORIES, script=write_each(STORIES), policy=POLICY)
    assert repo.cli("run").exit_code == 0
    run_id = repo.status()["run"]["id"]
    project = Project.open(repo.root)

    async def session():
        app = BoardApp(project, refresh_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            table = app.query_one("#stories", DataTable)
            assert table.row_count == 3
            assert _visible_rows(app) == 3, table.content_region
            screen = app.export_screenshot()
            for story in STORIES:
                assert story.key in screen
            assert run_id in screen  # the runs panel still names the run
            for panel in ("#runs", "#lane", "#tail"):
                assert app.query_one(panel).region.height >= 3, panel
            assert app.query_one("#tail").region.bottom <= 23  # above the footer
            # The cursor keys still reach the stories and `a` attaches the bottom pane.
            table.focus()
            await pilot.press("down", "a")
            assert app.attached == "1-2-beta"

            # A big terminal gets the roomy layout back; shrinking again keeps the rows.
            await pilot.resize_terminal(160, 48)
            await pilot.pause()
            assert app.query_one("#runs").region.width == 54
            assert app.query_one("#tail").region.height == 12
            await pilot.resize_terminal(80, 24)
            await pilot.pause()
            assert _visible_rows(app) == 3
            assert app.query_one("#runs").region.width < 30

    asyncio.run(session())
