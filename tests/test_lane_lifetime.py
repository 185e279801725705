"""A run's lane is one object, kept by the consumer set while the run is live (issue 34).

Real runs on real consumer threads; every wait is on a file barrier or on a tick the set
reports (`after_each_tick`), never on time.
"""

from __future__ import annotations

import sqlite3
import threading

from bmad_loop.engine.project import Project
from bmad_loop.engine.run.consumers import ConsumerSet
from support import (ALPHA_BETA, ALPHA_BETA_GAMMA, MERGE_NONE, barrier_script, go, inside, query,
                     wait_until, write_each)
from test_speculation import SPRINT, THREE, _gate_log, _policy, _rules, _verifying


class _Ticks:
    """What the consumer set kept for the run after each of its lane ticks."""

    def __init__(self, consumers: ConsumerSet):
        self.consumers = consumers
        self.seen: list = []
        self.lock = threading.Lock()
        consumers.after_each_tick(self._after)

    def _after(self, run_id: str) -> None:
        with self.lock:
            self.seen.append(self.consumers.kept_lane(run_id))

    def count(self) -> int:
        with self.lock:
            return len(self.seen)

    def last(self):
        with self.lock:
            return self.seen[-1] if self.seen else "no tick yet"


def _start(repo, workers: int):
    result = repo.cli("run", "--enqueue-only")
    assert result.exit_code == 0, result.output
    run_id = query(repo, "SELECT id FROM runs")[0][0]
    project = Project.open(repo.root)
    consumers = ConsumerSet(project, queue="all", workers=workers)
    ticks = _Ticks(consumers)
    consumers.start()
    return project, consumers, ticks, run_id


def test_a_run_keeps_one_lane_across_its_ticks_and_the_set_drops_it_once_the_run_completes(
        make_repo, bar):
    repo = make_repo(ALPHA_BETA, script=barrier_script(ALPHA_BETA, bar),
                     policy=MERGE_NONE.format(n=2, strategy="merge"))
    project, consumers, ticks, run_id = _start(repo, workers=2)
    try:
        wait_until(lambda: inside(bar) == ["1-1-alpha", "1-2-beta"], what="both agents in dev")
        lane = consumers.kept_lane(run_id)
        assert lane is not None and lane.run_id == run_id
        assert consumers.lane_of(run_id) is lane  # asked again: the same object, not a new one
        for story in ALPHA_BETA:
            go(bar, story.key)
        wait_until(lambda: ticks.last() is None, what="a tick that dropped the settled run's lane")
        assert query(repo, "SELECT state FROM runs") == [("completed",)]
        kept = [seen for seen in ticks.seen if seen is not None]
        assert len(kept) >= 2 and all(seen is lane for seen in kept), ticks.seen
        # What it learned across those ticks stayed with it: both stories' rows, read once.
        assert sorted(row.key for row in lane.memo.rows.values()) == ["1-1-alpha", "1-2-beta"]
        assert consumers.kept_lane(run_id) is None
    finally:
        for story in ALPHA_BETA:
            go(bar, story.key)
        consumers.stop(graceful=True)
        project.close()


def test_the_lane_keeps_its_verifications_across_ticks_and_outlives_a_run_that_ended_under_them(
        make_repo, bar):
    """Three candidates verify at once in the lane's threads. More ticks start none of them
    again (the lane knows they run), and a run that stops being live under them (here an
    operator's hand edit of the rows) keeps its lane until the last verification has ended."""
    repo = make_repo(SPRINT, script=write_each(SPRINT), policy=_policy(bar))
    project, consumers, ticks, run_id = _start(repo, workers=3)
    try:
        wait_until(lambda: _verifying(bar) >= THREE, what="three candidates verifying at once")
        lane = consumers.kept_lane(run_id)
        assert lane is not None and lane.busy()
        verifying = [cid for (cid,) in query(
            repo, "SELECT id FROM candidates WHERE state = 'verifying' ORDER BY id")]
        assert len(verifying) == 3 and all(lane.verifications.running(c) for c in verifying)

        before = ticks.count()
        for _ in range(3):
            consumers.tasks.enqueue_lane(run_id)
        wait_until(lambda: ticks.count() >= before + 3, what="three more lane ticks")
        assert consumers.kept_lane(run_id) is lane
        assert repo.events("candidate.reverifying") == []  # none started again
        assert sum(1 for line in _gate_log(bar) if line[0] == "start") == 3

        with sqlite3.connect(repo.root / ".bmad-loop" / "state.db") as conn:
            conn.execute("UPDATE runs SET state = 'failed', reason = 'ended by hand'")
        before = ticks.count()
        consumers.tasks.enqueue_lane(run_id)
        wait_until(lambda: ticks.count() > before, what="a tick of the run that is not live")
        assert consumers.kept_lane(run_id) is lane and lane.busy()  # kept: still verifying

        _rules(bar)  # every verification passes and ends; the last one wakes the lane
        wait_until(lambda: not lane.busy(), what="the verifications to end")
        wait_until(lambda: consumers.kept_lane(run_id) is None, what="the lane to be dropped")
        assert query(repo, "SELECT state FROM runs") == [("failed",)]
    finally:
        _rules(bar)
        consumers.stop(graceful=True)
        project.close()


def test_the_tick_that_settles_a_run_is_told_to_whoever_waits_on_the_lane(make_repo):
    """`drive` reads the journal after each lane tick: the callback of the tick that completes
    the run sees it completed, so `run` returns without waiting for its next poll."""
    from bmad_loop.db.models import Run
    from bmad_loop.engine.run.consumers import ConsumerSet
    from bmad_loop.engine.project import Project
    from bmad_loop.states import RunState

    stories = ALPHA_BETA_GAMMA[:1]
    repo = make_repo(stories, script=write_each(stories),
                     policy='[scm]\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n')
    result = repo.cli("run", "--enqueue-only")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip().splitlines()[-1]
    project = Project.open(repo.root)
    consumers = ConsumerSet(project, queue="all", workers=1)
    seen = []

    def after_tick(tick_run_id):
        with project.db.transaction() as s:
            seen.append((tick_run_id, s.get(Run, tick_run_id).state))

    consumers.after_each_tick(after_tick)
    consumers.start()
    try:
        wait_until(lambda: (run_id, RunState.COMPLETED) in seen, what="a tick callback after completion")
    finally:
        consumers.stop(graceful=True)
        project.close()
    assert seen[-1] == (run_id, RunState.COMPLETED) and len(seen) >= 2  # one per tick, the last settled
