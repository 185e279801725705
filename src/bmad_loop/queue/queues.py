"""The two huey queues and their consumers.

`stories` carries story work (a pool of N consumer threads); `integration` carries lane ticks
(exactly one thread: the lane is the coordinator and the only writer of the target branch).
A message is only a wake-up holding row ids: the task bodies live in `bmad_loop.queue.tasks`, which
re-reads the rows and claims them, so a duplicate message is a no-op and a lost one costs a
re-queue. Embedded default: huey's SQLite storage in `.bmad-loop/queue.db`, kept apart from
the state database so the two never contend for one lock.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from huey import RedisHuey, SqliteHuey
from huey.storage import SqliteStorage
from huey.consumer import Consumer, Worker

from .wakeup import WakeChannel, wake_dir_for

__all__ = ["QueueConfig", "make_huey", "announce", "BackgroundConsumer", "Doorbell", "STORIES",
           "INTEGRATION"]

STORIES = "stories"
INTEGRATION = "integration"

# SQLite consumers that cannot be woken across processes (no AF_UNIX datagrams) poll; a short
# maximum back-off keeps their dispatch latency well under a second.
POLL_INITIAL_S = 0.05
POLL_MAX_S = 0.5
# With a wake socket bound, an idle SQLite consumer is woken by every enqueue of this machine;
# the poll is only the fallback for a wake-up that could not be sent (another TMPDIR, another
# host sharing the file), so it may be slow.
WAKE_FALLBACK_S = 2.0
# Redis consumers wait in BRPOP; this bounds how long a stop waits for one to notice.
REDIS_READ_TIMEOUT_S = 1


@dataclass(frozen=True)
class QueueConfig:
    backend: str  # sqlite | redis
    url: str = ""
    sqlite_path: Path | None = None
    prefix: str = "bmad-loop"
    extra: dict = field(default_factory=dict)


class Doorbell:
    """Rung on every enqueue of its queue; idle workers of that queue wait on it.

    huey's SQLite consumers poll with a back-off, so a message enqueued by a sibling thread (a
    story that became ready waking the lane, the lane filling a worker slot) would wait up to
    the back-off. With the doorbell they start at once. An enqueue in another process rings it
    through the queue's wake socket (`bmad_loop.queue.wakeup`); without one, the poll finds the
    message within `POLL_MAX_S`. A generation counter read *before* each dequeue means a ring
    between an empty dequeue and the wait is never missed.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self.generation = 0
        self.waiting = 0  # threads inside wait_past: what tests wait for before they ring
        self.remote = False  # True while a wake socket feeds this bell from other processes
        self.fallback_s = WAKE_FALLBACK_S  # the idle wait while `remote`

    def ring(self) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def wait_past(self, seen: int, timeout: float) -> bool:
        """Wait until rung after `seen`, or `timeout` seconds; True when rung."""
        with self._cond:
            self.waiting += 1
            try:
                return self._cond.wait_for(lambda: self.generation != seen, timeout)
            finally:
                self.waiting -= 1


class _QueueStorage(SqliteStorage):
    """huey's SQLite storage, committing without an fsync (WAL, `synchronous = NORMAL`).

    A message is only a wake-up: one lost to a power cut is re-queued from the state database
    on resume (recovery re-queues every non-terminal row), and WAL with NORMAL cannot corrupt
    the file. huey's default (FULL) syncs the log on every enqueue and dequeue."""

    def _create_connection(self):
        conn = super()._create_connection()
        conn.execute("pragma synchronous = NORMAL")
        return conn


class _SqliteQueue(SqliteHuey):
    storage_class = _QueueStorage


