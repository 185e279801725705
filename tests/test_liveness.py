"""Who is alive, from one source: the consumers' and the lane's leases (engine/leases.py).

`status` lists the live consumers and warns about a live run nobody works on; `resume` of a
run another process drives is refused naming it; a second `run` says `stop` for a driven run
and `resume` for a settled one; `bmad-loop worker` says which story it takes and finishes.
Real `bmad-loop worker` processes, a real SIGKILL, agents held in dev by file barriers.
"""

from __future__ import annotations

import json
import signal
import sqlite3

from support import StoryDef, go, inside, query, spawn_cli, wait_until

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
BETA = StoryDef("1-2-beta", files=["src/beta.py"])
ONE_SLOT = '[scm]\nmax_parallel = 1\n[gates]\nmode = "none"\n'


def held(bar) -> dict:
    """Alpha's dev session waits for `go-1-1-alpha`; beta's finishes at once."""
    return {ALPHA.key: {"dev": [{"write": {"src/alpha.py": "alpha\n"}, "touch": [str(bar / f"in-{ALPHA.key}")],
                                 "wait_for": str(bar / f"go-{ALPHA.key}")}]},
            BETA.key: {"dev": [{"write": {"src/beta.py": "beta\n"}}]}}


def status(repo, run_id: str) -> dict:
    result = repo.cli("status", run_id, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_driven_run_is_not_resumed_a_second_run_says_stop_and_status_lists_the_worker(make_repo, tmp_path):
    bar = tmp_path / "bar"
    bar.mkdir()
    repo = make_repo([ALPHA, BETA], script=held(bar), policy=ONE_SLOT)
    run_id = repo.cli("enqueue").output.strip()
    worker = spawn_cli(repo, "worker", "-w", "1")
    try:
        wait_until(lambda: inside(bar) == [ALPHA.key], what="alpha in dev")
        worker.read_until(f"took {ALPHA.key} (run {run_id})")
        shown = status(repo, run_id)
        assert [(c["pid"], c["role"], c["queues"], c["lane"]) for c in shown["consumers"]] == [
            (worker.proc.pid, "all", ["stories", "integration"], "holds")]
        assert shown["consumers"][0]["heartbeat_at"] and shown["warnings"] == []
        assert f"pid {worker.proc.pid} all queues=stories,integration lane=holds" in \
            repo.cli("status", run_id).output

        resumed = repo.cli("resume", run_id)
        assert resumed.exit_code == 2, resumed.output
        assert f"pid {worker.proc.pid}" in resumed.output and "status --watch" in resumed.output
        assert "attach" in resumed.output
        second = repo.cli("run")
        assert second.exit_code == 2 and f"bmad-loop stop {run_id}" in second.output
        assert f"pid {worker.proc.pid}" in second.output

        # Stopped: the worker finishes alpha's session, the run settles; nothing is "busy".
        assert repo.cli("stop", run_id).exit_code == 0
        go(bar, ALPHA.key)
        wait_until(lambda: query(repo, "SELECT state FROM runs")[0][0] == "stopped", what="stopped")
        worker.read_until(f"finished {ALPHA.key} (run {run_id}): pending")
        text = repo.cli("status", run_id).output
        assert "slot(s) busy" not in text, text
        assert all(s["waiting_for"] is None for s in status(repo, run_id)["stories"])
    finally:
        go(bar, ALPHA.key)  # a failed assertion must not leave the worker waiting on alpha
        worker.proc.send_signal(signal.SIGINT)
        worker.finish()
    assert status(repo, run_id)["consumers"] == []  # a graceful stop takes its row with it


def age_journal(repo, seconds: int) -> None:
    """Time passes for the run: its journal's last event is `seconds` old (the clock the idle
    warning counts from), as if the run had waited that long with nobody working on it."""
    with sqlite3.connect(repo.root / ".bmad-loop" / "state.db") as conn:
        conn.execute(f"UPDATE events SET ts = datetime(ts, '-{seconds} seconds')")


def test_status_warns_of_a_live_run_with_no_consumer_and_a_killed_worker_is_not_alive(make_repo, tmp_path):
    bar = tmp_path / "bar"
    bar.mkdir()
    repo = make_repo([ALPHA], script=held(bar), policy=ONE_SLOT)
    run_id = repo.cli("enqueue").output.strip()
    assert status(repo, run_id)["warnings"] == []  # just enqueued: not idle for long yet
    age_journal(repo, 120)
    warnings = status(repo, run_id)["warnings"]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("no story consumer alive for 1") and "bmad-loop worker" in warnings[0]
    assert warnings[1].startswith("no lane consumer alive")
    assert "warning: no story consumer alive" in repo.cli("status", run_id).output

    worker = spawn_cli(repo, "worker", "-w", "1")
    try:
        wait_until(lambda: inside(bar) == [ALPHA.key], what="alpha in dev")
        shown = status(repo, run_id)
        assert shown["warnings"] == [] and shown["stories"][0]["alive"] is True
        resumed = repo.cli("resume", run_id, "--enqueue-only")
        assert resumed.exit_code == 2 and f"pid {worker.proc.pid}" in resumed.output
    finally:
        worker.proc.send_signal(signal.SIGKILL)
        worker.finish()
    # Its leases have not expired, but its process is gone: not alive, for `status` and for
    # `resume` alike (one rule, leases.is_live).
    shown = status(repo, run_id)
    assert shown["consumers"] == [] and shown["stories"][0]["alive"] is False
    second = repo.cli("run")  # the run is still `running`, but nobody drives it
    assert second.exit_code == 2 and f"bmad-loop resume {run_id}` continues it" in second.output
    resumed = repo.cli("resume", run_id, "--enqueue-only")
    assert resumed.exit_code == 0, resumed.output
