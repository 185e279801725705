"""Drive a run in this process: consumers on, progress lines out, until the run settles.

`bmad-loop run` and `bmad-loop resume` use this. A first Ctrl+C asks for a graceful stop
(exit 4 once the run is stopped); a second one stops now: agent sessions are killed, attempts
are marked interrupted, and the command exits 130. Both leave the run resumable.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable

from ..db.models import Run
from ..errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NEEDS_HUMAN, EXIT_OK, EXIT_STOPPED
from ..states import RUN_SETTLED, RunState, StoryState
from .consumers import ConsumerSet
from .control import stop
from .journal import event_rows_after
from .runs import RUN_STATE, stories_of

__all__ = ["drive", "exit_code_for"]


def exit_code_for(run: Run, stories) -> int:
    if run.state == RunState.COMPLETED:
        if all(s.state in (StoryState.INTEGRATED, StoryState.SKIPPED) for s in stories):
            return EXIT_OK
        return EXIT_NEEDS_HUMAN
    return {RunState.FAILED: EXIT_FAILED, RunState.PAUSED: EXIT_NEEDS_HUMAN,
            RunState.STOPPED: EXIT_STOPPED, RunState.ABANDONED: EXIT_FAILED}.get(run.state, EXIT_FAILED)


def drive(project, tasks, run_id: str, *, workers: int, progress: Callable[[object], None] | None,
          poll_s: float = 0.5, install_signals: bool = True, since_seq: int = 0) -> int:
    """Consumers on in this process until the run settles; `progress` gets each journal event
    after `since_seq` (a resume shows only what happens from the resume on). The journal is
    read after every lane tick (the run settles only in one) and at least every `poll_s`, for
    the workers' own progress lines."""
    consumers = ConsumerSet(project, queue="all", workers=workers, tasks=tasks)
    interrupts = {"count": 0}
    woke = threading.Event()
    consumers.after_each_tick(lambda _run_id: woke.set())
    previous = None

    def on_sigint(signum, frame):
        interrupts["count"] += 1
        woke.set()

    if install_signals and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, on_sigint)
    _cleanup_at_start(project)
    consumers.start()
    last_seq = since_seq
    handled = 0
    try:
        while True:
            if interrupts["count"] > handled:
                handled = interrupts["count"]
                stop(project, tasks, run_id, now=handled >= 2)
            # A poll: it holds up no writer. It runs after every lane tick, beside the story
            # that tick started, so it reads plain rows and nothing it will not show.
            with project.db.read() as s:
                if progress:
                    for event in event_rows_after(s, run_id, last_seq):
                        last_seq = event.seq
                        progress(event)
                state = s.connection().execute(RUN_STATE, {"of_run": run_id}).scalar()
                settled = state in RUN_SETTLED
                if settled:  # one snapshot: every event up to the settling one was shown
                    run, stories = s.get(Run, run_id), stories_of(s, run_id)
            if settled:
                break
            woke.wait(poll_s)
            woke.clear()  # before the next read, so what a tick did before this is in that read
    finally:
        consumers.stop(graceful=True)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if handled >= 2:
        return EXIT_INTERRUPTED
    return exit_code_for(run, stories)


def _cleanup_at_start(project) -> None:
    """Debris of earlier crashes goes before the run starts; a failure here is only logged."""
    import logging

    from .cleanup import cleanup

    try:
        cleanup(project)
    except Exception:
        logging.getLogger(__name__).exception("clean-up at run start failed")
