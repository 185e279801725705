"""Field-hard faults, for real: poison agents, huge output, leftover verify trees, slow steps.

Every test drives real `bmad-loop` processes on a real repository, with real signals and file
barriers; nothing is mocked and nothing waits on a sleep and hope.

- An agent that SIGKILLs its bmad-loop parent every time: recovered `[limits] max_recoveries`
  times, then escalated with a reason that says so; the run ends (exit 3).
- An agent that SIGSTOPs its bmad-loop parent every time: the process's thaw helper continues
  it after `ttl_s`, and the run ends (exit 3) instead of hanging.
- An agent (and a verify command) printing hundreds of MB: the `bmad-loop run` process's peak
  RSS stays bounded (`bench/bounded_memory.py` does the same with 1 GB).
- A verify command whose grandchild escaped into its own session, its worker SIGKILLed during
  verify: recovery kills the grandchild before the story is retried, and the run completes.
- Slow prepare and commit steps under `[leases] ttl_s = 3`: the live worker's lease is renewed
  through them, it is never recovered as an orphan, and the run completes.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from bmad_loop.agents.process import OWNER_VAR, SESSION_TOKEN_VAR, Limits, owner_marker, parse_owner
from bmad_loop.engine.crashpoints import DELAY_DIR_ENV, DELAY_ENV
from bmad_loop.engine.verification.runner import VerifySite, run_verify
from support import StoryDef, project_argv, query, wait_for_exit, wait_for_files, wait_until, write_each

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
FAST = '[gates]\nmode = "none"\n[leases]\nttl_s = 3\n'
MB = 1024 * 1024


# ------------------------------------------------------------------------------ helpers
def enqueue(repo) -> str:
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    return result.output.strip().splitlines()[-1]


def start(repo, log: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """`bmad-loop ARGS --project ROOT` as a real process, its output appended to `log`."""
    with open(log, "ab") as handle:
        return subprocess.Popen(project_argv(repo, *args), stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))


def running(pid: int) -> bool:
    """psutil's view: the process exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def script(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


def adapter(argv: list[str], timeout_s: int = 60) -> str:
    return f"[adapter]\ncommand = {json.dumps(argv)}\ntimeout_s = {timeout_s}\n"


# ------------------------------------------------------------------------------ 7: poison agents
PARENT_KILLER = """\
    import json, os, signal, sys, time
    from pathlib import Path

    bar = Path(sys.argv[1])
    before = sorted(bar.glob("session-*"), key=lambda p: int(p.name.split("-")[1]))
    previous = json.loads(before[-1].read_text())["pid"] if before else None
    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
    (bar / f"session-{len(before) + 1}").write_text(json.dumps(
        {"pid": os.getpid(), "parent": os.getppid(),
         "previous_alive": bool(previous and alive(previous))}))
    os.kill(os.getppid(), signal.SIGKILL)   # the bmad-loop process that runs this session
    time.sleep(600)                         # left behind: recovery has to end it
"""


@pytest.mark.usefixtures("unboxed")  # its pids and orphans: unboxed
def test_an_agent_that_kills_its_bmad_loop_every_time_escalates_after_max_recoveries(
        make_repo, tmp_path):
    bar = tmp_path / "bar"
    bar.mkdir()
    agent = script(tmp_path / "parent_killer.py", PARENT_KILLER)
    repo = make_repo([ALPHA], policy=FAST + adapter([sys.executable, str(agent), str(bar)]))
    run_id = enqueue(repo)
    log = tmp_path / "runs.log"

    codes = []
    for round_ in range(1, 7):
        proc = start(repo, log, "resume", run_id)
        code = wait_for_exit(proc, 90, log)
        codes.append(code)
        if code != -signal.SIGKILL:
            break
        session = json.loads((bar / f"session-{round_}").read_text())
        assert session["parent"] == proc.pid  # it killed the very process that ran it
    # Killed by its agent 3 times + the first run, then the recovery that would be the 4th
    # escalates instead and the run ends, needing a human.
    assert codes == [-signal.SIGKILL] * 4 + [3], (codes, log.read_text()[-3000:])
    sessions = [json.loads((bar / f"session-{n}").read_text()) for n in range(1, 5)]
    assert not (bar / "session-5").exists()
    # Each leftover agent was dead before the story was retried, and none is left now.
    assert [s["previous_alive"] for s in sessions] == [False] * 4
    assert not any(running(s["pid"]) for s in sessions)

    recovered = repo.events("story.recovered", run=run_id)
    assert [e["data"]["recovery"] for e in recovered] == [1, 2, 3]
    assert all(e["data"]["max_recoveries"] == 3 for e in recovered)
    status = repo.status(run_id)
    assert status["run"]["state"] == "paused"
    story = status["stories"][0]
    assert story["state"] == "escalated"
    assert "max_recoveries = 3" in story["reason"] and "recovered 3 time(s)" in story["reason"]
    escalated = repo.events("story.escalated", run=run_id)
    assert len(escalated) == 1 and escalated[0]["data"]["recoveries"] == 3
    attempts = query(repo, "SELECT state, counted FROM attempts ORDER BY id")
    assert attempts == [("interrupted", 0)] * 4  # recoveries never use up dev attempts

    # A human resume gives a fresh budget: the next recovery counts from 1 again.
    proc = start(repo, log, "resume", run_id)
    assert wait_for_exit(proc, 90, log) == -signal.SIGKILL
    assert json.loads((bar / "session-5").read_text())["previous_alive"] is False
    proc = start(repo, log, "resume", run_id)
    assert wait_for_exit(proc, 90, log) == -signal.SIGKILL
    assert repo.events("story.recovered", run=run_id)[-1]["data"]["recovery"] == 1
    proc = start(repo, log, "stop", run_id)  # end it here; the agent of session 6 is ours to end
    assert wait_for_exit(proc, 60, log) == 0
    session = json.loads((bar / "session-6").read_text())
    os.kill(session["pid"], signal.SIGKILL)


