"""One integration lane per project, enforced by the `lane:<root>` lease and fencing.

- Two real lane processes (`bmad-loop worker --queue integration`) beside a story worker: the
  second waits as a standby and never holds the lease while the first lives; after kill -9 of
  the first it takes over (token 2) and finishes the run. Barriers are files; waits poll the
  database with a deadline.
- Fencing, in process, on an explicit clock: a lane whose lease was taken over while it stalled
  is refused at its compare-and-swap (`LaneFenced`, journal `lane.fenced`), the target unchanged;
  a standby tick does nothing; the rightful holder then integrates from the same candidate.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bmad_loop.db.models import Candidate, Run, Story
from bmad_loop.engine import leases
from bmad_loop.engine.lane.integrate import Integrator, LaneFenced
from bmad_loop.engine.lane.tick import tick_once as tick
from bmad_loop.engine.project import Project
from bmad_loop.engine.runrows import run_policy
from bmad_loop.engine.worker.story_task import work
from bmad_loop.queue.tasks import Tasks
from support import ALPHA_BETA_GAMMA, project_argv, query, stop_processes, wait_until

STORIES = ALPHA_BETA_GAMMA
POLICY = '[scm]\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n[leases]\nttl_s = 3\n'


# ------------------------------------------------------------------------------ helpers
def lane_lease(repo) -> tuple[str, int] | None:
    rows = query(repo, "SELECT owner, token FROM leases WHERE name = ?", f"lane:{repo.root}")
    return (rows[0][0], rows[0][1]) if rows else None


def lease_pid(lease) -> int | None:
    return int(lease[0].split(":")[1]) if lease else None


def events(repo, kind: str) -> list[dict]:
    rows = query(repo, "SELECT seq, story, data FROM events WHERE kind = ? ORDER BY seq", kind)
    return [{"seq": seq, "story": story, "data": json.loads(data or "{}")} for seq, story, data in rows]


class Workers:
    """`bmad-loop worker` subprocesses of one test, each stopped (or killed) at the end."""

    def __init__(self, repo, tmp_path: Path):
        self.repo, self.tmp_path, self.procs = repo, tmp_path, {}

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = self.tmp_path / f"{name}.log"
        with open(log, "wb") as handle:
            proc = subprocess.Popen(
                project_argv(self.repo, "worker", *args),
                stdout=handle, stderr=subprocess.STDOUT, env=dict(os.environ))
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text()

    def started(self, name: str) -> bool:
        return "bmad-loop worker: queue=" in self.log(name)

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)[-3000:]}" for n in self.procs)

    def stop_all(self) -> None:
        stop_processes(*self.procs.values())


@pytest.fixture
def workers(make_repo, tmp_path):
    made = []

    def factory(repo):
        w = Workers(repo, tmp_path)
        made.append(w)
        return w

    yield factory
    for w in made:
        w.stop_all()


# ------------------------------------------------------------------------------ two lanes
def test_a_second_lane_stays_standby_while_the_first_lives_and_takes_over_after_kill_9(
        make_repo, workers, tmp_path):
    inside, release = tmp_path / "beta-inside", tmp_path / "beta-release"
    script = {s.key: {"dev": [{"write": {s.files[0]: f"NAME = '{s.key}'\n"}}]} for s in STORIES}
    script["1-2-beta"]["dev"][0].update(touch=[str(inside)], wait_for=str(release))
    repo = make_repo(STORIES, script=script, policy=POLICY)
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip()
    w = workers(repo)

    first = w.start("lane-a", "--queue", "integration")
    wait_until(lambda: lease_pid(lane_lease(repo)) == first.pid, what="lane A to hold the lane lease")
    second = w.start("lane-b", "--queue", "integration")
    wait_until(lambda: w.started("lane-b"), what="lane B to be up")

    # Watch the lease for as long as A lives: B's pid must never show up as its owner.
    samples: list[tuple[str, int] | None] = []
    watching = threading.Event()
    watching.set()

    def watch():
        while watching.is_set():
            samples.append(lane_lease(repo))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    w.start("stories", "--queue", "stories", "-w", "1")
    try:
        wait_until(lambda: [e["story"] for e in events(repo, "target.advanced")] == ["1-1-alpha"]
                   and inside.exists(), what="alpha integrated and beta inside its dev session")
        assert lane_lease(repo) == (f"{socket.gethostname()}:{first.pid}:lane", 1)
        kill_seq = max(seq for (seq,) in query(repo, "SELECT seq FROM events"))
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        watching.clear()
        watcher.join(timeout=10)
    assert samples and all(lease_pid(s) == first.pid and s[1] == 1 for s in samples), \
        sorted({s for s in samples if s})

    # The dead owner is on this host: B takes over without waiting out the TTL.
    wait_until(lambda: lease_pid(lane_lease(repo)) == second.pid, what="lane B to take the lease")
    assert lane_lease(repo) == (f"{socket.gethostname()}:{second.pid}:lane", 2)
    release.write_text("go")
    try:
        wait_until(lambda: query(repo, "SELECT state FROM runs WHERE id = ?", run_id)[0][0]
                   in ("completed", "failed", "paused"), what="the run to settle")
    except AssertionError:
        raise AssertionError(w.logs())
    status = repo.status(run_id)
    assert status["run"]["state"] == "completed", status["run"]
    assert lane_lease(repo)[1] == 2  # exactly one takeover, ever

    advanced = events(repo, "target.advanced")
    assert [e["story"] for e in advanced] == [s.key for s in STORIES]
    assert advanced[0]["seq"] <= kill_seq < advanced[1]["seq"]  # A did alpha, B the rest
    assert [e["story"] for e in events(repo, "story.integrated")] == [s.key for s in STORIES]
    assert events(repo, "lane.fenced") == []
    assert second.poll() is None


# ------------------------------------------------------------------------------ fencing
@pytest.fixture
def ready_story(make_repo):
    """A run whose one story is `ready`: admitted by a lane tick, worked by `work()`, in process."""
    yield from _ready_story(make_repo, POLICY)


@pytest.fixture
def ready_story_short_lock_wait(make_repo):
    """`ready_story` with git's lock waits cut to 1 s ([scm] lock_wait_s)."""
    yield from _ready_story(make_repo, POLICY.replace("[scm]\n", "[scm]\nlock_wait_s = 1\n"))


