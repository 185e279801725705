"""The command adapter, driven with real child processes (small Python scripts), no mocks.

Barriers are files: a script writes a file when it reached a point, the test waits for the file.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bmad_loop.agents.adapter import (
    PLACEHOLDERS,
    AgentCall,
    AgentResult,
    agent_env,
    check_binary,
    read_verdict,
    render_argv,
    review_approved,
    session_output,
)
from bmad_loop.agents.process import OWNER_VAR, SESSION_TOKEN_VAR
from bmad_loop.errors import ConfigError
from support import alive, poll, run_agent, wait_until


def _call(tmp_path: Path, **overrides) -> AgentCall:
    values = dict(
        phase="dev", story_key="1-2-login", story_file=str(tmp_path / "1-2-login.md"),
        prompt_file=str(tmp_path / "prompt.md"), worktree=str(tmp_path), run_id="20261202-101500-a1b2",
        attempt=1, base_sha="a" * 40,
    )
    values.update(overrides)
    return AgentCall(**values)


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _wait_gone(pid: int, within_s: float = 5.0) -> bool:
    """True once `pid` is gone (or only a zombie), False if it outlives `within_s`."""
    return bool(poll(lambda: not alive(pid), timeout=within_s, interval=0.02))


def _wait_file(path: Path, within_s: float = 10.0) -> str:
    """The stripped text of `path` once a script has written something into it."""
    return wait_until(lambda: path.exists() and path.read_text().strip(), timeout=within_s,
                      what=f"{path} to be written", interval=0.01)


@pytest.fixture
def worktree(tmp_path: Path) -> Path:
    """A folder standing in for the story's worktree: the agent's cwd."""
    path = tmp_path / "worktree"
    path.mkdir()
    return path


# ------------------------------------------------------------------ argv rendering


def test_placeholders_in_each_element_are_substituted(tmp_path):
    call = _call(tmp_path, model="opus", tier="big", attempt=2)
    template = ["agent", "--story={story_key}", "{prompt_file}", "{phase}-{attempt}", "{run_id}",
                "{worktree}", "{story_file}", "{model}", "{tier}"]
    assert render_argv(template, call) == [
        "agent", "--story=1-2-login", call.prompt_file, "dev-2", call.run_id, call.worktree,
        call.story_file, "opus", "big",
    ]


def test_an_element_that_is_only_an_empty_placeholder_is_dropped(tmp_path):
    assert render_argv(["agent", "--model", "{model}", "{tier}", "go"], _call(tmp_path)) == ["agent", "--model", "go"]


def test_an_empty_placeholder_inside_other_text_keeps_its_element(tmp_path):
    assert render_argv(["agent", "--x={model}", "m:{model}:"], _call(tmp_path)) == ["agent", "--x=", "m::"]


def test_an_unknown_placeholder_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"\[adapter\] command: unknown placeholder \{foo\}"):
        render_argv(["agent", "{foo}"], _call(tmp_path))


def test_braces_that_are_not_placeholders_are_left_alone(tmp_path):
    template = ["agent", '{"a": 1}', "{}", "x{ y }"]
    assert render_argv(template, _call(tmp_path)) == template


def test_every_documented_placeholder_renders(tmp_path):
    call = _call(tmp_path, model="m", tier="t")
    assert all(render_argv([f"{{{name}}}"], call) for name in PLACEHOLDERS)


# ------------------------------------------------------------------ environment and cwd


def test_the_agent_gets_the_contract_environment_and_runs_in_its_worktree(tmp_path, worktree):
    dump = tmp_path / "dump.json"
    script = _script(tmp_path, "agent.py", f"""
        import json, os
        with open({str(dump)!r}, "w") as f:
            json.dump({{"env": dict(os.environ), "cwd": os.getcwd()}}, f)
    """)
    call = _call(tmp_path, worktree=str(worktree), attempt=2, model="opus", tier="big",
                 extra_env={"LANE_PORT_BASE": "41000", "BMAD_LOOP_RUN_ID": "not-this"})
    env = agent_env(call, {"PATH": os.environ["PATH"], "HOME_MARK": "kept", "PWD": str(tmp_path)})
    result = run_agent([sys.executable, str(script)], cwd=worktree, env=env,
                       log_path=tmp_path / "logs" / "s.log", timeout_s=30)
    assert result.exit_code == 0
    seen = json.loads(dump.read_text())
    assert Path(seen["cwd"]).resolve() == worktree.resolve()
    # PWD names the worktree too (opencode works where PWD says, not where getcwd() says)
    assert seen["env"]["PWD"] == str(worktree)
    assert {k: v for k, v in seen["env"].items() if k.startswith("BMAD_LOOP_") and k not in (SESSION_TOKEN_VAR, OWNER_VAR)} == {
        "BMAD_LOOP_RUN_ID": call.run_id,
        "BMAD_LOOP_STORY_KEY": "1-2-login",
        "BMAD_LOOP_PHASE": "dev",
        "BMAD_LOOP_WORKTREE": str(worktree),
        "BMAD_LOOP_STORY_FILE": call.story_file,
        "BMAD_LOOP_PROMPT_FILE": call.prompt_file,
        "BMAD_LOOP_ATTEMPT": "2",
        "BMAD_LOOP_BASE_SHA": "a" * 40,
        "BMAD_LOOP_MODEL": "opus",
        "BMAD_LOOP_TIER": "big",
    }
    assert seen["env"]["LANE_PORT_BASE"] == "41000"
    assert seen["env"]["HOME_MARK"] == "kept"


def test_stdin_is_dev_null_so_an_agent_reading_it_does_not_hang(tmp_path, worktree):
    script = _script(tmp_path, "agent.py", "import sys\nprint('stdin:', repr(sys.stdin.read()))\n")
    log = tmp_path / "s.log"
    result = run_agent([sys.executable, str(script)], cwd=worktree, env=dict(os.environ), log_path=log, timeout_s=30)
    assert result.exit_code == 0
    assert "stdin: ''" in log.read_text()


# ------------------------------------------------------------------ exit codes and the log


@pytest.mark.parametrize("code", [0, 1, 3])
def test_the_agents_exit_code_passes_through(tmp_path, worktree, code):
    result = run_agent([sys.executable, "-c", f"raise SystemExit({code})"], cwd=worktree,
                       env=dict(os.environ), log_path=tmp_path / "s.log", timeout_s=30)
    assert (result.exit_code, result.timed_out, result.interrupted) == (code, False, False)
    assert result.ok is (code == 0)


def test_stdout_and_stderr_land_in_the_log_between_a_header_and_a_footer(tmp_path, worktree):
    log = tmp_path / "deep" / "er" / "session.log"
    log.parent.mkdir(parents=True)
    log.write_text("earlier session\n")
    script = _script(tmp_path, "agent.py", """
        import sys
        print("to stdout", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
    """)
    env = agent_env(_call(tmp_path, worktree=str(worktree)), dict(os.environ))
    result = run_agent([sys.executable, str(script)], cwd=worktree, env=env, log_path=log, timeout_s=30)
    text = log.read_text()
    assert text.startswith("earlier session\n")  # appended, never truncated
    lines = text.splitlines()
    assert lines[1].startswith("=== bmad-loop dev attempt 1 story 1-2-login started ")
    assert lines[1].endswith(f"{script} ===")
    assert "to stdout" in text and "to stderr" in text
    assert lines[-1].startswith("=== bmad-loop dev attempt 1 story 1-2-login exited 0")
    assert session_output(log, result).splitlines() == ["to stdout", "to stderr"]


def test_on_start_receives_the_agents_pid(tmp_path, worktree):
    pid_file = tmp_path / "pid"
    script = _script(tmp_path, "agent.py", f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n")
    seen: list[int] = []
    result = run_agent([sys.executable, str(script)], cwd=worktree, env=dict(os.environ),
                       log_path=tmp_path / "s.log", timeout_s=30, on_start=seen.append)
    assert seen == [result.pid] == [int(pid_file.read_text())]


# ------------------------------------------------------------------ ending the whole tree

_SPAWNER = """
    import os, subprocess, sys, time
    mode = sys.argv[1]
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    if mode == "child":
        grandchild = subprocess.Popen(sleeper)
    elif mode == "setsid":
        grandchild = subprocess.Popen(sleeper, start_new_session=True)  # calls setsid()
    elif mode == "daemon":  # double fork + setsid: the grandchild leaves the tree at once
        reader, writer = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.write(writer, str(os.getpid()).encode()); os.close(writer)
                time.sleep(120)
                os._exit(0)
            os._exit(0)
        os.close(writer)
        grandchild_pid = int(os.read(reader, 32))
    pid = grandchild.pid if mode != "daemon" else grandchild_pid
    open(sys.argv[2] + ".tmp", "w").write(f"{os.getpid()} {pid}")
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
    if sys.argv[3] == "stay":
        time.sleep(120)
"""


def test_a_timeout_kills_the_agent_and_its_grandchild(tmp_path, worktree):
    pids = tmp_path / "pids"
    script = _script(tmp_path, "agent.py", _SPAWNER)
    result = run_agent([sys.executable, str(script), "child", str(pids), "stay"], cwd=worktree,
                       env=dict(os.environ), log_path=tmp_path / "s.log", timeout_s=1.0, kill_grace_s=2.0)
    agent_pid, grandchild_pid = map(int, _wait_file(pids).split())
    assert result.timed_out and not result.interrupted and result.exit_code is None
    assert result.duration_s >= 1.0
    assert _wait_gone(agent_pid) and _wait_gone(grandchild_pid)
    assert "timed out after 1s: process tree killed" in (tmp_path / "s.log").read_text()


def test_a_grandchild_that_called_setsid_is_killed_too(tmp_path, worktree):
    pids = tmp_path / "pids"
    script = _script(tmp_path, "agent.py", _SPAWNER)
    result = run_agent([sys.executable, str(script), "setsid", str(pids), "stay"], cwd=worktree,
                       env=dict(os.environ), log_path=tmp_path / "s.log", timeout_s=1.0, kill_grace_s=2.0)
    agent_pid, grandchild_pid = map(int, _wait_file(pids).split())
    assert result.timed_out
    assert _wait_gone(agent_pid) and _wait_gone(grandchild_pid)


def test_a_daemon_that_double_forked_out_of_the_tree_is_found_by_its_token(tmp_path, worktree):
    pids = tmp_path / "pids"
    script = _script(tmp_path, "agent.py", _SPAWNER)
    result = run_agent([sys.executable, str(script), "daemon", str(pids), "stay"], cwd=worktree,
                       env=dict(os.environ), log_path=tmp_path / "s.log", timeout_s=1.0, kill_grace_s=2.0)
    agent_pid, daemon_pid = map(int, _wait_file(pids).split())
    assert result.timed_out
    assert _wait_gone(agent_pid) and _wait_gone(daemon_pid)


def test_a_process_older_than_the_session_is_not_searched_for_its_marker(tmp_path):
    """The marker walk skips processes that started before the session: a real process carrying
    the marker is listed when the session began before it, not when it began well after."""
    import subprocess

    import psutil

    from bmad_loop.proctree import session_processes

    marker = ("BMAD_LOOP_TEST_MARKER", f"m{os.getpid()}")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE, env={**os.environ, marker[0]: marker[1]},
                            start_new_session=True)
    try:
        born = psutil.Process(proc.pid).create_time()
        listed = lambda since: proc.pid in session_processes(os.getpid(), marker, tree=False,  # noqa: E731
                                                             since=since)
        assert listed(None) and listed(born) and listed(born - 5)
        assert not listed(born + 5)  # it was running long before this "session" started
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.mark.parametrize("mode", ["child", "setsid", "daemon"])
def test_what_an_agent_leaves_running_when_it_exits_is_ended(tmp_path, worktree, mode):
    """The agent has exited (a zombie, not yet reaped) when its leftovers are looked for: a
    child in its group, one that left the group, and a double-forked daemon are all ended."""
    pids = tmp_path / "pids"
    script = _script(tmp_path, "agent.py", _SPAWNER)
    result = run_agent([sys.executable, str(script), mode, str(pids), "leave"], cwd=worktree,
                       env=dict(os.environ), log_path=tmp_path / "s.log", timeout_s=30, kill_grace_s=2.0)
    _, grandchild_pid = map(int, _wait_file(pids).split())
    assert result.exit_code == 0 and not result.timed_out
    assert _wait_gone(grandchild_pid)


def test_an_agent_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, worktree):
    started = tmp_path / "started"
    script = _script(tmp_path, "agent.py", f"""
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(started)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
    """)
    result = run_agent([sys.executable, str(script)], cwd=worktree, env=dict(os.environ),
                       log_path=tmp_path / "s.log", timeout_s=1.0, kill_grace_s=0.5)
    assert result.timed_out
    assert _wait_gone(int(_wait_file(started)))


def test_setting_the_stop_event_interrupts_the_agent_and_kills_its_tree(tmp_path, worktree):
    pids = tmp_path / "pids"
    script = _script(tmp_path, "agent.py", _SPAWNER)
    stop = threading.Event()

    def stop_once_started():
        _wait_file(pids)
        stop.set()

    setter = threading.Thread(target=stop_once_started, daemon=True)
    setter.start()
    t0 = time.monotonic()
    result = run_agent([sys.executable, str(script), "child", str(pids), "stay"], cwd=worktree,
                       env=dict(os.environ), log_path=tmp_path / "s.log", timeout_s=60, stop_event=stop,
                       poll_s=0.05, kill_grace_s=2.0)
    setter.join(5)
    agent_pid, grandchild_pid = map(int, pids.read_text().split())
    assert result.interrupted and not result.timed_out and result.exit_code is None
    assert time.monotonic() - t0 < 30
    assert _wait_gone(agent_pid) and _wait_gone(grandchild_pid)


def test_an_exception_in_the_caller_kills_the_agent_before_it_propagates(tmp_path, worktree):
    seen: list[int] = []

    def record_then_fail(pid: int) -> None:
        seen.append(pid)
        raise RuntimeError("session row could not be written")

    with pytest.raises(RuntimeError, match="session row"):
        run_agent([sys.executable, "-c", "import time; time.sleep(120)"], cwd=worktree, env=dict(os.environ),
                  log_path=tmp_path / "s.log", timeout_s=60, on_start=record_then_fail)
    assert seen and _wait_gone(seen[0])


# ------------------------------------------------------------------ the binary


def test_a_missing_agent_binary_is_a_config_error_naming_it_and_its_source():
    with pytest.raises(ConfigError, match=r"^\[adapter\] command: agent binary 'no-such-agent-cli' not found on PATH$"):
        check_binary("no-such-agent-cli", "[adapter] command")


def test_a_binary_on_path_resolves_to_its_full_path():
    name = Path(sys.executable).name
    assert Path(check_binary(name, "[adapter] profile", path=str(Path(sys.executable).parent))).name == name


def test_a_binary_given_as_a_path_must_be_an_executable_file(tmp_path):
    tool = tmp_path / "agent.sh"
    tool.write_text("#!/bin/sh\n")
    with pytest.raises(ConfigError, match=r"\[adapter\.dev\] command: agent binary '\./agent\.sh' not found or not executable"):
        check_binary("./agent.sh", "[adapter.dev] command", cwd=tmp_path)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    assert check_binary("./agent.sh", "[adapter.dev] command", cwd=tmp_path) == str(tool)


def test_a_binary_that_vanished_before_the_run_is_a_config_error(tmp_path, worktree):
    with pytest.raises(ConfigError, match="cannot run agent binary 'no-such-agent-cli'"):
        run_agent(["no-such-agent-cli"], cwd=worktree, env=dict(os.environ), log_path=tmp_path / "s.log", timeout_s=5)
    assert "could not start" in (tmp_path / "s.log").read_text()


# ------------------------------------------------------------------ the review verdict


def _result(code: int | None = 0, **kw) -> AgentResult:
    return AgentResult(exit_code=code, timed_out=kw.get("timed_out", False), interrupted=False, duration_s=1.0, pid=1)


def test_the_last_verdict_line_decides():
    assert read_verdict("notes\nBMAD-LOOP-VERDICT: CHANGES-REQUESTED\n") is False
    assert read_verdict("BMAD-LOOP-VERDICT: CHANGES-REQUESTED\nlater\n**BMAD-LOOP-VERDICT: APPROVED**\n") is True
    assert read_verdict("no verdict here") is None


def test_with_exit_verdicts_exit_zero_approves():
    assert review_approved(_result(0), "", verdict="exit")
    assert not review_approved(_result(1), "BMAD-LOOP-VERDICT: APPROVED", verdict="exit")
    assert not review_approved(_result(None, timed_out=True), "", verdict="exit")


def test_with_marker_verdicts_only_an_approved_line_approves():
    assert review_approved(_result(0), "fine\nBMAD-LOOP-VERDICT: APPROVED\n", verdict="marker")
    assert not review_approved(_result(0), "BMAD-LOOP-VERDICT: CHANGES-REQUESTED", verdict="marker")
    assert not review_approved(_result(0), "looks good to me", verdict="marker")
    assert not review_approved(_result(2), "BMAD-LOOP-VERDICT: APPROVED", verdict="marker")