def make_huey(config: QueueConfig, queue: str):
    """A huey instance for one queue, with its doorbell and, on SQLite, its cross-process wake
    channel (`huey.wake`; None on Redis, whose consumers block in BRPOP). `results=False`: the
    state lives in the database."""
    name = f"{config.prefix}-{queue}"
    wake = None
    if config.backend == "redis":
        huey = RedisHuey(name=name, url=config.url, results=False, utc=True, blocking=True,
                         read_timeout=REDIS_READ_TIMEOUT_S)
    else:
        config.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
        huey = _SqliteQueue(name=name, filename=str(config.sqlite_path), results=False, utc=True,
                          timeout=30)
        folder = wake_dir_for(config.sqlite_path)  # None: no private folder fits, poll
        wake = WakeChannel(folder, queue) if folder is not None else None
    huey.doorbell = Doorbell()
    huey.wake = wake
    return huey


def announce(huey) -> None:
    """After an enqueue on `huey`: wake its idle consumers, in this process and in others."""
    huey.doorbell.ring()
    if huey.wake is not None:
        try:
            huey.wake.ring()
        except Exception:  # never fail an enqueue over a wake-up: the poll finds the message
            logging.getLogger(__name__).warning("could not send wake-ups", exc_info=True)


class _DoorbellWorker(Worker):
    """A huey worker that sleeps on its queue's doorbell instead of a blind back-off."""

    def loop(self, now=None):
        bell = self.huey.doorbell
        seen = bell.generation
        try:
            task = self.huey.dequeue()
        except Exception:
            self._logger.exception("Error reading from queue")
            task = None
        if task is not None:
            self.delay = self.default_delay
            try:
                self.huey.execute(task, now)
            except Exception:
                self._logger.exception("Unhandled error during execution of task %s.", task.id)
            return
        if self.huey.storage.blocking or self.stop_flag.is_set():
            return
        if bell.remote:  # every enqueue of this machine rings: no need to poll often
            bell.wait_past(seen, bell.fallback_s)
        elif bell.wait_past(seen, min(self.delay, self.max_delay)):
            self.delay = self.default_delay
        else:
            self.delay = min(self.delay * self.backoff, self.max_delay)


class _ThreadFriendlyConsumer(Consumer):
    """A huey consumer that leaves signal handling to its host process.

    huey installs handlers in `start()`, which only works on the main thread; bmad-loop's CLI
    owns SIGINT/SIGTERM itself (first Ctrl+C = graceful stop, second = now) and stops
    consumers explicitly.
    """

    worker_class = _DoorbellWorker

    def __init__(self, huey, *, role: str, **kwargs):
        self.role = role  # read by _create_process, which huey's __init__ already calls
        super().__init__(huey, **kwargs)

    def _set_signal_handlers(self):
        pass

    def _create_process(self, process, name):
        # huey names every consumer's threads Worker-1, Worker-2 …; the lane's and the story
        # pool's would share names in a thread dump (py-spy dump) of one process.
        return super()._create_process(process, f"bmad-{self.role}-{name}")


class BackgroundConsumer:
    """A real huey consumer with worker threads, started and stopped from code. Its threads are
    named ``bmad-<role>-Worker-<n>`` (and ``bmad-<role>-Scheduler``)."""

    def __init__(self, huey, workers: int, role: str = "queue"):
        logging.getLogger("huey").setLevel(logging.WARNING)
        self.huey = huey
        self.consumer = _ThreadFriendlyConsumer(
            huey,
            role=role,
            workers=workers,
            periodic=False,
            initial_delay=POLL_INITIAL_S,
            backoff=1.15,
            max_delay=POLL_MAX_S,
            worker_type="thread",
            check_worker_health=True,
            health_check_interval=5,
        )
        self._started = False
        self._lock = threading.Lock()
        self._listener = None

    def start(self) -> None:
        with self._lock:
            if not self._started:
                wake = getattr(self.huey, "wake", None)
                if wake is not None:
                    self._listener = wake.listen(self.huey.doorbell.ring)
                self.huey.doorbell.remote = self._listener is not None
                self.consumer.start()
                self._started = True

    def stop(self, graceful: bool = True) -> None:
        with self._lock:
            if self._started:
                self.huey.doorbell.ring()  # idle workers notice the stop at once
                self.consumer.stop(graceful=graceful)
                self._started = False
                if self._listener is not None:
                    self._listener.close()
                    self._listener = None
                    self.huey.doorbell.remote = False
