"""The huey worker bmad-loop runs: huey's own loop, with an idle sleep that waits on the
queue's doorbell. Its poll is pushed out to an hour, so only a ring can end a sleep in time."""

from __future__ import annotations

import threading

from huey.consumer import Consumer

from bmad_loop.queue.doorbell import DoorbellWorker
from bmad_loop.queue.queues import STORIES, BackgroundConsumer, QueueConfig, announce, make_huey
from support import wait_until

HOUR = 3600.0


def _worker(huey):
    return DoorbellWorker(huey=huey, stop_flag=threading.Event(), default_delay=HOUR,
                          max_delay=HOUR, backoff=1.15)


def _loop_in_thread(worker):
    done = threading.Event()

    def run():
        worker.loop()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_a_message_queued_while_the_worker_dequeues_ends_its_sleep(tmp_path):
    """The enqueue lands just after the dequeue found the queue empty, and rings before the
    worker sleeps: the sleep must return at once, not after its hour."""
    huey = make_huey(QueueConfig(backend="sqlite", sqlite_path=tmp_path / "queue.db"), STORIES)
    ran = []
    task = huey.task(name="probe")(lambda: ran.append(1))
    worker = _worker(huey)
    empty_dequeue = huey.dequeue

    def dequeue_then_enqueue():
        found = empty_dequeue()
        task()  # another thread's enqueue, between this dequeue and the sleep
        announce(huey)
        huey.dequeue = empty_dequeue
        return found

    huey.dequeue = dequeue_then_enqueue
    assert _loop_in_thread(worker).wait(30), "the ring during dequeue was lost"
    assert huey.pending_count() == 1 and ran == []
    worker.loop()  # the next turn runs the message
    assert ran == [1] and huey.pending_count() == 0


def test_an_idle_worker_sleeps_until_rung(tmp_path):
    huey = make_huey(QueueConfig(backend="sqlite", sqlite_path=tmp_path / "queue.db"), STORIES)
    worker = _worker(huey)
    done = _loop_in_thread(worker)
    bell = huey.doorbell
    wait_until(lambda: bell.waiting == 1 or done.is_set(), what="the worker inside its wait")
    assert not done.is_set(), "the worker did not sleep on an empty queue"
    bell.ring()
    assert done.wait(30)
    assert worker.seen == bell.generation  # what the next dequeue is measured against


def test_the_consumer_uses_hueys_loop_with_the_doorbell_worker(tmp_path):
    huey = make_huey(QueueConfig(backend="sqlite", sqlite_path=tmp_path / "queue.db"), STORIES)
    consumer = BackgroundConsumer(huey, workers=1).consumer
    assert isinstance(consumer, Consumer) and consumer.worker_class is DoorbellWorker
    # the loop is huey's: bmad-loop overrides only the sleep
    assert "loop" not in vars(DoorbellWorker) and "sleep" in vars(DoorbellWorker)
