"""The lane of one run: the object the consumer set keeps while the run is live.

A `Lane` outlives its ticks. It holds what the lane learns about its run across them — the
conflict relation, the target's board as last read, the rows as last read and their admission
views, the wait reasons already written — and the candidate verifications its threads run
(speculation.py). Each tick (`Lane.tick`) makes one `LanePass` (tick.py) with a fresh reading
of the run's policy, and the pass asks a `LaneStrategy` (tick.py) to integrate: `Sequential`
or the speculative `Stack`.

The consumer set (`engine/run/consumers.py`) makes a run's lane on its first tick and drops it
once the run is no longer live and no verification of it runs here. A caller without a consumer
set (a test, a one-off) ticks a throw-away lane with `tick_once`.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import Session

from ...db.models import Run, utcnow
from ...states import RUN_LIVE, RunState
from ..journal import record
from ..notify import notify
from ..retry import FaultPersisted, pause_for_fault, retrying
from ..runrows import lane_rows, run_policy
from ..transitions import transition_run
from ..workspace.pool import drain_run_pool
from .admission import ConflictIndex, StoryView, views_of
from .integrate import LaneFenced
from .tick import integrated_rows
from .speculation import Verifications
from .tick import LanePass
from ...policy import Policy

__all__ = ["Lane", "LaneMemo", "tick_once"]

log = logging.getLogger(__name__)


class LaneMemo:
    """What the lane keeps across the ticks of its run, read and written by its passes."""

    def __init__(self):
        self.lock = threading.Lock()  # one lane thread, but a test may also tick by hand
        self.index = ConflictIndex()
        self.board_done: tuple[str, frozenset[str]] | None = None  # (target sha, done keys)
        self.rows: dict = {}  # the run's stories' rows as last read, by id (runs.lane_rows)
        self.reasons_written: dict[int, tuple[int, str]] = {}  # id -> (rev, reason) written
        self._views: dict = {}  # (story id, stacking) -> (row, its admission view, rules)

    def views_of(self, rows, stacking: bool = False, settled=None) -> list[StoryView]:
        """`admission.views_of`, made once per row: a row kept across passes (the same object
        while its `rev` stands) keeps its view, so a pass over a long sprint does not rebuild
        hundreds of them. A row read again, or made for the pass, is a new object: a new view."""
        views, kept = [], self._views
        for row in rows:
            hit = kept.get((row.id, stacking))
            if hit is None or hit[0] is not row or hit[2] != settled:  # rules compare by value
                hit = kept[row.id, stacking] = (row, views_of((row,), stacking, settled)[0], settled)
            views.append(hit[1])
        if len(kept) > 2 * len(rows) + 64:  # stories that left the run: not kept forever
            current = {row.id for row in rows}
            for key in [key for key in kept if key[0] not in current]:
                del kept[key]
        return views


class Lane:
    """The lane of run `run_id` in this process."""

    def __init__(self, project, tasks, run_id: str):
        self.project = project
        self.tasks = tasks
        self.run_id = run_id
        self.memo = LaneMemo()
        self.verifications = Verifications()  # the stack's, running in this process

    def busy(self) -> bool:
        """Does a verification of this run still run here (it wakes the lane when it ends)?"""
        return self.verifications.any()

    def tick(self, holder=None) -> None:
        """One tick. `holder` is this lane's lease holder (None: unfenced, as in a
        single-process test); a standby or a fenced holder changes nothing."""
        db = self.project.db
        if holder is not None and not holder.held:
            return  # a standby lane never acts; the active one has this run
        with db.read() as s:  # the run, and the first pass's rows with it: one read
            run = s.get(Run, self.run_id)
            if run is None or run.state not in RUN_LIVE:
                return
            policy = run_policy(run)
            fenced = holder is not None and not holder.still_holds(s)
            first = [] if fenced else [self.first_rows(s, run)]
        if fenced:
            # It thinks it holds the lease, but another lane took over: fenced, change nothing.
            with db.transaction() as s:
                record(s, self.run_id, "lane.fenced", reason="lost the lane lease (it expired or "
                       "another lane took it over); this tick changes nothing", owner=holder.owner)
            return
        try:
            def one_try():  # a retry reads everything again
                LanePass(self, run, policy, holder).loop(first.pop() if first else None)

            retrying(one_try, db=db, run_id=self.run_id, story=None, what="lane tick")
        except FaultPersisted as exc:
            if pause_for_fault(db, self.run_id, exc.fault, exc.attempts):
                notify(db, policy, self.run_id, "run.paused", reason=exc.fault.describe())
        except LaneFenced as exc:
            log.warning("%s", exc)
            with db.transaction() as s:
                record(s, self.run_id, "lane.fenced", reason=str(exc))
        except Exception as exc:  # no retry can fix it: failed, and `resume` once it is fixed
            self._fail(policy, exc)

    def first_rows(self, s: Session, run: Run) -> tuple:
        """What a tick's first pass reads, in one snapshot: the rows for the check against git
        (tick.py), the run, and the lane's rows of its stories."""
        return integrated_rows(s, run.id), (run, lane_rows(s, run.id, self.memo.rows))

    def _fail(self, policy: Policy, exc: Exception) -> None:
        log.exception("lane tick failed for run %s", self.run_id)
        db = self.project.db
        with db.transaction() as s:
            if transition_run(s, self.run_id, RUN_LIVE, state=RunState.FAILED,
                              reason=f"lane error: {exc}", ended_at=utcnow()):
                record(s, self.run_id, "run.failed", reason=f"lane error: {exc}")
        drain_run_pool(self.project, self.run_id, policy)  # parked worktrees go when the run settles
        notify(db, policy, self.run_id, "run.failed", reason=str(exc))


def tick_once(project, tasks, run_id: str, holder=None) -> None:
    """One tick of a lane made for it (nothing kept across ticks): for callers without a
    consumer set. Speculation needs a kept `Lane`: this one forgets its verifications."""
    Lane(project, tasks, run_id).tick(holder)
