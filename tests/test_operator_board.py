"""The live board (`status --watch`): its pure renderer on frames recorded from a real run, and
the command itself, once on a finished run and once through a pseudo-terminal while it runs."""

import datetime as dt
import io
import json
import os
import pty
import re
import select
import subprocess
import sys

import pytest
from rich.console import Console

from bmad_loop.operator.status_view import MARK, render_board
from support import StoryDef, cli_argv, spawn_cli, status_when, wait_for_files, wait_until

STORIES = [
    StoryDef("1-1-alpha", files=["src/alpha.py"]),
    StoryDef("1-2-beta", files=["src/beta.py"]),
    StoryDef("1-3-gamma", files=["src/alpha.py"]),  # conflicts with alpha: held back
]
POLICY = '[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n'


def _text(frame, width=150) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    console.print(frame.renderable)
    return console.export_text()


def _line(text: str, *needles: str) -> str:
    matches = [line for line in text.splitlines() if all(n in line for n in needles)]
    assert matches, f"no line with {needles} in:\n{text}"
    return matches[0]


def _at(ts: str) -> dt.datetime:
    return dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


@pytest.fixture
def recorded_frames(make_repo, tmp_path):
    """Three status dicts of one real run: both workers in dev; beta finished and waiting for
    alpha; the run completed. Agents hold at file barriers the fixture releases."""
    barrier = {k: (tmp_path / f"in-{k}", tmp_path / f"go-{k}") for k in ("alpha", "beta")}
    script = {
        "1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A = 1\n"},
                               "touch": [str(barrier["alpha"][0])], "wait_for": str(barrier["alpha"][1])}]},
        "1-2-beta": {"dev": [{"write": {"src/beta.py": "B = 1\n"},
                              "touch": [str(barrier["beta"][0])], "wait_for": str(barrier["beta"][1])}]},
        "1-3-gamma": {"dev": [{"write": {"src/alpha.py": "A = 1\nG = 1\n"}}]},
    }
    repo = make_repo(STORIES, script=script, policy=POLICY)
    run = spawn_cli(repo, "run")
    try:
        wait_for_files(barrier["alpha"][0], barrier["beta"][0])
        both_in_dev = status_when(repo, lambda s: all(x["phase"] == "dev" for x in s["stories"][:2]),
                                  what="both workers in dev")
        barrier["beta"][1].write_text("go")
        beta_waiting = status_when(repo, lambda s: s["stories"][1]["state"] == "ready", what="beta ready")
        barrier["alpha"][1].write_text("go")
        assert run.finish()[0] == 0
        return repo, [both_in_dev, beta_waiting, repo.status()]
    finally:
        for _, go in barrier.values():
            go.write_text("go")
        run.kill()


def test_the_board_shows_workers_lane_queue_and_held_back_stories(recorded_frames):
    _, (in_dev, waiting, done) = recorded_frames
    now = _at(in_dev["stories"][0]["heartbeat_at"]) + dt.timedelta(seconds=5)
    frame = render_board(in_dev, None, now)
    text = _text(frame)
    alpha = in_dev["stories"][0]
    row = _line(text, "1-1-alpha", "working")
    assert "dev" in row and alpha["base_sha"][:10] in row and alpha["session"] in row
    assert "5s ago" in row and MARK not in row
    assert "lane: idle" in text and "nothing waiting" in text
    held = _line(text, "1-3-gamma", "pending")
    assert "conflicts with 1-1-alpha" in held
    assert frame.changed == frozenset() and frame.stale == ()


def test_rows_that_changed_since_the_last_frame_carry_a_marker(recorded_frames):
    _, (in_dev, waiting, done) = recorded_frames
    now = _at(in_dev["stories"][0]["heartbeat_at"]) + dt.timedelta(seconds=5)
    first = render_board(in_dev, None, now)
    second = render_board(waiting, first, now + dt.timedelta(seconds=2))
    text = _text(second)
    queued = _line(text, "1-2-beta", "ready")
    assert MARK in queued and "1-1-alpha (working, dev)" in queued
    assert "queue:1-2-beta" in second.changed
    assert MARK not in _line(text, "1-1-alpha", "working")  # alpha did not change
    assert "worker:1-1-alpha" not in second.changed
    # The same status again: nothing is marked.
    again = render_board(waiting, second, now + dt.timedelta(seconds=4))
    assert again.changed == frozenset() and MARK not in _text(again)
    last = render_board(done, again, now + dt.timedelta(seconds=6))
    text = _text(last)
    assert "run" in last.changed and MARK in _line(text, "completed")
    assert "landed: 1-1-alpha, 1-2-beta, 1-3-gamma" in text
    assert "no worker in flight" in text and "nothing held back" in text


