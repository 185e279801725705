"""Wake-ups instead of polls: the in-process doorbell and the cross-process wake sockets.

Every test here is ordered by barriers (files, the doorbell's `waiting` count), never by
sleeps, and the consumers' fallback poll is pushed out to an hour where a test must prove that
only a wake-up could have delivered a message.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import shutil
import tempfile
from pathlib import Path

import pytest

from bmad_loop.queue.queues import (
    INTEGRATION,
    STORIES,
    BackgroundConsumer,
    Doorbell,
    QueueConfig,
    announce,
    make_huey,
)
from bmad_loop.queue.wakeup import WakeChannel, supported, wake_dir_for
from support import ALPHA_BETA_GAMMA, wait_until, write_each

pytestmark = pytest.mark.skipif(not supported(), reason="no AF_UNIX datagram sockets here")

HOUR = 3600.0

# A process that listens on one queue's wake folder and appends a line to OUT per wake-up;
# it writes OUT.ready (its socket's path) once bound and closes cleanly on SIGTERM.
LISTENER = textwrap.dedent("""
    import signal, sys
    from pathlib import Path
    from bmad_loop.queue.wakeup import WakeChannel

    folder, queue, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))

    def on_ring():
        with open(out, "a") as f:
            f.write("ring\\n")

    listener = WakeChannel(Path(folder), queue).listen(on_ring)
    Path(str(out) + ".ready").write_text(str(listener.path))
    while not stopping:
        signal.pause()
    listener.close()
""")

# A process that rings one queue's wake folder once and prints how many sockets it sent to.
RINGER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from bmad_loop.queue.wakeup import WakeChannel

    print(WakeChannel(Path(sys.argv[1]), sys.argv[2]).ring())
""")

# A process that enqueues one message on the SQLite `stories` queue the way Tasks does.
ENQUEUER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from bmad_loop.queue.queues import QueueConfig, announce, make_huey

    huey = make_huey(QueueConfig(backend="sqlite", sqlite_path=Path(sys.argv[1])), "stories")

    def touch(path):
        Path(path).write_text("done")

    touch.__module__ = sys.argv[3]  # huey names a task after its module: the consumer's
    huey.task(name="bmad_loop.test_wake_touch")(touch)(sys.argv[2])
    announce(huey)
""")


@pytest.fixture
def short_dir():
    """A folder whose socket paths fit in sun_path (about 104 bytes), wherever pytest puts
    tmp_path (under xdist it is deep enough to overflow); removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="bw-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return path


