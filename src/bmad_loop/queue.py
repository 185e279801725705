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
from huey.consumer import Consumer

__all__ = ["QueueConfig", "make_huey", "BackgroundConsumer", "STORIES", "INTEGRATION"]

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


def make_huey(config: QueueConfig, queue: str):
    """A huey instance for one queue. `results=False`: the state lives in the database."""
    name = f"{config.prefix}-{queue}"
    if config.backend == "redis":
        return RedisHuey(name=name, url=config.url, results=False, utc=True)
    config.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    return SqliteHuey(name=name, filename=str(config.sqlite_path), results=False, utc=True,
                      timeout=30)


class _ThreadFriendlyConsumer(Consumer):
    """A huey consumer that leaves signal handling to its host process.

    huey installs handlers in `start()`, which only works on the main thread; bmad-loop's CLI
    owns SIGINT/SIGTERM itself (first Ctrl+C = graceful stop, second = now) and stops
    consumers explicitly.
    """

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
                self.consumer.stop(graceful=graceful)
                self._started = False
