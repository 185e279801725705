"""Bounded retries of a step that failed for a transient reason, then a pause that names it.

Used by the lane tick and the story worker: a step is re-entrant (it resumes from the rows),
so running it again after a lock was released or space was freed finishes it. When the fault
outlasts the back-off, the run pauses with the fault in its reason (exit 3); `resume` goes on
once the cause is gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..db.models import Run
from ..states import STORY_IN_FLIGHT, RunState
from ..transient import Fault, transient_fault
from .journal import EventKind, record
from .runrows import stories_of
from .transitions import transition_run
from ..db.database import Database

__all__ = ["retrying", "pause_for_fault", "FaultPersisted", "BACKOFF_S"]

log = logging.getLogger(__name__)

# Waits between tries: a fault that outlasts them (about 3.5 s) pauses the run. Git lock waits
# inside each try are longer ([scm] lock_wait_s).
BACKOFF_S = (0.5, 1.0, 2.0)

_T = TypeVar("_T")


def retrying(step: Callable[[], _T], *, db: Database, run_id: str, story: str | None, what: str,
             sleep: Callable[[float], None] = time.sleep) -> _T:
    """Run `step()`; on a transient fault, journal it and run it again after a back-off.
    Returns step's result; raises `FaultPersisted` (carrying the fault) when it keeps failing.
    Any other exception propagates at once."""
    for attempt, delay in enumerate((*BACKOFF_S, None), start=1):
        try:
            return step()
        except Exception as exc:
            fault = transient_fault(exc)
            if fault is None:
                raise
            log.warning("%s: transient fault (try %d): %s", what, attempt, fault.describe())
            _journal(db, run_id, story, EventKind.FAULT_RETRY, what=what, attempt=attempt,
                     category=fault.kind, where=fault.where, error=fault.message)
            if delay is None:
                raise FaultPersisted(fault, attempts=attempt) from exc
            sleep(delay)
    raise AssertionError("unreachable: the last try returns or raises")


class FaultPersisted(Exception):
    def __init__(self, fault: Fault, attempts: int) -> None:
        super().__init__(fault.describe())
        self.fault, self.attempts = fault, attempts


def pause_for_fault(db: Database, run_id: str, fault: Fault, attempts: int, *,
                    story: str | None = None,
                    reason: str | None = None) -> bool:
    """Park the run with the fault as its reason: `pausing` while stories are still in flight
    (they finish their step, then the lane settles it), else `paused` (a stopping run: stopped).
    False when the run was not live any more, or the database itself refused (the fault may be
    its disk; the run stays live and the next tick tries again)."""
    reason = reason or f"paused after {attempts} tries: {fault.describe()}; `bmad-loop resume` once it is fixed"
    fault_data = {"kind": fault.kind, "where": fault.where, "error": fault.message}
    try:
        with db.transaction() as s:
            run = s.get(Run, run_id)
            if run is None:  # logged below, and nothing is paused
                raise LookupError(f"run {run_id} is not in the database")
            state = run.state
            busy = any(st.state in STORY_IN_FLIGHT for st in stories_of(s, run_id))
            if state == RunState.STOPPING:
                target = RunState.STOPPING if busy else RunState.STOPPED
            else:
                target = RunState.PAUSING if busy else RunState.PAUSED
            moved = transition_run(s, run_id, (state,), state=target, reason=reason)
            if moved:
                record(s, run_id, EventKind(f"run.{target}"), story, reason=reason, fault=fault_data)
            return moved
    except Exception:
        log.exception("could not pause run %s for %s", run_id, fault.describe())
        return False


def _journal(db: Database, run_id: str, story: str | None, event: EventKind,
             **data: Any) -> None:
    try:
        with db.transaction() as s:
            record(s, run_id, event, story, **data)
    except Exception:  # the fault may be the database's own disk: the log still says it
        log.warning("could not journal %s for run %s", event, run_id, exc_info=True)