def _listener(tmp_path: Path, folder: Path, queue: str, name: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{name}.rings"
    proc = subprocess.Popen([sys.executable, str(_script(tmp_path, "listener", LISTENER)),
                             str(folder), queue, str(out)])
    wait_until(lambda: Path(f"{out}.ready").exists(), what=f"{name} bound its socket")
    return proc, out


def _rings(out: Path) -> int:
    return len(out.read_text().splitlines()) if out.exists() else 0


def _ring_from_another_process(tmp_path: Path, folder: Path, queue: str) -> int:
    done = subprocess.run([sys.executable, str(_script(tmp_path, "ringer", RINGER)),
                           str(folder), queue], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_a_ring_before_the_wait_is_not_lost():
    """The worker reads the generation before its (empty) dequeue; a ring that lands between
    that dequeue and its wait must end the wait at once instead of costing a whole wait."""
    bell = Doorbell()
    seen = bell.generation  # what a worker reads before it dequeues
    bell.ring()  # an enqueue lands after the empty dequeue, before the wait
    assert bell.wait_past(seen, HOUR) is True  # returns now; a lost ring would block an hour
    assert bell.wait_past(bell.generation, 0) is False  # nothing rung since: no spurious wake


def test_a_ring_from_another_process_before_the_wait_is_not_lost(tmp_path, short_dir):
    """Across processes: the datagram arrives while nobody waits; the wait after it returns."""
    folder = short_dir / "wake"
    bell = Doorbell()
    listener = WakeChannel(folder, STORIES).listen(bell.ring)
    try:
        seen = bell.generation
        assert _ring_from_another_process(tmp_path, folder, STORIES) == 1
        wait_until(lambda: bell.generation != seen, what="the datagram reached the doorbell")
        assert bell.wait_past(seen, HOUR) is True
    finally:
        listener.close()
    assert not folder.exists()  # closing removed this process's socket and the emptied folder


def test_a_ring_wakes_only_the_listeners_of_its_queue(tmp_path, short_dir):
    folder = short_dir / "wake"
    stories, stories_out = _listener(tmp_path, folder, STORIES, "stories")
    lane, lane_out = _listener(tmp_path, folder, INTEGRATION, "lane")
    try:
        assert WakeChannel(folder, STORIES).ring() == 1  # one socket: the stories listener's
        wait_until(lambda: _rings(stories_out) == 1, what="the stories listener rung")
        assert WakeChannel(folder, INTEGRATION).ring() == 1
        wait_until(lambda: _rings(lane_out) == 1, what="the lane listener rung")
        # A third ring for stories: the stories listener reads its datagrams in order, so a
        # stray integration ring would have been counted before this one.
        assert WakeChannel(folder, STORIES).ring() == 1
        wait_until(lambda: _rings(stories_out) >= 2, what="the second stories ring")
        assert (_rings(stories_out), _rings(lane_out)) == (2, 1)
    finally:
        _stop(stories)
        _stop(lane)
    assert not folder.exists()  # both closed cleanly: no socket file, no folder left


def test_an_enqueue_in_one_process_rings_only_its_queues_doorbell(tmp_path):
    config = QueueConfig(backend="sqlite", sqlite_path=tmp_path / "queue.db")
    stories, integration = make_huey(config, STORIES), make_huey(config, INTEGRATION)
    before = (stories.doorbell.generation, integration.doorbell.generation)
    announce(stories)
    assert (stories.doorbell.generation, integration.doorbell.generation) == (before[0] + 1, before[1])


def test_an_enqueue_in_another_process_wakes_the_idle_consumer_here(tmp_path):
    """The consumer's fallback poll is an hour: only the wake socket can deliver the message."""
    db = tmp_path / "queue.db"
    huey = make_huey(QueueConfig(backend="sqlite", sqlite_path=db), STORIES)

    @huey.task(name="bmad_loop.test_wake_touch")
    def touch(path):
        Path(path).write_text("done")

    huey.doorbell.fallback_s = HOUR
    consumer = BackgroundConsumer(huey, workers=1)
    consumer.start()
    done = tmp_path / "touched"
    try:
        assert huey.doorbell.remote, "the consumer bound no wake socket"
        wait_until(lambda: huey.doorbell.waiting == 1, what="the worker idle in its wait")
        subprocess.run([sys.executable, str(_script(tmp_path, "enqueuer", ENQUEUER)), str(db),
                        str(done), __name__], check=True)
        wait_until(lambda: done.exists(), what="the message taken by the woken consumer")
    finally:
        consumer.stop(graceful=True)
    assert not wake_dir_for(db).exists()


def test_a_socket_left_by_a_killed_process_is_removed_and_the_live_ones_still_rung(tmp_path, short_dir):
    folder = short_dir / "wake"
    dead, _ = _listener(tmp_path, folder, STORIES, "dead")
    stale = Path(Path(f"{tmp_path / 'dead.rings'}.ready").read_text())
    dead.send_signal(signal.SIGKILL)  # no chance to remove its socket
    assert dead.wait(timeout=30) == -signal.SIGKILL
    assert stale.exists()
    live, live_out = _listener(tmp_path, folder, STORIES, "live")
    try:
        assert WakeChannel(folder, STORIES).ring() == 1  # the live one; the stale one refused
        assert not stale.exists()
        wait_until(lambda: _rings(live_out) == 1, what="the live listener rung")
    finally:
        _stop(live)
    assert not folder.exists()


def test_a_ring_that_finds_only_stale_sockets_leaves_no_folder_behind(tmp_path, short_dir):
    folder = short_dir / "wake"
    dead, _ = _listener(tmp_path, folder, STORIES, "dead")
    dead.send_signal(signal.SIGKILL)
    assert dead.wait(timeout=30) == -signal.SIGKILL
    assert len(list(folder.iterdir())) == 1
    assert WakeChannel(folder, STORIES).ring() == 0
    assert not folder.exists()


def test_a_worker_process_binds_its_socket_and_removes_it_when_stopped(make_repo):
    repo = make_repo([])
    folder = wake_dir_for(repo.root / ".bmad-loop" / "queue.db")
    proc = repo.spawn("worker", "--queue", "stories", "-w", "2", log_name="worker")
    try:
        sockets = wait_until(lambda: [p for p in folder.iterdir()
                                      if p.name.startswith(f"{STORIES}-{proc.pid}-")]
                             if folder.exists() else [], what="the worker's wake socket")
        assert len(sockets) == 1  # one per queue and process, however many worker threads
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0, repo.spawned_logs()
    assert not folder.exists()


def test_redis_consumers_block_in_the_pop_and_sqlite_ones_have_a_wake_channel(backend):
    huey = make_huey(backend.queue_config(), STORIES)
    if backend.is_sqlite:
        assert huey.wake is not None and not huey.storage.blocking
    else:
        assert huey.wake is None and huey.storage.blocking  # BRPOP: woken by the push itself


def test_the_tick_that_settles_a_run_wakes_whoever_waits_on_the_lane(make_repo):
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
