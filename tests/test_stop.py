"""Stopping a run: `stop` (graceful), `stop --now`, Ctrl+C once and twice; all resumable.

Real runs with the scripted agent. Barriers are files: the agent touches `inside` when its dev
session has started (writing its pid into it) and, for a graceful stop, waits for `release`
before it finishes. Every wait polls a file or the database with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from support import (
    DEADLINE_S,
    StoryDef,
    alive,
    project_argv,
    query,
    stop_processes,
    wait_for_exit,
    wait_until,
)

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
DONE = {"write": {"src/alpha.py": "NAME = 'alpha'\n"}}


# ------------------------------------------------------------------------------ helpers
def has_event(repo, kind: str, **data) -> bool:
    for (raw,) in query(repo, "SELECT data FROM events WHERE kind = ?", kind):
        values = json.loads(raw) if raw else {}
        if all(values.get(k) == v for k, v in data.items()):
            return True
    return False


def attempts(repo) -> list[dict]:
    rows = query(repo, "SELECT phase, number, state, counted FROM attempts ORDER BY id")
    return [dict(zip(("phase", "number", "state", "counted"), row)) for row in rows]


def run_id_from_calls(repo) -> str:
    return repo.calls()[0]["env"]["BMAD_LOOP_RUN_ID"]


class Helper(threading.Thread):
    """Runs `body` beside the blocking `run`; the barrier is released whatever happens."""

    def __init__(self, body, release: Path | None = None):
        super().__init__(daemon=True)
        self.body, self.release, self.error, self.result = body, release, None, None

    def run(self):
        try:
            self.result = self.body()
        except BaseException as exc:  # reported by the test after `run` returned
            self.error = exc
        finally:
            if self.release is not None:
                self.release.write_text("go")

    def check(self):
        self.join(timeout=DEADLINE_S)
        if self.error is not None:
            raise self.error
        return self.result


# ------------------------------------------------------------------------------ stop
def test_a_graceful_stop_lets_the_session_finish_exits_4_and_resume_completes_without_rerunning_it(
        make_repo, tmp_path):
    inside, release = tmp_path / "inside", tmp_path / "release"
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [
        dict(DONE, touch=[str(inside)], wait_for=str(release))]}})

    def stop_while_the_agent_works():
        wait_until(inside.exists, what="the agent to start its dev session")
        run_id = run_id_from_calls(repo)
        proc = subprocess.run(project_argv(repo, "stop", run_id), capture_output=True, text=True,
                              timeout=DEADLINE_S)
        assert proc.returncode == 0, proc.stderr
        assert f"run {run_id} stopping" in proc.stdout
        return run_id

    helper = Helper(stop_while_the_agent_works, release)
    helper.start()
    result = repo.cli("run")
    run_id = helper.check()

    assert result.exit_code == 4, result.output
    status = repo.status(run_id)
    assert status["run"]["state"] == "stopped"
    story = status["stories"][0]
    assert story["state"] == "pending"  # resumable, its worktree and phase kept
    # The finished dev session moved it on: verify (no commands here: it passed at once, with
    # its event) and the review phase, where the stop took effect before any session.
    assert story["phase"] == "review" and Path(story["worktree"]).is_dir()
    assert has_event(repo, "verify.passed")
    assert attempts(repo) == [{"phase": "dev", "number": 1, "state": "succeeded", "counted": 1}]
    assert has_event(repo, "run.stopping", mode="graceful")
    assert has_event(repo, "story.interrupted")

    result = repo.cli("resume", run_id)
    assert result.exit_code == 0, result.output
    assert repo.status(run_id)["stories"][0]["state"] == "integrated"
    assert [c["phase"] for c in repo.calls()] == ["dev", "review"]  # dev was not run again
    assert repo.git("show", "main:src/alpha.py") == "NAME = 'alpha'"


@pytest.mark.usefixtures("unboxed")  # its pids and orphans: unboxed
def test_stop_now_kills_the_hanging_agent_marks_the_attempt_interrupted_uncounted_and_resume_completes(
        make_repo, tmp_path):
    inside = tmp_path / "inside"
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [
        dict(DONE, touch=[str(inside)], hang=True)]}})

    def stop_now():
        wait_until(inside.exists, what="the agent to start its dev session")
        run_id = run_id_from_calls(repo)
        proc = subprocess.run(project_argv(repo, "stop", run_id, "--now"), capture_output=True, text=True,
                              timeout=DEADLINE_S)
        assert proc.returncode == 0, proc.stderr
        return run_id

    helper = Helper(stop_now)
    helper.start()
    started = time.monotonic()
    result = repo.cli("run")
    run_id = helper.check()

    assert result.exit_code == 4, result.output
    assert time.monotonic() - started < DEADLINE_S  # the 600 s hang was cut short
    agent_pid = int(inside.read_text())
    assert not alive(agent_pid), f"agent {agent_pid} survived stop --now"
    status = repo.status(run_id)
    assert status["run"]["state"] == "stopped"
    assert status["stories"][0]["state"] == "pending"
    assert status["stories"][0]["attempt"] == 0  # the interrupted attempt is not counted
    assert attempts(repo) == [{"phase": "dev", "number": 1, "state": "interrupted", "counted": 0}]
    assert has_event(repo, "attempt.finished", state="interrupted", counted=False)
    assert has_event(repo, "run.stopping", mode="now")

    repo.write_script({ALPHA.key: {"dev": [DONE]}})
    result = repo.cli("resume", run_id)
    assert result.exit_code == 0, result.output
    status = repo.status(run_id)
    assert status["run"]["state"] == "completed"
    assert status["stories"][0]["state"] == "integrated" and status["stories"][0]["attempt"] == 1
    # The fresh session is attempt 1 again: the interrupted one used nothing.
    assert [c["attempt"] for c in repo.calls() if c["phase"] == "dev"] == [1, 1]


def test_stop_on_a_completed_run_is_exit_2_naming_its_state(make_repo):
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [DONE]}})
    assert repo.cli("run").exit_code == 0
    run_id = repo.status()["run"]["id"]
    result = repo.cli("stop", run_id)
    assert result.exit_code == 2
    assert f"run {run_id} is completed" in result.output
    assert repo.status(run_id)["run"]["state"] == "completed"


def test_stop_on_a_paused_run_makes_it_stopped_and_it_stays_resumable(make_repo):
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [{"exit": 1}]}},
                     policy="[limits]\nmax_dev_attempts = 1\n")
    assert repo.cli("run").exit_code == 3
    run_id = repo.status()["run"]["id"]
    result = repo.cli("stop", run_id)
    assert result.exit_code == 0, result.output
    assert repo.status(run_id)["run"]["state"] == "stopped"
    repo.write_script({ALPHA.key: {"dev": [DONE]}})
    result = repo.cli("resume", run_id)
    assert result.exit_code == 0, result.output
    assert repo.status(run_id)["stories"][0]["state"] == "integrated"


# ------------------------------------------------------------------------------ Ctrl+C
def start_run(repo, tmp_path) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "run.log"
    with open(log, "wb") as handle:
        proc = subprocess.Popen(project_argv(repo, "run"), stdout=handle, stderr=subprocess.STDOUT,
                                env=dict(os.environ))
    return proc, log


def test_a_first_ctrl_c_is_a_graceful_stop_and_run_exits_4_once_the_agent_finished(make_repo, tmp_path):
    inside, release = tmp_path / "inside", tmp_path / "release"
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [
        dict(DONE, touch=[str(inside)], wait_for=str(release))]}})
    proc, log = start_run(repo, tmp_path)
    try:
        wait_until(inside.exists, what="the agent to start its dev session")
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: has_event(repo, "run.stopping", mode="graceful"), what="the graceful stop")
        agent_pid = int(inside.read_text())
        assert alive(agent_pid)  # a graceful stop does not touch the running session
        assert proc.poll() is None  # and `run` waits for it
    finally:
        release.write_text("go")
    code = wait_for_exit(proc, DEADLINE_S, log)

    assert code == 4, log.read_text()[-4000:]
    status = repo.status()
    assert status["run"]["state"] == "stopped"
    assert status["stories"][0]["state"] == "pending"
    assert attempts(repo) == [{"phase": "dev", "number": 1, "state": "succeeded", "counted": 1}]
    result = repo.cli("resume", status["run"]["id"])
    assert result.exit_code == 0, result.output


@pytest.mark.usefixtures("unboxed")  # its pids and orphans: unboxed
def test_a_second_ctrl_c_stops_now_kills_the_hanging_agent_and_exits_130(make_repo, tmp_path):
    inside = tmp_path / "inside"
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [
        dict(DONE, touch=[str(inside)], hang=True)]}})
    proc, log = start_run(repo, tmp_path)
    try:
        wait_until(inside.exists, what="the agent to start its dev session")
        agent_pid = int(inside.read_text())
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: has_event(repo, "run.stopping", mode="graceful"), what="the graceful stop")
        proc.send_signal(signal.SIGINT)
        code = wait_for_exit(proc, DEADLINE_S, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert code == 130, log.read_text()[-4000:]
    assert not alive(agent_pid), f"agent {agent_pid} survived the second Ctrl+C"
    assert has_event(repo, "run.stopping", mode="now")
    status = repo.status()
    assert status["run"]["state"] == "stopped"
    assert status["stories"][0]["state"] == "pending"
    assert attempts(repo) == [{"phase": "dev", "number": 1, "state": "interrupted", "counted": 0}]
    repo.write_script({ALPHA.key: {"dev": [DONE]}})
    result = repo.cli("resume", status["run"]["id"])
    assert result.exit_code == 0, result.output


def test_a_graceful_stop_with_a_queued_story_not_yet_claimed_still_settles_as_stopped(make_repo, tmp_path):
    """Two stories dispatched (max_parallel = 2) but one consumer thread: the second waits in
    the queue as `queued` when the stop comes. Its message is then taken by a worker that sees
    the run stopping and leaves it; the run must still settle as stopped, and resume finishes."""
    inside, release = tmp_path / "inside", tmp_path / "release"
    beta = StoryDef("1-2-beta", files=["src/beta.py"])
    repo = make_repo([ALPHA, beta], policy='[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n'
                                           '[leases]\nttl_s = 3\n',
                     script={ALPHA.key: {"dev": [dict(DONE, touch=[str(inside)], wait_for=str(release))]},
                             beta.key: {"dev": [{"write": {"src/beta.py": "beta\n"}}]}})
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip()
    log = tmp_path / "worker.log"
    with open(log, "wb") as handle:
        worker = subprocess.Popen(project_argv(repo, "worker", "--queue", "all", "-w", "1"),
                                  stdout=handle, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        wait_until(inside.exists, what="alpha's dev session")
        states = lambda: dict(query(repo, "SELECT key, state FROM stories WHERE run_id = ?", run_id))
        assert states() == {ALPHA.key: "working", beta.key: "queued"}
        result = repo.cli("stop", run_id)
        assert result.exit_code == 0, result.output
        release.write_text("go")
        try:
            wait_until(lambda: query(repo, "SELECT state FROM runs WHERE id = ?", run_id)[0][0] == "stopped",
                       what="the run to settle as stopped", timeout=10)
        except AssertionError:
            raise AssertionError(f"run stuck: {query(repo, 'SELECT state, reason FROM runs')}, "
                                 f"stories {states()}")
    finally:
        stop_processes(worker)
    assert states()[ALPHA.key] == "pending"
    result = repo.cli("resume", run_id)
    assert result.exit_code == 0, result.output
    assert set(states().values()) == {"integrated"}


def test_a_stop_that_settles_while_the_lane_composes_a_ready_story_lands_nothing(make_repo, tmp_path):
    """Without verify commands a ready story enters `integrating` only in the transaction that
    records its composition. A stop settling in between (the story is only ready, so `stop`
    stops the run at once) must win: the lane then writes nothing and moves no target; resume
    integrates the story. The lane is held after composing by a delay point (a file barrier)."""
    delays = tmp_path / "delays"
    delays.mkdir()
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [DONE]}})
    before = repo.git("rev-parse", "main")
    proc = repo.spawn("run", env={"BMAD_LOOP_DELAY_AT": "lane.in_compose",
                                  "BMAD_LOOP_DELAY_DIR": str(delays)})
    try:
        wait_until((delays / "lane.in_compose.reached").exists, what="the lane to compose alpha")
        run_id = repo.status()["run"]["id"]
        assert repo.status(run_id)["stories"][0]["state"] == "ready"
        result = repo.cli("stop", run_id)
        assert result.exit_code == 0, result.output
        assert repo.status(run_id)["run"]["state"] == "stopped"  # nothing was integrating
        (delays / "lane.in_compose.go").write_text("go")
        assert wait_for_exit(proc, DEADLINE_S) == 4, repo.spawned_logs()
    finally:
        stop_processes(proc)
    status = repo.status(run_id)
    assert status["run"]["state"] == "stopped"
    assert status["stories"][0]["state"] == "ready" and status["candidates"] == []
    assert repo.git("rev-parse", "main") == before  # the composed candidate never landed
    kinds = [e["kind"] for e in repo.journal()]
    assert "story.integrating" not in kinds and "target.advanced" not in kinds

    result = repo.cli("resume", run_id)
    assert result.exit_code == 0, result.output
    assert repo.status(run_id)["stories"][0]["state"] == "integrated"
    assert repo.git("show", "main:src/alpha.py") == "NAME = 'alpha'"