def _ready_story(make_repo, policy: str):
    story = STORIES[0]
    repo = make_repo([story], policy=policy,
                     script={story.key: {"dev": [{"write": {story.files[0]: "NAME = 'alpha'\n"}}]}})
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip()
    project = Project.open(repo.root)
    tasks = Tasks(project)
    tick(project, tasks, run_id)  # no lane holder: admits the story
    with project.db.transaction() as s:
        story_id = s.query(Story.id).filter(Story.run_id == run_id).scalar()
    work(project, tasks, run_id, story_id)
    with project.db.transaction() as s:
        assert s.get(Story, story_id).state == "ready"
    yield repo, project, tasks, run_id, story_id
    project.close()


def clocked_holder(project, tag: str, now: list) -> leases.LeaseHolder:
    return leases.LeaseHolder(project.db, project.lane_lease_name, leases.owner_id(tag),
                              project.policy.leases.ttl_s, clock=lambda: now[0])


def test_a_lane_that_lost_its_lease_is_fenced_at_its_cas_and_the_target_never_moves(ready_story):
    repo, project, tasks, run_id, story_id = ready_story
    main_before = repo.git("rev-parse", "main")
    now = [dt.datetime.now(dt.timezone.utc)]
    stale, fresh = clocked_holder(project, "lane-a", now), clocked_holder(project, "lane-b", now)
    stale.step()
    assert stale.token == 1
    now[0] += dt.timedelta(seconds=project.policy.leases.ttl_s + 1)  # A stalls past its TTL
    fresh.step()
    assert fresh.token == 2
    assert stale.held and not stale.still_holds()  # A does not know it yet

    with project.db.transaction() as s:
        run = s.get(Run, run_id)
        policy = run_policy(run)
    with pytest.raises(LaneFenced):
        Integrator(project, run, policy, fence=stale.still_holds).integrate(story_id)
    assert repo.git("rev-parse", "main") == main_before

    # The same through a lane tick: refused, journaled, nothing moved.
    tick(project, tasks, run_id, holder=stale)
    assert repo.git("rev-parse", "main") == main_before
    fenced = [e for e in repo.journal(run_id) if e["kind"] == "lane.fenced"]
    assert len(fenced) == 1 and "lost the lane lease" in fenced[0]["data"]["reason"]
    assert not any(e["kind"] == "target.advanced" for e in repo.journal(run_id))
    with project.db.transaction() as s:
        assert s.get(Story, story_id).state == "integrating"
        cands = [c.state for c in s.query(Candidate).filter(Candidate.story_id == story_id)]
    assert cands == ["advancing"]  # composed and verified; only the CAS was refused

    # The rightful holder picks the candidate up where the fenced lane left it.
    tick(project, tasks, run_id, holder=fresh)
    status = repo.status(run_id)
    assert status["run"]["state"] == "completed"
    assert [c["state"] for c in status["candidates"]] == ["advanced"]
    advanced = [e for e in repo.journal(run_id) if e["kind"] == "target.advanced"]
    assert len(advanced) == 1 and advanced[0]["data"]["old"] == main_before
    assert repo.git("rev-parse", "main") == advanced[0]["data"]["new"]


