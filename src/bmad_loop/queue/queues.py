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

from huey.consumer import Consumer

from .backends import QueueConfig, backend_of
from .doorbell import Doorbell, DoorbellWorker

__all__ = ["QueueConfig", "make_huey", "announce", "BackgroundConsumer", "Doorbell", "STORIES",
           "INTEGRATION"]

STORIES = "stories"
INTEGRATION = "integration"

# SQLite consumers that cannot be woken across processes (no AF_UNIX datagrams) poll; a short
# maximum back-off keeps their dispatch latency well under a second.
POLL_INITIAL_S = 0.05
POLL_MAX_S = 0.5


def make_huey(config: QueueConfig, queue: str):
    """A huey instance for one queue, with its doorbell and, on SQLite, its cross-process wake
    channel (`huey.wake`; None on Redis, whose consumers block in BRPOP). `results=False`: the
    state lives in the database."""
    huey, wake = backend_of(config.backend).build(config, queue)
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


class _ThreadFriendlyConsumer(Consumer):
    """A huey consumer that leaves signal handling to its host process.

    huey installs handlers in `start()`, which only works on the main thread; bmad-loop's CLI
    owns SIGINT/SIGTERM itself (first Ctrl+C = graceful stop, second = now) and stops
    consumers explicitly.
    """

    worker_class = DoorbellWorker

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
