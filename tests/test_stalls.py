"""`[adapter] stall_s`: a session silent *and* idle that long is killed as stalled; a session
that prints, or whose process tree burns CPU (a long test run inside a tool call), is not."""

import datetime as dt
import json
import sys
import textwrap

from bmad_loop.agents.stallwatch import StallWatch, last_output_at, tree_cpu
from support import StoryDef, agent_command, query, run_agent, wait_until, write

STALL_S = 1.0


def _agent(tmp_path, body: str) -> list[str]:
    script = write(tmp_path / "agent.py", textwrap.dedent(body))
    return [sys.executable, str(script)]


def test_a_silent_idle_session_is_killed_as_stalled(tmp_path):
    argv = _agent(tmp_path, """
        import time
        time.sleep(600)  # neither prints nor uses CPU: a hung network read
    """)
    log = tmp_path / "dev-1.log"
    result = run_agent(argv, cwd=tmp_path, env={}, log_path=log, timeout_s=60, stall_s=STALL_S,
                       kill_grace_s=0.5)
    assert result.stalled and result.exit_code is None and not result.ok
    assert not result.timed_out and not result.interrupted
    assert STALL_S <= result.duration_s < 30
    assert f"stalled: no output and no CPU for {STALL_S:g}s: process tree killed" in log.read_text()


def test_a_silent_session_whose_child_burns_cpu_is_not_a_stall(tmp_path):
    # The agent waits, silent, on a child that computes for three and a half stall windows (a
    # test run inside a tool call), however fast the machine, and still ends by itself.
    argv = _agent(tmp_path, """
        import subprocess, sys
        burn = ("import hashlib, time\\nh, end = b'x', time.monotonic() + 3.5\\n"
                "while time.monotonic() < end: h = hashlib.sha256(h).digest()")
        sys.exit(subprocess.run([sys.executable, "-c", burn]).returncode)
    """)
    log = tmp_path / "dev-1.log"
    result = run_agent(argv, cwd=tmp_path, env={}, log_path=log, timeout_s=120, stall_s=STALL_S)
    assert result.exit_code == 0 and not result.stalled, log.read_text()
    assert result.duration_s > 2 * STALL_S, "the child finished too fast to prove anything"


def test_without_stall_s_a_silent_session_runs_to_its_timeout(tmp_path):
    argv = _agent(tmp_path, "import time\ntime.sleep(600)\n")
    result = run_agent(argv, cwd=tmp_path, env={}, log_path=tmp_path / "x.log", timeout_s=2,
                       kill_grace_s=0.5)
    assert result.timed_out and not result.stalled


def test_log_growth_alone_keeps_a_session_alive(tmp_path):
    """No CPU at all (the sampler says so) but the log grows: not stalled; then it stops growing."""
    log = write(tmp_path / "s.log", "")
    clock = [0.0]
    watch = StallWatch(10, log, lambda: {}, sample_s=1, clock=lambda: clock[0])
    for second in range(1, 31):
        clock[0] = float(second)
        with open(log, "a") as handle:
            handle.write("token\n")
        assert not watch.stalled(), f"stalled at {second}s while printing"
    for second in range(31, 40):
        clock[0] = float(second)
        assert not watch.stalled()
    clock[0] = 40.0
    assert watch.stalled() and watch.quiet_s == 10


def test_cpu_in_any_process_of_the_tree_keeps_a_session_alive(tmp_path):
    log = write(tmp_path / "s.log", "")
    clock, samples = [0.0], [{(10, 1.0): 1.0, (11, 1.0): 5.0}]
    watch = StallWatch(5, log, lambda: samples[-1], sample_s=1, clock=lambda: clock[0])
    for second, sample in enumerate([{(10, 1.0): 1.0, (11, 1.0): 5.5},     # the child works
                                     {(10, 1.0): 1.0},                     # the child exits
                                     {(10, 1.0): 1.0, (12, 2.0): 0.0}],    # a new child starts
                                    start=1):
        clock[0], samples[-1] = float(second) * 4, sample
        assert not watch.stalled(), sample
    clock[0] = 16.0
    assert not watch.stalled()  # 4s since the last activity
    clock[0] = 17.0
    assert watch.stalled()


def test_tree_cpu_and_last_output_at_read_real_processes_and_files(tmp_path):
    import subprocess

    import psutil

    grandchild = tmp_path / "grandchild.pid"
    proc = subprocess.Popen([sys.executable, "-c",
                             "import subprocess, sys, time, pathlib\n"
                             "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                             f"pathlib.Path({str(grandchild)!r}).write_text(str(c.pid))\n"
                             "time.sleep(600)\n"], start_new_session=True)
    try:
        wait_until(lambda: grandchild.exists() and grandchild.read_text(), what="the grandchild")
        pids = {pid for pid, _ in tree_cpu(proc.pid)}
        assert {proc.pid, int(grandchild.read_text())} <= pids
    finally:
        for pid in (int(grandchild.read_text() or 0) if grandchild.exists() else 0, proc.pid):
            if pid:
                try:
                    psutil.Process(pid).kill()
                except psutil.Error:
                    pass
        proc.wait()
    assert last_output_at(None) is None and last_output_at(tmp_path / "missing.log") is None
    log = write(tmp_path / "s.log", "x")
    when = last_output_at(log)
    assert abs((dt.datetime.now(dt.timezone.utc) - when).total_seconds()) < 60


def test_a_stalled_dev_session_fails_its_attempt_with_reason_stalled(make_repo):
    story = StoryDef("1-1-alpha", files=["src/alpha.py"])
    repo = make_repo([story], script={"1-1-alpha": {"dev": [{"hang": True}]}})
    repo.write_policy('[limits]\nmax_dev_attempts = 1\n[adapter]\n'
                      f'command = {json.dumps(agent_command(repo.script_path))}\n'
                      'timeout_s = 120\nstall_s = 1\n')
    result = repo.cli("run")
    assert result.exit_code == 3, result.output  # escalated: needs a human
    rows = query(repo, "SELECT phase, number, state, reason, counted FROM attempts")
    assert rows == [("dev", 1, "failed", "stalled", 1)]
    alpha = repo.story("1-1-alpha")
    assert alpha["state"] == "escalated" and "stalled" in alpha["reason"]
    assert alpha["last_output_at"] is not None
    log_text = open(alpha["log"]).read()
    assert "stalled: no output and no CPU for 1s" in log_text


def test_the_live_board_shows_how_long_ago_a_working_story_last_printed():
    import io

    from rich.console import Console

    from bmad_loop.operator.status_view import render_board

    def story(key, seq, state, last):
        return {"key": key, "seq": seq, "state": state, "phase": "dev" if state == "working" else None,
                "heartbeat_at": "2026-01-01T12:00:00Z", "last_output_at": last, "elapsed_s": 60}

    status = {"run": {"id": "r", "state": "running", "target_branch": "main"}, "candidates": [],
              "stories": [story("1-1-alpha", 1, "working", "2026-01-01T11:58:55Z"),
                          story("1-2-beta", 2, "working", None)]}
    now = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
    console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    console.print(render_board(status, None, now).renderable)
    text = console.export_text()
    assert "last output" in text
    alpha = next(line for line in text.splitlines() if "1-1-alpha" in line)
    assert alpha.rstrip().endswith("1m05s ago")
    beta = next(line for line in text.splitlines() if "1-2-beta" in line)
    assert beta.rstrip().endswith("-")  # no log yet
