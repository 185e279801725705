"""The two huey queues and their consumers.

`stories` carries story work (a pool of N consumer threads); `integration` carries lane ticks
(exactly one thread: the lane is the coordinator and the only writer of the target branch).
A message is only a wake-up holding row ids: the task bodies live in `bmad_loop.tasks`, which
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
from huey.consumer import Consumer, Worker

__all__ = ["QueueConfig", "make_huey", "BackgroundConsumer", "Doorbell", "STORIES", "INTEGRATION"]

STORIES = "stories"
INTEGRATION = "integration"

# SQLite consumers poll; a short maximum back-off keeps dispatch latency well under a second.
POLL_INITIAL_S = 0.05
POLL_MAX_S = 0.5


@dataclass(frozen=True)
class QueueConfig:
    backend: str  # sqlite | redis
    url: str = ""
    sqlite_path: Path | None = None
    prefix: str = "bmad-loop"
    extra: dict = field(default_factory=dict)


class Doorbell:
    """Rung on every enqueue made in this process; idle workers of the same queue wait on it.

    huey's SQLite consumers poll with a back-off, so a message enqueued by a sibling thread (a
    story that became ready waking the lane, the lane filling a worker slot) would wait up to
    the back-off. With the doorbell they start at once; messages from other processes are still
    found by the poll, within `POLL_MAX_S`. A generation counter read *before* each dequeue means
    a ring between an empty dequeue and the wait is never missed.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self.generation = 0

    def ring(self) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def wait_past(self, seen: int, timeout: float) -> bool:
        """Wait until rung after `seen`, or `timeout` seconds; True when rung."""
        with self._cond:
            return self._cond.wait_for(lambda: self.generation != seen, timeout)


def make_huey(config: QueueConfig, queue: str):
    """A huey instance for one queue, with its doorbell. `results=False`: the state lives in
    the database."""
    name = f"{config.prefix}-{queue}"
    if config.backend == "redis":
        huey = RedisHuey(name=name, url=config.url, results=False, utc=True)
    else:
        config.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
        huey = SqliteHuey(name=name, filename=str(config.sqlite_path), results=False, utc=True,
                          timeout=30)
    huey.doorbell = Doorbell()
    return huey


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
        if bell.wait_past(seen, min(self.delay, self.max_delay)):
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

    def _set_signal_handlers(self):
        pass


class BackgroundConsumer:
    """A real huey consumer with worker threads, started and stopped from code."""

    def __init__(self, huey, workers: int):
        logging.getLogger("huey").setLevel(logging.WARNING)
        self.huey = huey
        self.consumer = _ThreadFriendlyConsumer(
            huey,
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

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self.consumer.start()
                self._started = True

    def stop(self, graceful: bool = True) -> None:
        with self._lock:
            if self._started:
                self.huey.doorbell.ring()  # idle workers notice the stop at once
                self.consumer.stop(graceful=graceful)
                self._started = False
