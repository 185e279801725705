"""What Ctrl+C says: a real SIGINT to a real `bmad-loop run`, its output on a pipe (a CI log)
and on a terminal (a pty). The first press names what the stop waits for, that a second press
stops now and that `bmad-loop resume RUN` continues; the final stopped line names `resume`.

The agent is held in its dev session by a file barrier (`wait_for`) or hangs; every wait is on
a file, the output or the process, with a deadline.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess

from support import DEADLINE_S, StoryDef, alive, project_argv, spawn_cli, wait_for_files, wait_until

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
DONE = {"write": {"src/alpha.py": "NAME = 'alpha'\n"}}


def test_a_first_ctrl_c_on_a_pipe_says_what_it_waits_for_how_to_stop_now_and_how_to_resume(
        make_repo, tmp_path):
    inside, release = tmp_path / "inside", tmp_path / "release"
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [
        dict(DONE, touch=[str(inside)], wait_for=str(release))]}})
    run = spawn_cli(repo, "run")
    try:
        wait_for_files(inside)
        run_id = repo.status()["run"]["id"]
        run.proc.send_signal(signal.SIGINT)
        shown = run.read_until("continues the run later")
        assert run.proc.poll() is None  # still waiting for the session
    finally:
        release.write_text("go")
    code, output = run.finish()

    notice = shown[shown.index("Ctrl+C: stopping run"):]
    assert f"Ctrl+C: stopping run {run_id}: no new story starts; waiting for" in notice
    assert re.search(r"1-1-alpha: dev session, attempt 1 on \S+, running for \d+m\d\ds", notice), notice
    assert "Press Ctrl+C again to stop now" in notice
    resume = f"`bmad-loop resume {run_id} --project {repo.root}` continues the run later."
    assert resume in notice
    assert shown.index("run.stopping") < shown.index("Ctrl+C: stopping run")  # after its event
    assert code == 4, output
    assert (f"run {run_id} stopped: stop requested (graceful); "
            f"`bmad-loop resume {run_id} --project {repo.root}` continues it") in output


def test_ctrl_c_three_times_on_a_terminal_stops_now_exits_130_and_names_resume(make_repo, tmp_path, unboxed):
    """On a pty, as a person sees it: the first press explains, the second kills the hanging
    session (exit 130), a third changes nothing and raises no traceback."""
    inside = tmp_path / "inside"
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [dict(DONE, touch=[str(inside)], hang=True)]}})
    master, slave = os.openpty()
    proc = subprocess.Popen(project_argv(repo, "run"), stdin=slave, stdout=slave, stderr=slave,
                            cwd=repo.root, close_fds=True)
    os.close(slave)
    screen = bytearray()

    def text() -> str:
        while select.select([master], [], [], 0.05)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            screen.extend(chunk)
        return screen.decode("utf-8", "replace")

    try:
        wait_for_files(inside)
        agent = int(inside.read_text())
        run_id = repo.status()["run"]["id"]
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: "Press Ctrl+C again" in text(), what="the first notice")
        assert alive(agent)
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: "Ctrl+C again: stopping run" in text(), what="the second notice")
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=DEADLINE_S)
        output = text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)

    assert code == 130, output
    assert not alive(agent)
    assert "1-1-alpha: dev session, attempt 1" in output
    assert f"`bmad-loop resume {run_id}` continues the run later." in output  # cwd is the project
    assert f"run {run_id} stopped: stop requested (now); `bmad-loop resume {run_id}` continues it" in output
    assert "Traceback" not in output
    assert repo.status()["run"]["state"] == "stopped"


def test_a_stop_from_another_terminal_prints_no_ctrl_c_notice_but_the_stopped_line_names_resume(
        make_repo, tmp_path):
    inside, release = tmp_path / "inside", tmp_path / "release"
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [
        dict(DONE, touch=[str(inside)], wait_for=str(release))]}})
    run = spawn_cli(repo, "run")
    try:
        wait_for_files(inside)
        run_id = repo.status()["run"]["id"]
        assert repo.cli("stop", run_id).exit_code == 0  # graceful, from another terminal
        run.read_until("run.stopping")
        release.write_text("go")
        code, output = run.finish()
    finally:
        release.write_text("go")
        run.kill()
    assert code == 4, output
    assert "Ctrl+C" not in output  # a `stop` from elsewhere is not a Ctrl+C here
    assert f"`bmad-loop resume {run_id} --project {repo.root}` continues it" in output


def test_a_ctrl_c_during_start_up_stops_the_run_as_soon_as_it_is_driven(make_repo, tmp_path):
    """The press comes after the run was enqueued and before anything drives it (held there by
    the delay point `run.enqueued`): it is counted, not lost nor raised, and the run stops at
    once with the notice and the resume command; the agent never ran."""
    delays = tmp_path / "delays"
    delays.mkdir()
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [DONE]}})
    run = spawn_cli(repo, "run", env=dict(os.environ, BMAD_LOOP_DELAY_AT="run.enqueued",
                                          BMAD_LOOP_DELAY_DIR=str(delays)))
    try:
        wait_for_files(delays / "run.enqueued.reached")
        run_id = repo.status()["run"]["id"]
        run.proc.send_signal(signal.SIGINT)
        (delays / "run.enqueued.go").write_text("go")
        code, output = run.finish()
    finally:
        (delays / "run.enqueued.go").write_text("go")
        run.kill()
    assert code == 4, output
    assert f"Ctrl+C: stopping run {run_id}: nothing is running, it stops now." in output
    assert f"run {run_id} stopped" in output and f"`bmad-loop resume {run_id} --project" in output
    assert "Traceback" not in output and "Aborted" not in output
    assert repo.calls() == []  # no session started