PARENT_STOPPER = """\
    import json, os, signal, sys, time
    from pathlib import Path

    bar = Path(sys.argv[1])
    n = len(list(bar.glob("session-*"))) + 1
    (bar / f"session-{n}").write_text(json.dumps({"pid": os.getpid(), "parent": os.getppid()}))
    os.kill(os.getppid(), signal.SIGSTOP)   # freeze the bmad-loop process that runs this session
    time.sleep(600)
"""


@pytest.mark.usefixtures("unboxed")  # its pids and orphans: unboxed
def test_an_agent_that_stops_its_bmad_loop_every_time_cannot_hang_the_run(make_repo, tmp_path):
    """SIGSTOP freezes every thread of bmad-loop, so nothing inside it can act: the process's
    thaw helper continues it after `ttl_s`; then the story is recovered (its lease expired)
    or its session times out, until `max_recoveries` or `max_dev_attempts` escalates it."""
    bar = tmp_path / "bar"
    bar.mkdir()
    agent = script(tmp_path / "parent_stopper.py", PARENT_STOPPER)
    repo = make_repo([ALPHA], policy=FAST + "[limits]\nmax_dev_attempts = 1\n"
                     + adapter([sys.executable, str(agent), str(bar)], timeout_s=6))
    run_id = enqueue(repo)
    log = tmp_path / "run.log"
    proc = start(repo, log, "resume", run_id)
    assert wait_for_exit(proc, 120, log) == 3, log.read_text()[-3000:]
    sessions = [json.loads(p.read_text()) for p in bar.glob("session-*")]
    assert sessions and all(s["parent"] == proc.pid for s in sessions)
    assert not any(running(s["pid"]) for s in sessions)
    story = repo.status(run_id)["stories"][0]
    assert story["state"] == "escalated"
    assert "max_recoveries = 3" in story["reason"] or "dev attempts exhausted" in story["reason"]
    notes = "".join(p.read_text() for p in (repo.root / ".bmad-loop" / "logs").rglob("dev-*.log"))
    assert notes.count("was stopped for") >= len(sessions), notes[-2000:]


# ------------------------------------------------------------------------------ 8: bounded memory
LOUD_AGENT = """\
    import os, sys
    from pathlib import Path

    size = int(sys.argv[1])
    line = b"x" * 1023 + b"\\n"
    chunk = line * 1024                    # 1 MiB per write
    out = sys.stdout.buffer
    for _ in range(size // len(chunk)):
        out.write(chunk)
    if os.environ.get("BMAD_LOOP_PHASE") == "dev":
        Path("src/alpha.py").write_text("NAME = 'alpha'\\n")
    out.write(b"done\\n")
"""


# Measures through a small launcher: Linux counts a forked child's inherited high-water mark
# (vfork shares the parent's memory until exec) in its ru_maxrss, so a child of a big pytest
# worker would report the worker's size. The launcher is a fresh, small Python.
LAUNCHER = """\
import json, os, subprocess, sys
with open(sys.argv[1], "ab") as log:
    proc = subprocess.Popen(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
proc.returncode = code = os.waitstatus_to_exitcode(status)
print(json.dumps({"code": code, "maxrss": usage.ru_maxrss}))
"""


