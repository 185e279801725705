"""The crash matrix: kill -9 at every named crash point, restart, and nothing is lost or doubled.

For each point of `engine.crashpoints.CRASH_POINTS`, a three-story sprint (disjoint files, strategy
`merge`) is driven by a real `bmad-loop worker --queue all -w 1` subprocess with
`BMAD_LOOP_CRASH_AT=<point>`. The process SIGKILLs itself at that point (once: the marker file),
is started again with the same environment, and must finish the run. Then:

- every story is integrated exactly once (one `story.integrated`, one `target.advanced` each);
- the target's first-parent sequence of trees equals that of an uninterrupted run of an
  identically built repository (commit SHAs differ by their dates; trees do not);
- after `bmad-loop cleanup` no worktree but the main one and no ref in bmad-loop's namespaces
  remain;
- the journal and the rows record the recovery: `story.recovered` with the interrupted (not
  counted) attempts for worker points; for lane points, the integration resumed from the
  candidate row instead of being redone.

No sleeps-and-hope: every wait polls the database or a file with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from bmad_loop.engine.crashpoints import CRASH_ENV, CRASH_POINTS, ONCE_ENV
from support import (
    ALPHA_BETA_GAMMA,
    SETTLED,
    alive,
    poll,
    project_argv,
    query,
    stop_processes,
    wait_for_exit,
    wait_until,
    write_each,
)

STORIES = ALPHA_BETA_GAMMA
SCRIPT = write_each(STORIES)
POLICY = ('[scm]\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n'
          '[leases]\nttl_s = 3\n')
CRASH_DEADLINE_S = 60
FINISH_DEADLINE_S = 60


# ------------------------------------------------------------------------------ helpers
def start_worker(repo, env: dict, log: Path) -> subprocess.Popen:
    handle = open(log, "ab")
    try:
        return subprocess.Popen(project_argv(repo, "worker", "--queue", "all", "-w", "1"), env=env,
                                stdout=handle, stderr=subprocess.STDOUT)
    finally:
        handle.close()


def run_state(repo, run_id: str) -> str | None:
    """Cheap poll of the run row (the final verdict comes from `status --json`)."""
    rows = query(repo, "SELECT state FROM runs WHERE id = ?", run_id)
    return rows[0][0] if rows else None


def wait_until_completed(repo, run_id: str, proc: subprocess.Popen, log: Path) -> dict:
    def settled() -> bool:
        if run_state(repo, run_id) in SETTLED:
            return True
        if proc.poll() is not None:
            pytest.fail(f"worker exited {proc.returncode} before the run completed; log:\n"
                        + log.read_text()[-4000:])
        return False

    try:
        wait_until(settled, timeout=FINISH_DEADLINE_S, interval=0.2, what="the run to complete")
    except AssertionError:
        pytest.fail(f"run not completed within {FINISH_DEADLINE_S}s: {repo.status(run_id)['run']}\n"
                    + log.read_text()[-4000:])
    status = repo.status(run_id)
    if status["run"]["state"] != "completed":
        pytest.fail(f"run settled as {status['run']['state']}: {status['run']['reason']}\n"
                    + json.dumps(status["stories"], indent=1)[-3000:])
    return status


def enqueue(repo) -> str:
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    return result.output.strip().splitlines()[-1]


def target_trees(repo) -> list[tuple[str, int]]:
    return [(c["tree"], c["parents"]) for c in repo.first_parent_trees("main")]


def crash_at(repo, point: str, tmp_path: Path) -> tuple[str, dict, Path]:
    """Enqueue a run and start a worker that kills itself (SIGKILL) at `point`: the run, the
    environment for the next worker, and the log both write to."""
    log = tmp_path / "worker.log"
    marker = tmp_path / "crashed.marker"
    env = dict(os.environ, **{CRASH_ENV: point, ONCE_ENV: str(marker)})
    run_id = enqueue(repo)
    first = start_worker(repo, env, log)
    code = wait_for_exit(first, CRASH_DEADLINE_S, log)
    assert code == -signal.SIGKILL, f"exit {code}; log:\n{log.read_text()[-4000:]}"
    assert marker.read_text() == point  # it died at this point, not somewhere else
    return run_id, env, log


def finish(repo, run_id: str, env: dict, log: Path) -> dict:
    """A second worker (the crash switch fired once) runs the crashed run to its end."""
    second = start_worker(repo, env, log)
    try:
        return wait_until_completed(repo, run_id, second, log)
    finally:
        stop_processes(second)


def max_seq(repo) -> int:
    return query(repo, "SELECT COALESCE(MAX(seq), 0) FROM events")[0][0]


def attempt_rows(repo) -> list[dict]:
    with sqlite3.connect(repo.root / ".bmad-loop" / "state.db", timeout=30) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(
            "SELECT a.id, s.key, a.phase, a.state, a.counted FROM attempts a "
            "JOIN stories s ON s.id = a.story_id ORDER BY a.id")]


@pytest.fixture(scope="session")
def reference_memo() -> dict:
    """Holds the reference tree sequence once per test process (it is the same for every point)."""
    return {}


@pytest.fixture
def reference_trees(make_repo, reference_memo):
    """The target's tree sequence after an uninterrupted run of an identically built repository.

    Built with the same fixture, stories, script and policy as the crashed repository; driven by
    `bmad-loop run` in this process (the same engine, without the crash switch).
    """
    if "trees" not in reference_memo:
        repo = make_repo(STORIES, script=SCRIPT, policy=POLICY, name="reference")
        result = repo.cli("run")
        assert result.exit_code == 0, result.output
        trees = target_trees(repo)
        assert len(trees) == 1 + len(STORIES)
        reference_memo["trees"] = trees
    return reference_memo["trees"]


# ------------------------------------------------------------------------------ the matrix
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_kill_9_at_each_crash_point_loses_nothing_doubles_nothing_and_leaves_no_debris(
        point, make_repo, reference_trees, tmp_path):
    repo = make_repo(STORIES, script=SCRIPT, policy=POLICY, name="repo")
    run_id, env, log = crash_at(repo, point, tmp_path)
    crash_seq = max_seq(repo)
    main_at_crash = repo.git("rev-parse", "main")
    before = {s["key"]: s for s in repo.status(run_id)["stories"]}
    index_lock = repo.root / ".git" / "index.lock"
    locked_at_crash = index_lock.exists()
    worktree_at_crash = before["1-1-alpha"]["worktree"]
    leases_at_crash = [name for (name,) in query(repo, "SELECT name FROM leases")]
    branch_at_crash = before["1-1-alpha"]["branch"]

    status = finish(repo, run_id, env, log)

    # Every story integrated exactly once.
    assert [s["state"] for s in status["stories"]] == ["integrated"] * len(STORIES)
    journal = repo.journal(run_id)
    for story in STORIES:
        mine = [e for e in journal if e["story"] == story.key]
        assert [e["kind"] for e in mine].count("story.integrated") == 1, story.key
        assert [e["kind"] for e in mine].count("target.advanced") == 1, story.key
    # Same history of trees as the uninterrupted run.
    assert target_trees(repo) == reference_trees
    # Interrupted sessions never count against the budget: one counted dev attempt each.
    assert [s["attempt"] for s in status["stories"]] == [1] * len(STORIES)

    # The recovery is on record.
    after = [e for e in journal if e["seq"] > crash_seq]
    recovered = [e for e in journal if e["kind"] == "story.recovered"]
    dev_calls = [c for c in repo.calls() if c["key"] == "1-1-alpha" and c["phase"] == "dev"]
    attempts = [a for a in attempt_rows(repo) if a["key"] == "1-1-alpha"]
    if point == "worker.after_ready":
        # The story's last transaction made it ready and released its lease together: the
        # dead worker left no lease, so nothing was recovered; the lane integrated it as it
        # was, and parked or removed the worktree the worker could not park.
        assert before["1-1-alpha"]["state"] == "ready"
        alpha_id = query(repo, "SELECT id FROM stories WHERE key = '1-1-alpha'")[0][0]
        assert f"story:{alpha_id}" not in leases_at_crash, leases_at_crash
        assert recovered == [] and len(dev_calls) == 1
        assert all(a["state"] != "running" for a in attempts)
    elif point.startswith("worker."):
        assert [e["story"] for e in recovered] == ["1-1-alpha"]
        assert recovered[0]["seq"] > crash_seq
        interrupted = [a for a in attempts if a["state"] == "interrupted"]
        assert sorted(recovered[0]["data"]["interrupted_attempts"]) == [a["id"] for a in interrupted]
        assert all(a["counted"] == 0 for a in interrupted)
        assert all(a["state"] != "running" for a in attempts)
        if point in ("worker.in_agent", "worker.after_agent"):
            # The dev session was cut off (or its outcome unwritten): it runs again, uncounted.
            assert [a["phase"] for a in interrupted] == ["dev"]
            assert 1 <= len(dev_calls) <= 2
            if point == "worker.after_agent":
                assert len(dev_calls) == 2
        else:
            assert interrupted == []
            # A finished session is never run again (after_commit: dev and review both done).
            assert len(dev_calls) == 1
            if point == "worker.after_commit":
                reviews = [c for c in repo.calls() if c["key"] == "1-1-alpha" and c["phase"] == "review"]
                assert len(reviews) == 1
    else:
        if point == "lane.during_cleanup":
            # The lane dispatches the next story before it cleans up after this one: the crash
            # may also cut the next story's worker short, which is recovered like any other.
            assert {e["story"] for e in recovered} <= {"1-2-beta"}
            assert all(e["seq"] > crash_seq for e in recovered)
        else:
            assert recovered == []  # the worker had finished; only the lane died
        assert len(dev_calls) == 1
        cands = [c for c in status["candidates"] if c["story"] == "1-1-alpha"]
        ours = [e for e in after if e["story"] == "1-1-alpha"]
        if point == "lane.after_compose":
            # Nothing waits on a candidate without verify commands, so its row (and the story's
            # move to integrating) is written only once it is composed: the crash left the story
            # ready and no row, and it is composed again, as attempt 1, identically (the
            # target's trees are checked above).
            assert before["1-1-alpha"]["state"] == "ready"
            assert [c["state"] for c in cands] == ["advanced"]
            assert [e["data"]["attempt"] for e in ours if e["kind"] == "candidate.composed"] == [1]
        elif point == "lane.after_verify":
            # Verified before the crash: advanced from the row, not composed or verified again.
            assert [c["state"] for c in cands] == ["advanced"]
            assert [e["kind"] for e in ours][:1] == ["target.advanced"]
            assert not any(e["kind"] in ("candidate.composed", "candidate.verified") for e in ours)
        elif point in ("lane.after_cas", "lane.after_sync"):
            # The target had moved when the process died: that counts as advanced, no second CAS.
            assert [c["state"] for c in cands] == ["advanced"]
            advanced = [e for e in ours if e["kind"] == "target.advanced"]
            assert len(advanced) == 1 and advanced[0]["data"]["new"] == main_at_crash
            assert before["1-1-alpha"]["state"] == "integrating"
            # The checkout's index stayed locked through the crash (nobody could commit the
            # half-synced state); the next lane knew the lock as its own dead one and removed it.
            assert locked_at_crash
            assert [e["kind"] for e in after].count("git.stale_lock_removed") == 1
        elif point == "lane.during_cleanup":
            # Integrated and recorded before the crash; its worktree was released (parked for
            # the next story, or removed) before the next dispatch, its branch was left over.
            assert before["1-1-alpha"]["state"] == "integrated"
            assert worktree_at_crash and branch_at_crash
            assert not Path(worktree_at_crash).exists()
            assert not any(e["kind"] == "target.advanced" for e in ours)
        else:  # a crash point added to crashpoints.py needs its own expectation here
            pytest.fail(f"no expectation written for crash point {point}")

    # No debris once cleanup ran.
    result = repo.cli("cleanup")
    assert result.exit_code == 0, result.output
    assert repo.worktrees() == [str(repo.root)]
    # What a cut-short agent session left is evidence, kept until `cleanup --runs` prunes the
    # finished run (engine/worker/sessions.py); nothing else stays.
    evidence = [r for r in repo.bmad_branches() if r.endswith(".cut")]
    assert [r for r in repo.bmad_branches() if r not in evidence] == []
    assert all("/sessions/1-1-alpha/dev-1.cut" in r for r in evidence)
    assert not any(Path(repo.root, ".bmad-loop", "worktrees", run_id).glob("*"))
    # The target checkout followed every advance.
    assert repo.git("status", "--porcelain") == ""
    assert repo.git("rev-parse", "HEAD") == repo.git("rev-parse", "main")


def test_a_kill_9_after_composing_a_candidate_something_waits_on_abandons_its_row_and_composes_again(
        make_repo, reference_trees, tmp_path):
    """With verify commands the candidate has its row (and a ref) before it is composed: a kill
    right after composing leaves it `composing`; the next lane abandons it and composes attempt
    2, identically, and the abandoned attempt leaves no ref behind."""
    repo = make_repo(STORIES, script=SCRIPT, policy=POLICY + '[verify]\ncommands = ["true"]\n',
                     name="repo")
    run_id, env, log = crash_at(repo, "lane.after_compose", tmp_path)
    crash_seq = max_seq(repo)
    status = finish(repo, run_id, env, log)
    assert [s["state"] for s in status["stories"]] == ["integrated"] * len(STORIES)
    assert target_trees(repo) == reference_trees
    cands = [c for c in status["candidates"] if c["story"] == "1-1-alpha"]
    assert [c["state"] for c in cands] == ["abandoned", "advanced"]
    assert cands[0]["reason"] == "interrupted; recomposed"
    ours = [e for e in repo.journal(run_id) if e["story"] == "1-1-alpha" and e["seq"] > crash_seq]
    assert [e["data"]["attempt"] for e in ours if e["kind"] == "candidate.composed"] == [2]
    result = repo.cli("cleanup")
    assert result.exit_code == 0, result.output
    assert repo.bmad_branches() == []
    assert repo.git("for-each-ref", "refs/bmad-loop") == ""


def test_the_crash_matrix_covers_every_declared_point():
    """A new point in crashpoints.py must get an expectation in the matrix above."""
    handled = {"worker.after_worktree", "worker.in_agent", "worker.after_agent",
               "worker.after_commit", "worker.after_ready", "lane.after_compose", "lane.after_verify",
               "lane.after_cas", "lane.after_sync", "lane.during_cleanup"}
    assert set(CRASH_POINTS) == handled


@pytest.mark.usefixtures("unboxed")  # its pids and orphans: unboxed
def test_a_crash_inside_the_agent_session_ends_the_orphaned_agent_before_the_story_runs_again(
        make_repo, tmp_path):
    """The agent has its own process group, so it outlives a kill -9 of bmad-loop; the restarted
    consumer's orphan recovery must end it, or two agents would write one worktree at once."""
    inside, release = tmp_path / "inside", tmp_path / "release"
    alpha = STORIES[0]
    repo = make_repo([alpha], policy=POLICY, script={alpha.key: {"dev": [
        {"write": {alpha.files[0]: "NAME = 'alpha'\n"}, "touch": [str(inside)],
         "wait_for": str(release)}]}})
    log = tmp_path / "worker.log"
    env = dict(os.environ, **{CRASH_ENV: "worker.in_agent", ONCE_ENV: str(tmp_path / "marker")})
    run_id = enqueue(repo)

    first = start_worker(repo, env, log)
    assert wait_for_exit(first, CRASH_DEADLINE_S, log) == -signal.SIGKILL
    poll(inside.exists, timeout=30)
    orphan = int(inside.read_text())
    assert alive(orphan)  # still blocked on its barrier, its parent gone
    inside.unlink()

    second = start_worker(repo, env, log)
    try:
        poll(inside.exists, timeout=30)  # the new session started
        assert inside.exists(), log.read_text()[-4000:]
        assert not alive(orphan), f"the orphaned agent {orphan} was left running"
        release.write_text("go")
        status = wait_until_completed(repo, run_id, second, log)
    finally:
        release.write_text("go")
        stop_processes(second)
    assert status["stories"][0]["state"] == "integrated"
    recovered = [e for e in repo.journal(run_id) if e["kind"] == "story.recovered"]
    assert len(recovered) == 1 and len(recovered[0]["data"]["interrupted_attempts"]) == 1
