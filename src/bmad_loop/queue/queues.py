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
from typing import Any

from huey import Huey
from huey.consumer import Consumer

from .backends import QueueConfig, backend_of

__all__ = ["QueueConfig", "make_huey", "BackgroundConsumer", "STORIES", "INTEGRATION"]

STORIES = "stories"
INTEGRATION = "integration"

# huey's SQLite consumers poll with a growing back-off, which bounds how long a message waits
# for an idle consumer. At N = 1 each story passes three messages (to its worker, to the lane,
# the lane's next dispatch): polling from 50 ms up to 0.5 s cost up to 48 % more overhead per
# story than the doorbell it replaced (bench/overhead.py pairs). The ceiling sets what an idle
# consumer costs (50 ms: about 1.3 % of one core for an idle `worker -w 4`, 20 ms: 2.6 %); the
# start sets how soon the message that usually follows a task is seen (the lane's dispatch
# after the story it integrated), at no idle cost (docs/performance.md, "The consolidation").
POLL_INITIAL_S = 0.005
POLL_MAX_S = 0.05


def make_huey(config: QueueConfig, queue: str) -> Huey:
    """A huey instance for one queue. `results=False`: the state lives in the database."""
    return backend_of(config.backend).build(config, queue)


class _ThreadFriendlyConsumer(Consumer):
    """A huey consumer that leaves signal handling to its host process.

    huey installs handlers in `start()`, which only works on the main thread; bmad-loop's CLI
    owns SIGINT/SIGTERM itself (first Ctrl+C = graceful stop, second = now) and stops
    consumers explicitly.
    """

    def __init__(self, huey: Huey, *, role: str, **kwargs: Any):
        self.role = role  # read by _create_process, which huey's __init__ already calls
        super().__init__(huey, **kwargs)

    def _set_signal_handlers(self) -> None:
        pass

    def _create_process(self, process: Any, name: str) -> Any:
        # huey names every consumer's threads Worker-1, Worker-2 …; the lane's and the story
        # pool's would share names in a thread dump (py-spy dump) of one process.
        return super()._create_process(process, f"bmad-{self.role}-{name}")


class BackgroundConsumer:
    """A real huey consumer with worker threads, started and stopped from code. Its threads are
    named ``bmad-<role>-Worker-<n>`` (and ``bmad-<role>-Scheduler``)."""

    def __init__(self, huey: Huey, workers: int, role: str = "queue"):
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

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self.consumer.start()
                self._started = True

    def stop(self, graceful: bool = True) -> None:
        """Stop the workers; an idle one waits on huey's stop flag, so it notices at once."""
        with self._lock:
            if self._started:
                self.consumer.stop(graceful=graceful)
                self._started = False