def peak_rss_of_run(repo, log: Path) -> tuple[int, int]:
    """Run `bmad-loop run` as a child; (exit code, its peak RSS in bytes, from wait4)."""
    out = subprocess.run([sys.executable, "-c", LAUNCHER, str(log), *project_argv(repo, "run")],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    return result["code"], result["maxrss"] * (1 if sys.platform == "darwin" else 1024)


def test_a_session_printing_hundreds_of_mb_keeps_bmad_loops_memory_bounded(make_repo, tmp_path):
    """200 MB from the dev session, the review, and the verify command in the story and in the
    candidate (1 GB each in bench/bounded_memory.py); the peak RSS of `bmad-loop run` (and of every child
    it waited for: ru_maxrss of wait4 is the largest of them) stays under 150 MB."""
    size = int(os.environ.get("BMAD_LOOP_TEST_OUTPUT_MB", "200")) * MB
    agent = script(tmp_path / "loud_agent.py", LOUD_AGENT)
    verify = f"{sys.executable} {agent} {size}"  # run in the story and in the candidate
    repo = make_repo([ALPHA], policy=FAST + f"[verify]\ncommands = {json.dumps([verify])}\n"
                     + adapter([sys.executable, str(agent), str(size)]))
    log = tmp_path / "run.log"
    code, rss = peak_rss_of_run(repo, log)
    print(f"\npeak RSS of bmad-loop run: {rss / MB:.1f} MB "
          f"(sessions and verify commands printed {4 * size // MB} MB in all)")
    assert code == 0, log.read_text()[-3000:]
    logs = repo.root / ".bmad-loop" / "logs"
    sizes = {p.name: p.stat().st_size for p in logs.rglob("*.log")}
    cap = 64 * MB  # [limits] max_log_bytes: every log cut, none past it
    assert len(sizes) == 4 and all(v <= cap for v in sizes.values()), sizes
    cut = [e["data"].get("dropped_bytes") or e["data"]["log_truncated"]["dropped_bytes"]
           for e in repo.journal() if e["kind"] == "log.truncated" or "log_truncated" in e["data"]]
    assert len(cut) == 4 and all(dropped > size - cap for dropped in cut), cut
    assert rss < 150 * MB, f"peak RSS {rss / MB:.1f} MB"
    for path in logs.rglob("*.log"):  # do not keep 600 MB of x's in the pytest temp folder
        path.unlink()


# ------------------------------------------------------------------------------ 9: verify trees
VERIFY_WITH_GRANDCHILD = """\
    import json, os, subprocess, sys, time
    from pathlib import Path

    import psutil

    bar = Path(sys.argv[1])
    if not (bar / "first").exists():
        # A grandchild that leaves the verify command's session and beats a heartbeat file.
        beat = "import sys, time\\nwhile True:\\n    open(sys.argv[1], 'w').write(str(time.time()))\\n    time.sleep(0.05)\\n"
        child = subprocess.Popen([sys.executable, "-c", beat, str(bar / "heartbeat")],
                                 start_new_session=True)
        (bar / "grandchild").write_text(str(child.pid))
        (bar / "first").write_text("x")
        time.sleep(600)                    # the test SIGKILLs bmad-loop meanwhile
    pid = int((bar / "grandchild").read_text())
    try:
        alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        alive = False
    with open(bar / "retries", "a") as out:
        out.write(json.dumps({"cwd": os.getcwd(), "grandchild_alive": alive}) + "\\n")
"""


@pytest.mark.usefixtures("unboxed")  # its pids and orphans: unboxed
def test_a_verify_grandchild_left_by_a_killed_worker_is_dead_before_the_story_is_retried(
        make_repo, tmp_path):
    bar = tmp_path / "bar"
    bar.mkdir()
    verify = script(tmp_path / "verify_gc.py", VERIFY_WITH_GRANDCHILD)
    command = f"{sys.executable} {verify} {bar}"
    repo = make_repo([ALPHA], script=write_each([ALPHA]),
                     policy=FAST + f"[verify]\ncommands = {json.dumps([command])}\n")
    run_id = enqueue(repo)
    log = tmp_path / "runs.log"

    first = start(repo, log, "resume", run_id)
    wait_for_files(bar / "grandchild", bar / "heartbeat")
    grandchild = int((bar / "grandchild").read_text())
    beat = (bar / "heartbeat").read_text()
    wait_until(lambda: (bar / "heartbeat").read_text() not in ("", beat), what="a heartbeat")
    first.send_signal(signal.SIGKILL)  # bmad-loop dies during verify
    assert wait_for_exit(first, 30, log) == -signal.SIGKILL
    assert running(grandchild)  # the crash left it behind, beating

    second = start(repo, log, "resume", run_id)
    code = wait_for_exit(second, 120, log)
    assert code == 0, log.read_text()[-3000:]
    retries = [json.loads(line) for line in (bar / "retries").read_text().splitlines()]
    # The story's retried verify (and the candidate's) ran with the grandchild already dead.
    assert retries and [r["grandchild_alive"] for r in retries] == [False] * len(retries)
    assert not running(grandchild)
    recovered = repo.events("story.recovered", run=run_id)
    assert len(recovered) == 1 and recovered[0]["data"]["phase"] == "verify"
    assert grandchild in recovered[0]["data"]["killed"]
    assert repo.status(run_id)["stories"][0]["state"] == "integrated"


def test_a_verify_timeout_kills_a_grandchild_that_left_the_session(tmp_path):
    pid_file = tmp_path / "gc.pid"
    command = (f"{sys.executable} -c \"import subprocess, sys; "
               f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
               f"start_new_session=True); open('{pid_file}', 'w').write(str(p.pid))\"; sleep 600")
    result = run_verify([command], VerifySite(tmp_path, tmp_path / "verify.log", run_id="r1",
                                              story_key="1-1-a"), Limits(timeout_s=2))
    assert result.timed_out and not result.ok
    assert not running(int(pid_file.read_text()))


def test_every_step_process_names_the_bmad_loop_process_that_started_it(tmp_path):
    """`BMAD_LOOP_OWNER` = host:pid:start of this process: what recovery tells leftovers by."""
    dump = tmp_path / "env.json"
    code = f"import json, os; json.dump(dict(os.environ), open({str(dump)!r}, 'w'))"
    result = run_verify([f"{sys.executable} -c \"{code}\""],
                        VerifySite(tmp_path, tmp_path / "v.log", run_id="r1", story_key="1-1-a"),
                        Limits(timeout_s=30))
    assert result.ok
    env = json.loads(dump.read_text())
    assert env[OWNER_VAR] == owner_marker()
    host, pid, start = parse_owner(env[OWNER_VAR])
    assert pid == os.getpid() and abs(start - psutil.Process().create_time()) < 0.01
    assert (env["BMAD_LOOP_RUN_ID"], env["BMAD_LOOP_STORY_KEY"]) == ("r1", "1-1-a")
    assert env[SESSION_TOKEN_VAR]


# ------------------------------------------------------------------------------ 10: heartbeats
def lease_times(repo, story_id: int) -> tuple[dt.datetime, dt.datetime] | None:
    rows = query(repo, "SELECT renewed_at, expires_at FROM leases WHERE name = ?", f"story:{story_id}")
    if not rows:
        return None
    return tuple(dt.datetime.fromisoformat(v) for v in rows[0])


def hold_past_the_ttl(repo, run_id: str, story_id: int, bar: Path, point: str) -> None:
    """With the worker held at `point`: wait until its lease was renewed a whole TTL after the
    moment it would have expired without renewals (the lane ticks every second meanwhile and
    recovers any story whose lease expired); then release it."""
    wait_for_files(bar / f"{point}.reached", timeout=60)
    _, expires = lease_times(repo, story_id)

    def renewed_well_past_expiry():
        if repo.events("story.recovered", run=run_id):
            pytest.fail(f"the live worker was recovered as an orphan during {point}")
        times = lease_times(repo, story_id)
        if times is None:
            pytest.fail(f"the story's lease was taken away during {point}")
        return times[0] >= expires + dt.timedelta(seconds=3)

    wait_until(renewed_well_past_expiry, timeout=60, interval=0.1, what=f"renewals during {point}")
    (bar / f"{point}.go").write_text("go")


def test_a_live_worker_is_never_recovered_during_slow_prepare_and_commit_steps(make_repo, tmp_path):
    bar = tmp_path / "bar"
    bar.mkdir()
    repo = make_repo([ALPHA], script=write_each([ALPHA]), policy=FAST)
    run_id = enqueue(repo)
    story_id = query(repo, "SELECT id FROM stories WHERE run_id = ?", run_id)[0][0]
    log = tmp_path / "run.log"
    proc = start(repo, log, "resume", run_id, env={
        DELAY_ENV: "worker.in_prepare,worker.in_commit", DELAY_DIR_ENV: str(bar)})
    try:
        hold_past_the_ttl(repo, run_id, story_id, bar, "worker.in_prepare")
        hold_past_the_ttl(repo, run_id, story_id, bar, "worker.in_commit")
    finally:
        for point in ("worker.in_prepare", "worker.in_commit"):
            (bar / f"{point}.go").write_text("go")
    assert wait_for_exit(proc, 120, log) == 0, log.read_text()[-3000:]
    assert repo.events("story.recovered", run=run_id) == []
    assert repo.status(run_id)["stories"][0]["state"] == "integrated"
    assert query(repo, "SELECT COUNT(*) FROM attempts WHERE phase = 'dev'") == [(1,)]