def test_a_standby_lane_tick_does_nothing_at_all(ready_story):
    repo, project, tasks, run_id, story_id = ready_story
    main_before = repo.git("rev-parse", "main")
    journal_before = repo.journal(run_id)
    now = [dt.datetime.now(dt.timezone.utc)]
    holder, standby = clocked_holder(project, "lane-a", now), clocked_holder(project, "lane-b", now)
    holder.step()
    standby.step()
    assert holder.held and not standby.held

    tick(project, tasks, run_id, holder=standby)

    assert repo.git("rev-parse", "main") == main_before
    assert repo.journal(run_id) == journal_before
    with project.db.transaction() as s:
        assert s.get(Story, story_id).state == "ready"
        assert s.query(Candidate).filter(Candidate.story_id == story_id).count() == 0


def _stall_between_fence_and_cas(ready):
    """The stale lane passes its fence check, then stalls past its TTL before the CAS (a GC
    pause, a stopped process); meanwhile the standby takes the lease over and ticks. Returns
    the story's state as that tick left it, and the journal once the stale lane went on."""
    repo, project, tasks, run_id, story_id = ready
    now = [dt.datetime.now(dt.timezone.utc)]
    stale, fresh = clocked_holder(project, "lane-a", now), clocked_holder(project, "lane-b", now)
    stale.step()
    other = Tasks(project)
    during = []

    def fence_then_stall() -> bool:
        held = stale.still_holds()  # checked: still ours
        # ...and now the lane stalls: its lease expires, the standby takes over and ticks.
        now[0] += dt.timedelta(seconds=project.policy.leases.ttl_s + 1)
        fresh.step()
        assert fresh.token == 2
        tick(project, other, run_id, holder=fresh)
        with project.db.read() as s:
            during.append(s.get(Story, story_id).state)
        return held

    with project.db.transaction() as s:
        run = s.get(Run, run_id)
        policy = run_policy(run)
    Integrator(project, run, policy, fence=fence_then_stall).integrate(story_id)
    return during[0], repo.journal(run_id)


def test_a_lane_that_stalls_between_its_fence_check_and_its_cas_does_not_record_a_second_integration(
        ready_story):
    """No checkout of the target to keep in step (the main checkout is elsewhere): the new
    holder integrates the same candidate during the stall. When the stale lane wakes, its CAS
    finds the target already at the candidate ("already advanced" is success) — it must not
    record the story as integrated a second time."""
    repo, project, tasks, run_id, story_id = ready_story
    main_before = repo.git("rev-parse", "main")
    repo.git("checkout", "--quiet", "--detach")
    during, journal = _stall_between_fence_and_cas(ready_story)
    assert during == "integrated"  # by the new holder, while the stale lane stalled
    advanced = [e for e in journal if e["kind"] == "target.advanced"]
    assert [e["data"]["old"] for e in advanced] == [main_before]  # the target moved once
    assert [e["kind"] for e in journal].count("story.integrated") == 1
    assert repo.git("rev-list", "--count", f"{main_before}..main") == "2"  # one merge commit
    assert repo.status(run_id)["run"]["state"] != "paused"


def test_a_lane_stalled_while_it_holds_the_target_checkout_keeps_the_new_holder_from_landing(
        ready_story_short_lock_wait):
    """With the target checked out, the stale lane holds the checkout's index from before its
    CAS until the checkout follows: the new holder cannot move the target meanwhile. It waits
    for the lock, retries, and pauses the run with a lock fault naming it; the stale lane's CAS
    then lands the story, once."""
    repo, project, tasks, run_id, story_id = ready_story_short_lock_wait
    main_before = repo.git("rev-parse", "main")
    during, journal = _stall_between_fence_and_cas(ready_story_short_lock_wait)
    assert during == "integrating"  # the new holder landed nothing
    kinds = [e["kind"] for e in journal]
    assert "git.lock_waited" in kinds and "fault.retry" in kinds
    paused = [e for e in journal if e["kind"] == "run.paused"]
    assert len(paused) == 1 and "lock fault" in paused[0]["data"]["reason"]
    assert kinds.index("run.paused") < kinds.index("target.advanced")
    assert kinds.count("target.advanced") == 1 and kinds.count("story.integrated") == 1
    assert repo.git("rev-list", "--count", f"{main_before}..main") == "2"
