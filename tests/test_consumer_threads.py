"""The consumers' threads say what they are: in a thread dump of one `run` or `worker` process
(py-spy dump, faulthandler) the lane and the story workers must not both be `Worker-1`, which is
what huey names the first thread of every consumer, and each working story's heartbeat names
its story."""

from __future__ import annotations

import threading

from bmad_loop.engine.run.consumers import ConsumerSet, story_workers
from bmad_loop.engine.project import Project
from support import ALPHA_BETA, MERGE_NONE, barrier_script, go, inside, wait_until


def _thread_names() -> list[str]:
    return [t.name for t in threading.enumerate()]


def test_the_lane_the_story_workers_and_each_heartbeat_are_named_apart(make_repo, tmp_path):
    bar = tmp_path / "bar"
    bar.mkdir()
    repo = make_repo(ALPHA_BETA, script=barrier_script(ALPHA_BETA, bar),
                     policy=MERGE_NONE.format(n=2, strategy="merge"))
    result = repo.cli("run", "--enqueue-only")
    assert result.exit_code == 0, result.output
    project = Project.open(repo.root)
    consumers = ConsumerSet(project, queue="all", workers=2)
    consumers.start()
    try:
        # Both agents are held inside their dev session: both workers and their heartbeats run.
        wait_until(lambda: inside(bar) == ["1-1-alpha", "1-2-beta"], what="both agents in dev")
        names = _thread_names()
    finally:
        for story in ALPHA_BETA:
            go(bar, story.key)
        consumers.stop(graceful=True)
        project.close()
    ours = [n for n in names if n.startswith("bmad-")]
    assert {"bmad-stories-Worker-1", "bmad-stories-Worker-2", "bmad-lane-Worker-1",
            "bmad-heartbeat-1-1-alpha", "bmad-heartbeat-1-2-beta"} <= set(ours), names
    assert "bmad-stories-Worker-3" not in ours  # one thread per `-w`, no more
    assert len(ours) == len(set(ours)), names  # no two of ours alike
    assert not any(n.startswith("Worker-") for n in names), names


def test_a_worker_is_sized_by_the_runs_snapshot_once_the_run_exists(make_repo, tmp_path):
    """`worker` without `-w`: before any run, `[scm] max_parallel` of policy.toml; once a run is
    enqueued, its snapshot (the runs row), whatever policy.toml says since."""
    bar = tmp_path / "bar"
    bar.mkdir()
    repo = make_repo(ALPHA_BETA, script=barrier_script(ALPHA_BETA, bar),
                     policy=MERGE_NONE.format(n=2, strategy="merge"))
    before = Project.open(repo.root)
    try:
        assert story_workers(before, "all") == 2  # no run yet: the policy
    finally:
        before.close()
    assert repo.cli("run", "--enqueue-only").exit_code == 0
    repo.write_policy(MERGE_NONE.format(n=5, strategy="merge"))  # changed after enqueue
    proc = repo.spawn("worker", log_name="worker")
    try:
        wait_until(lambda: "workers=" in repo.spawned_logs(), what="the worker's first line")
        assert "queue=all workers=2 " in repo.spawned_logs(), repo.spawned_logs()
        wait_until(lambda: inside(bar) == ["1-1-alpha", "1-2-beta"], what="both agents in dev")
    finally:
        for story in ALPHA_BETA:
            go(bar, story.key)
        repo.kill_spawned()
    assert proc.poll() is not None
    after = Project.open(repo.root)
    try:
        assert after.policy.scm.max_parallel == 5
        assert story_workers(after, "all") == 2  # the run's, not the file's
        assert story_workers(after, "integration") == 1
    finally:
        after.close()
