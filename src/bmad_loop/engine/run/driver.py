"""Drive a run in this process: consumers on, progress lines out, until the run settles.

`bmad-loop run` and `bmad-loop resume` use this. A first Ctrl+C asks for a graceful stop
(exit 4 once the run is stopped); a second one stops now: agent sessions are killed, attempts
are marked interrupted, and the command exits 130. Both leave the run resumable. Presses are
counted by `Interrupts`, which the command may install before it enqueues (a Ctrl+C during
start-up then stops the run as soon as it is driven) and which tells it of each press acted on.
"""

from __future__ import annotations

import signal
from typing import Callable

from ...db.models import Run
from ...errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NEEDS_HUMAN,
    EXIT_OK,
    EXIT_STOPPED,
    StateError,
)
from ...states import RUN_SETTLED, RunState, StoryState
from .consumers import ConsumerSet
from .control import stop
from ..journal import event_rows_after
from .presses import Interrupts
from ..runrows import RUN_STATE, stories_of

__all__ = ["drive", "exit_code_for"]


def exit_code_for(run: Run, stories) -> int:
    if run.state == RunState.COMPLETED:
        if all(s.state in (StoryState.INTEGRATED, StoryState.SKIPPED) for s in stories):
            return EXIT_OK
        return EXIT_NEEDS_HUMAN
    return {RunState.FAILED: EXIT_FAILED, RunState.PAUSED: EXIT_NEEDS_HUMAN,
            RunState.STOPPED: EXIT_STOPPED, RunState.ABANDONED: EXIT_FAILED}.get(run.state, EXIT_FAILED)


# How often the journal is read for progress lines when no lane tick wakes the driver.
JOURNAL_POLL_S = 0.5


def drive(project, tasks, run_id: str, *, workers: int, progress: Callable[[object], None] | None,
          notice: Callable[[int], None] | None = None, since_seq: int = 0) -> int:
    """Consumers on in this process until the run settles; `progress` gets each journal event
    after `since_seq` (a resume shows only what happens from the resume on). The journal is
    read after every lane tick (the run settles only in one) and at least every `JOURNAL_POLL_S`, for
    the workers' own progress lines. Ctrl+C is counted by the process's `Interrupts` (the
    command's, installed at its start), else by one installed here; `notice(presses)` is told
    of each press acted on, after its `run.stopping` line."""
    consumers = ConsumerSet(project, queue="all", workers=workers, tasks=tasks)
    interrupts = Interrupts.installed()
    own = interrupts is None
    interrupts = Interrupts() if own else interrupts
    interrupts.notice = notice
    woke = interrupts.woke
    interrupts.driving = True
    consumers.after_each_tick(lambda _run_id: woke.set())
    previous = interrupts.install() if own else None
    _cleanup_at_start(project)
    handled = told = 0
    if interrupts.count:  # pressed during start-up: stopped before any worker can claim a story
        handled, told = _act_on_presses(project, tasks, run_id, interrupts, handled, told)
    consumers.start()
    last_seq = since_seq
    try:
        while True:
            if interrupts.count > handled:
                handled, told = _act_on_presses(project, tasks, run_id, interrupts, handled, told)
            # A poll: it holds up no writer. It runs after every lane tick, beside the story
            # that tick started, so it reads plain rows and nothing it will not show.
            with project.db.read() as s:
                if progress:
                    for event in event_rows_after(s, run_id, last_seq):
                        last_seq = event.seq
                        progress(event)
                    # A printer that groups what one read brought (`cli/progress.py`) prints it.
                    getattr(progress, "flush", lambda: None)()
                state = s.connection().execute(RUN_STATE, {"of_run": run_id}).scalar()
                settled = state in RUN_SETTLED
                if settled:  # one snapshot: every event up to the settling one was shown
                    run, stories = s.get(Run, run_id), stories_of(s, run_id)
            if told < handled and interrupts.notice is not None:  # after its `run.stopping`
                interrupts.notice(handled)
            told = handled
            if settled:
                break
            woke.wait(JOURNAL_POLL_S)
            woke.clear()  # before the next read, so what a tick did before this is in that read
    finally:
        consumers.stop(graceful=True)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if handled >= 2:
        return EXIT_INTERRUPTED
    return exit_code_for(run, stories)


def _act_on_presses(project, tasks, run_id: str, interrupts: Interrupts, handled: int,
                    told: int) -> tuple[int, int]:
    """The first press stops gracefully, the second now; later ones only remind. Returns the
    presses handled and those already told (a stop refused because the run settled meanwhile
    is not told: the loop sees the run settled)."""
    presses = interrupts.count
    if handled == 0 or (handled < 2 <= presses):
        try:
            stop(project, tasks, run_id, now=presses >= 2)
        except StateError:
            return presses, presses
    return presses, told


def _cleanup_at_start(project) -> None:
    """Debris of earlier crashes goes before the run starts; a failure here is only logged."""
    import logging

    from .cleanup import cleanup

    try:
        cleanup(project)
    except Exception:
        logging.getLogger(__name__).exception("clean-up at run start failed")