def test_a_worker_whose_heartbeat_stopped_is_shown_as_stale(recorded_frames):
    _, (in_dev, _, _) = recorded_frames
    beat = max(_at(s["heartbeat_at"]) for s in in_dev["stories"][:2])
    fresh = render_board(in_dev, None, beat + dt.timedelta(seconds=30), stale_after_s=60)
    assert fresh.stale == ()
    stale = render_board(in_dev, fresh, beat + dt.timedelta(seconds=95), stale_after_s=60)
    assert set(stale.stale) == {"1-1-alpha", "1-2-beta"}
    text = _text(stale)
    for key in ("1-1-alpha", "1-2-beta"):
        row = _line(text, key, "working")
        assert "STALE" in row and MARK in row


def test_status_watch_on_a_settled_run_draws_one_board_and_exits(recorded_frames, escalate_at_once):
    repo, _ = recorded_frames
    result = repo.cli("status", "--watch", "--interval", "0.1")
    assert result.exit_code == 0, result.output
    assert "completed" in result.output and "landed: 1-1-alpha, 1-2-beta, 1-3-gamma" in result.output
    result = repo.cli("status", "--watch", "--json")
    assert result.exit_code == 2 and "--watch" in result.output
    # status --json is unchanged by the move: the contract's keys are all there.
    data = json.loads(repo.cli("status", "--json").output)
    assert set(data) == {"run", "stories", "candidates", "consumers", "warnings", "flakes",
                         "target_checks"}


def test_status_watch_rerenders_in_a_terminal_until_the_run_settles(make_repo, tmp_path):
    inside, release = tmp_path / "inside", tmp_path / "release"
    script = {"1-1-alpha": {"dev": [{"touch": [str(inside)], "wait_for": str(release),
                                     "write": {"src/alpha.py": "A = 1\n"}}]}}
    repo = make_repo(STORIES[:1], script=script)
    run = spawn_cli(repo, "run")
    master, slave = pty.openpty()
    watcher = None
    try:
        wait_for_files(inside)
        env = dict(os.environ, COLUMNS="140", LINES="50", TERM="xterm-256color")
        watcher = subprocess.Popen(cli_argv("status", "--project", str(repo.root), "--watch",
                                            "--interval", "0.2"),
                                   stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        screen = bytearray()

        def read_some():
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    screen.extend(os.read(master, 65536))
                except OSError:  # the child closed the terminal
                    return True
            return False

        wait_until(lambda: read_some() or b"working" in screen, what="a frame with the worker")
        release.write_text("go")
        wait_until(lambda: (read_some(), watcher.poll() is not None)[1], what="the watcher to exit")
        while select.select([master], [], [], 0.1)[0] and not read_some():
            pass
        raw = screen.decode("utf-8", "replace")
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)
        assert watcher.returncode == 0, text
        assert "working" in text and "completed" in text and "landed: 1-1-alpha" in text
        assert "\x1b[1A" in raw  # a live display redrawn in place, not lines appended
        assert run.finish()[0] == 0
    finally:
        release.write_text("go")
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
        run.kill()
        os.close(master)


def test_the_board_and_the_tuis_lane_panel_are_drawn_without_textual():
    """Only `bmad-loop tui` needs the `tui` extra: the live board, the lane panel the TUI shows
    (read by tests/test_speculation.py) and the whole command line import without textual."""
    code = ("import sys; sys.modules['textual'] = None\n"
            "from bmad_loop.operator.status_view import lane_text, render_board\n"
            "import bmad_loop.cli\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
