"""Regenerate the operator docs' real-run artifacts (not collected by default; run it explicitly):

    pytest tests/render_docs.py

One real run, four stories, two workers, scripted agents held at file barriers:

1. while 1-1-login and 1-4-search are in dev and 1-2-profile waits for the lane, the live board
   is rendered to docs/img/board.svg (with change markers against the frame before);
2. 1-4-search's verify keeps failing: it escalates and the run pauses; the TUI is rendered to
   docs/img/tui.svg;
3. a human fixes the search branch and resumes: it is verified and integrated without the agent,
   and the run completes;
4. every ```sql block of docs/schema.md is run with `bmad-loop sql` and the ```text block under
   it is replaced with the real output.
"""

import asyncio
import datetime as dt
import io
import re
from pathlib import Path

from rich.console import Console

from bmad_loop.engine.project import Project
from bmad_loop.operator.status_view import render_board
from bmad_loop.operator.tui import BoardApp
from browser import chromium  # noqa: F401  (the fixture)
from support import (StoryDef, everything_run, git, run_everything, spawn_cli, status_when,
                     wait_for_files)

DOCS = Path(__file__).resolve().parents[1] / "docs"
SHOWN_ROOT = "/home/dev/shop"
STORIES = [
    StoryDef("1-1-login", files=["src/auth.py"]),
    StoryDef("1-2-profile", files=["src/profile.py"]),
    StoryDef("1-3-session", files=["src/auth.py"]),  # overlaps login: waits for it
    StoryDef("1-4-search", files=["src/search.py"]),
]
POLICY = ('[scm]\nmax_parallel = 2\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n'
          '[verify]\ncommands = ["! grep -rq BROKEN src"]\n')


def _state(status, key):
    return next(s for s in status["stories"] if s["key"] == key)


def test_render_operator_docs(make_repo, tmp_path):
    bar = {k: (tmp_path / f"in-{k}", tmp_path / f"go-{k}") for k in ("login", "profile", "search")}

    def held(key, files):
        return [{"write": files, "touch": [str(bar[key][0])], "wait_for": str(bar[key][1]),
                 "say": f"{key}: wrote {', '.join(files)}"}]

    script = {
        "1-1-login": {"dev": held("login", {"src/auth.py": "def login(user):\n    return True\n"})},
        "1-2-profile": {"dev": held("profile", {"src/profile.py": "NAME = 'profile'\n"})},
        "1-3-session": {"dev": [{"append": {"src/auth.py": "\ndef session():\n    return 1\n"}}]},
        "1-4-search": {"dev": held("search", {"src/search.py": "BROKEN = True\n"})},
    }
    repo = make_repo(STORIES, script=script, policy=POLICY, name="shop")
    run = spawn_cli(repo, "run")
    try:
        wait_for_files(bar["login"][0], bar["profile"][0])
        before = status_when(repo, lambda s: _state(s, "1-2-profile")["phase"] == "dev"
                             and _state(s, "1-1-login")["phase"] == "dev", what="both in dev")
        bar["profile"][1].write_text("go")
        wait_for_files(bar["search"][0])
        after = status_when(repo, lambda s: _state(s, "1-2-profile")["state"] == "ready"
                            and _state(s, "1-4-search")["phase"] == "dev", what="profile ready")
        now = max(dt.datetime.strptime(s["heartbeat_at"], "%Y-%m-%dT%H:%M:%SZ")
                  for s in after["stories"] if s["heartbeat_at"]).replace(tzinfo=dt.timezone.utc)
        first = render_board(_shown(before, repo.root), None, now - dt.timedelta(seconds=3))
        frame = render_board(_shown(after, repo.root), first, now + dt.timedelta(seconds=2))
        console = Console(file=io.StringIO(), width=132, record=True)
        console.print(frame.renderable)
        (DOCS / "img").mkdir(parents=True, exist_ok=True)
        console.save_svg(str(DOCS / "img" / "board.svg"), title="bmad-loop status --watch")

        bar["login"][1].write_text("go")
        bar["search"][1].write_text("go")
        assert run.finish()[0] == 3
    finally:
        for _, go in bar.values():
            go.write_text("go")
        run.kill()

    project = Project.open(repo.root)

    async def screenshot():
        app = BoardApp(project, refresh_s=0.5)
        async with app.run_test(size=(150, 44)) as pilot:
            await pilot.pause(0.5)
            app.save_screenshot(filename="tui.svg", path=str(DOCS / "img"))

    asyncio.run(screenshot())
    _unmask(DOCS / "img" / "tui.svg", repo.root)

    # The human fix: make search pass on its own branch, then resume.
    search = _state(repo.status(), "1-4-search")
    worktree = Path(search["worktree"])
    (worktree / "src" / "search.py").write_text("def search(q):\n    return [q]\n")
    git(worktree, "add", "-A")
    git(worktree, "commit", "-q", "-m", "search: fix by a human")
    assert repo.cli("resume").exit_code == 0

    text = (DOCS / "schema.md").read_text()
    (DOCS / "schema.md").write_text(_fill_outputs(text, repo))


def _shown(status: dict, root: Path) -> dict:
    """The status with the temporary project folder shown as a stable, readable path."""
    return _map_strings(status, lambda v: v.replace(str(root), SHOWN_ROOT))


def _map_strings(value, fix):
    if isinstance(value, dict):
        return {k: _map_strings(v, fix) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, fix) for v in value]
    return fix(value) if isinstance(value, str) else value


def _unmask(path: Path, root: Path) -> None:
    path.write_text(path.read_text().replace(str(root), SHOWN_ROOT))


BLOCK = re.compile(r"```sql\n(?P<sql>.*?)```\n+```text\n(?P<out>.*?)```", re.S)


def _fill_outputs(text: str, repo) -> str:
    def replace(match):
        result = repo.cli("sql", match.group("sql").strip())
        assert result.exit_code == 0, (match.group("sql"), result.output)
        out = result.output.replace(str(repo.root), SHOWN_ROOT)
        return f"```sql\n{match.group('sql')}```\n\n```text\n{out}```"

    return BLOCK.sub(replace, text)


def test_render_the_run_report_screenshot(make_repo, tmp_path, chromium):  # noqa: F811
    """docs/img/report.png: the HTML report of a real run (a speculative stack of three, a
    retried story, an escalation), down to its cost section, as headless Chromium draws it."""
    bar = tmp_path / "bar"
    bar.mkdir()
    repo = everything_run(make_repo, bar)
    assert run_everything(repo, bar) == 3, repo.spawned_logs()
    page = tmp_path / "report.html"
    assert repo.cli("report", "--html", str(page)).exit_code == 0
    chromium.open(page)
    (DOCS / "img").mkdir(parents=True, exist_ok=True)
    chromium.screenshot(DOCS / "img" / "report.png", until="#cost")
