"""Waking idle consumers at once when a message is queued, instead of after a poll's back-off.

huey's SQLite consumers poll with a growing back-off, so a message enqueued by a sibling thread
(a story that became ready waking the lane, the lane filling a worker slot) would wait up to
the back-off. Every enqueue rings its queue's `Doorbell`; idle `DoorbellWorker`s wait on it.
An enqueue in another process rings it through the queue's wake socket (`wakeup`); without
one, the poll still finds the message within the consumer's maximum delay.
"""

from __future__ import annotations

import threading

from huey.consumer import Worker

__all__ = ["Doorbell", "DoorbellWorker", "WAKE_FALLBACK_S"]

# With a wake socket bound, an idle SQLite consumer is woken by every enqueue of this machine;
# the poll is only the fallback for a wake-up that could not be sent (another TMPDIR, another
# host sharing the file), so it may be slow.
WAKE_FALLBACK_S = 2.0


class Doorbell:
    """Rung on every enqueue of its queue. A generation counter lets a waiter name the ring it
    has already seen, so a ring that comes before the wait begins is not missed."""

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


class DoorbellWorker(Worker):
    """A huey worker whose idle sleep waits on its queue's doorbell.

    huey's own loop dequeues, runs what it got and calls `sleep()` when the queue was empty;
    only the sleep changes here. `seen` is the generation this worker last knew of, taken when
    it starts and when each sleep ends — both before the next `dequeue()` — so a ring that
    arrives while a dequeue is finding the queue empty makes the sleep return at once. (After a
    task ran, `seen` is older than it could be: the next empty dequeue costs one extra look.)
    """

    def __init__(self, huey, *args, **kwargs):
        super().__init__(huey, *args, **kwargs)
        self.seen = huey.doorbell.generation

    def sleep(self):
        bell = self.huey.doorbell
        if self.stop_flag.is_set():
            return
        if bell.remote:  # every enqueue of this machine rings: no need to poll often
            bell.wait_past(self.seen, bell.fallback_s)
        elif bell.wait_past(self.seen, min(self.delay, self.max_delay)):
            self.delay = self.default_delay
        else:
            self.delay = min(self.delay * self.backoff, self.max_delay)
        self.seen = bell.generation
