"""Consumers for one project: the `stories` pool and the single-threaded lane, in this process.

Used by `bmad-loop worker` (until interrupted) and by `bmad-loop run` / `resume` (until the run
settles). On start, live runs are re-queued, so a consumer that comes back after a crash picks
up where the dead one stopped. A watchdog thread wakes the lane of live runs periodically, so a
lost message delays work by seconds instead of losing it.

The set owns one `Lane` per run (`lane_of`): made on the run's first tick here, dropped after a
tick that finds the run no longer live with no verification of it still running here.

**Driving a run in this process** (`drive`, for `bmad-loop run` and `bmad-loop resume`):
consumers on, progress lines out, until the run settles. A first Ctrl+C asks for a graceful
stop (exit 4 once the run is stopped); a second one stops now: agent sessions are killed,
attempts are marked interrupted, and the command exits 130. Both leave the run resumable.
Presses are counted by `Interrupts` (presses.py), which the command may install before it
enqueues (a Ctrl+C during start-up then stops the run as soon as it is driven) and which tells
it of each press acted on.
"""

from __future__ import annotations

import datetime as dt
import gc
import logging
import threading
import signal
from typing import TYPE_CHECKING, Any, Callable, Iterable

from sqlalchemy import func, select

from ...db.models import Run, Story
from ...errors import (
    ConfigError,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NEEDS_HUMAN,
    EXIT_OK,
    EXIT_STOPPED,
    StateError,
)
from ...queue.queues import BackgroundConsumer
from ...queue.tasks import Tasks
from ...states import RUN_LIVE, RunState, RUN_SETTLED, StoryState
from .. import leases
from ..leases import consumer_lease_name, prune_lapsed
from .control import recover_live_runs, stop
from ..journal import EventKind, event_rows_after, record
from .ownership import refresh_live_runs, save_run
from ..lane.tick import Lane
from ..runrows import RUN_STATE, stories_of
from ..worker.story_task import work
from .presses import Interrupts

if TYPE_CHECKING:
    from ..project import Project

__all__ = ["ConsumerSet", "QUEUES", "story_workers", "drive", "exit_code_for"]


log = logging.getLogger(__name__)

QUEUES = ("stories", "integration", "all")


_heap_frozen = False


def _freeze_startup_heap() -> None:
    """Leave what start-up made (modules, the ORM's mappers, the migration) out of every later
    garbage collection, once per process. Left in, each full collection walks all of it: one
    took 60-160 ms here with the interpreter held, stalling every worker and the lane at once,
    about once every 16-50 stories. What the consumers make afterwards is collected as usual."""
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.freeze()


class ConsumerSet:
    def __init__(self, project: Project, *, queue: str = "all", workers: int = 1,
                 tasks: Tasks | None = None, announce: Callable[[str], None] | None = None):
        """`announce(line)`: told of each story this set takes and finishes (`worker`)."""
        if queue not in QUEUES:
            raise ConfigError(f"--queue: must be one of {', '.join(QUEUES)}, got '{queue}'")
        if workers < 1:
            raise ConfigError(f"-w/--workers: must be >= 1, got {workers}")
        if queue == "integration" and workers > 1:
            raise ConfigError("--queue integration -w N: the integration lane is one thread; use -w 1")
        self.project = project
        self.queue = queue
        self.workers = workers
        self.tasks = tasks or Tasks(project)
        self.announce = announce
        self.tasks.bind(story=self._story_task, lane=self._lane_tick)
        self._after_tick: list[Callable[[str], object]] = []
        self._recorded: dict[str, str] = {}  # run id -> the state its record last said
        self._consumers: list[BackgroundConsumer] = []
        self._lane: BackgroundConsumer | None = None
        self._lane_lock = threading.Lock()
        self._lanes: dict[str, Lane] = {}  # run id -> its lane, while the run is live
        self._lanes_lock = threading.Lock()
        self.holder: leases.LeaseHolder | None = None
        self.beat: leases.LeaseHolder | None = None  # this set's consumer heartbeat (leases.py)
        self._watchdog_stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def after_each_tick(self, callback: Callable[[str], object]) -> None:
        """Call `callback(run_id)` after every lane tick of this process (the driver wakes on it
        to see a settled run at once instead of at its next poll)."""
        self._after_tick.append(callback)

    def _story_task(self, run_id: str, story_id: int) -> None:
        announce = self.announce
        if announce is None:
            work(self.project, self.tasks, run_id, story_id)
            return
        taken: list[str] = []

        def took(run: str, key: str) -> None:
            taken.append(key)
            announce(f"took {key} (run {run})")
        try:
            work(self.project, self.tasks, run_id, story_id, on_claim=took)
        finally:
            if taken:
                announce(f"finished {taken[0]} (run {run_id}): {self._story_outcome(story_id)}")

    def _story_outcome(self, story_id: int) -> str:
        try:
            with self.project.db.read() as s:
                story = s.get_one(Story, story_id)
                return story.state + (f" ({story.reason})" if story.reason else "")
        except Exception:  # the line is for a person: a database hiccup must not fail the task
            return "state unknown"

    def lane_of(self, run_id: str) -> Lane:
        """The run's lane in this process, made on first use."""
        with self._lanes_lock:
            lane = self._lanes.get(run_id)
            if lane is None:
                lane = self._lanes[run_id] = Lane(self.project, self.tasks, run_id)
            return lane

    def kept_lane(self, run_id: str) -> Lane | None:
        """The run's lane if this set keeps one now (None: not made yet, or dropped)."""
        with self._lanes_lock:
            return self._lanes.get(run_id)

    def _lane_tick(self, run_id: str) -> None:
        lane = self.lane_of(run_id)
        try:
            lane.tick(holder=self.holder)
        finally:
            state = self._record_transition(run_id)
            if state not in RUN_LIVE and not lane.busy():
                self._drop_lane(run_id, lane)
            for callback in self._after_tick:
                callback(run_id)

    def _drop_lane(self, run_id: str, lane: Lane) -> None:
        """The run settled (or is gone) and nothing of it runs here: its lane goes. A later
        tick (a `resume`, a late wake-up) makes a fresh one."""
        with self._lanes_lock:
            if self._lanes.get(run_id) is lane:
                del self._lanes[run_id]

    def _record_transition(self, run_id: str) -> str | None:
        """Rewrite the run's record in the repository when a tick moved its state; the run's
        state (None: gone; `running` when a database hiccup hid it, so the lane is kept)."""
        try:
            with self.project.db.read() as s:
                state = s.scalar(RUN_STATE, {"of_run": run_id})  # one narrow read per tick
                if state is None or self._recorded.get(run_id) == state:
                    return state
                run = s.get_one(Run, run_id)
            save_run(self.project, run)
            self._recorded[run_id] = run.state
            return run.state
        except Exception:  # the record is a courtesy to other databases: never fail the lane
            log.warning("run %s: could not refresh its record", run_id, exc_info=True)
            return RunState.RUNNING  # unknown: keep the lane (a later tick decides)

    def _refresh_records(self) -> None:
        refresh_live_runs(self.project)

    @property
    def runs_lane(self) -> bool:
        return self.queue in ("integration", "all")

    def start(self) -> None:
        project = self.project
        project.db  # migrate once, before any consumer thread touches the database
        _freeze_startup_heap()
        ttl = project.policy.leases.ttl_s
        owner = leases.owner_id(self.queue)
        prune_lapsed(project.db, project.key)
        self.beat = leases.LeaseHolder(project.db, consumer_lease_name(project.key, owner), owner, ttl)
        self.beat.start()
        if self.queue in ("stories", "all"):
            consumer = BackgroundConsumer(self.tasks.stories, self.workers, role="stories")
            self._consumers.append(consumer)
            consumer.start()
        if self.runs_lane:
            # One lane per project: hold the lease first, consume only while holding it.
            self.holder = leases.LeaseHolder(project.db, project.lane_lease_name,
                                             leases.owner_id("lane"), ttl,
                                             on_acquired=self._lane_acquired,
                                             on_lost=self._lane_lost)
            self.holder.on_renewed = self._refresh_records
            self.holder.start()
            self._watchdog = threading.Thread(target=self._watch, daemon=True, name="bmad-watchdog")
            self._watchdog.start()
        if self.holder is None or not self.holder.held:
            # (A lane that took the lease at once has just re-queued them: `_lane_acquired`.)
            recover_live_runs(project, self.tasks, stale_after=dt.timedelta(seconds=ttl))

    @property
    def is_standby(self) -> bool:
        return self.holder is not None and not self.holder.held

    def _lane_acquired(self, token: int) -> None:
        assert self.holder is not None  # it calls this
        self._journal_live_runs(EventKind.LANE_ACQUIRED, token=token, owner=self.holder.owner)
        with self._lane_lock:
            if self._lane is None:
                self._lane = BackgroundConsumer(self.tasks.integration, 1, role="lane")
                self._lane.start()
        recover_live_runs(self.project, self.tasks,
                          stale_after=dt.timedelta(seconds=self.project.policy.leases.ttl_s))

    def _journal_live_runs(self, kind: EventKind, **data: Any) -> None:
        with self.project.db.transaction() as s:
            for run_id in s.scalars(select(Run.id).where(
                    Run.project == self.project.key,
                    Run.state.in_(RUN_LIVE))):
                record(s, run_id, kind, **data)

    def _lane_lost(self) -> None:
        # Fenced: stop taking ticks at once; a tick in hand is refused at its CAS.
        with self._lane_lock:
            lane, self._lane = self._lane, None
        if lane is not None:
            threading.Thread(target=lane.stop, kwargs={"graceful": True}, daemon=True).start()

    def stop(self, graceful: bool = True) -> None:
        self._watchdog_stop.set()
        for consumer in self._consumers:
            consumer.stop(graceful=graceful)
        self._consumers.clear()
        with self._lane_lock:
            lane, self._lane = self._lane, None
        if lane is not None:
            lane.stop(graceful=graceful)
        if self.holder is not None:
            self.holder.stop(release_lease=True)
        if self.beat is not None:
            self.beat.stop(release_lease=True)
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)

    def _watch(self) -> None:
        interval = max(min(self.project.policy.leases.ttl_s / 3.0, 5.0), 0.5)
        while not self._watchdog_stop.wait(interval):
            try:
                if self.is_standby or self.tasks.lane_pending() > 0:
                    continue
                with self.project.db.transaction() as s:
                    ids = list(s.scalars(select(Run.id).where(
                        Run.project == self.project.key,
                        Run.state.in_(RUN_LIVE))))
                for run_id in ids:
                    self.tasks.enqueue_lane(run_id)
            except Exception:  # the watchdog must outlive a passing database hiccup
                log.warning("watchdog: could not wake the lanes; retrying", exc_info=True)


def story_workers(project: Project, queue: str) -> int:
    """How many story consumer threads `bmad-loop worker` starts without `-w`: as many as the
    widest of the project's live runs, each sized by its own snapshot (the `runs` row); before
    any run exists (or once none is live), `[scm] max_parallel` of the policy, which is what
    the next run is planned with. The lane alone needs one."""
    if queue == "integration":
        return 1
    with project.db.read() as s:
        widest = s.scalar(select(func.max(Run.max_parallel)).where(
            Run.project == project.key, Run.state.in_(RUN_LIVE)))
    return widest or project.policy.scm.max_parallel


def exit_code_for(run: Run, stories: Iterable[Story]) -> int:
    if run.state == RunState.COMPLETED:
        if all(s.state in (StoryState.INTEGRATED, StoryState.SKIPPED) for s in stories):
            return EXIT_OK
        return EXIT_NEEDS_HUMAN
    codes: dict[str, int] = {RunState.FAILED: EXIT_FAILED, RunState.PAUSED: EXIT_NEEDS_HUMAN,
                             RunState.STOPPED: EXIT_STOPPED, RunState.ABANDONED: EXIT_FAILED}
    return codes.get(run.state, EXIT_FAILED)


# How often the journal is read for progress lines when no lane tick wakes the driver.
JOURNAL_POLL_S = 0.5


def drive(project: Project, tasks: Tasks, run_id: str, *, workers: int,
          progress: Callable[[Any], None] | None,
          notice: Callable[[int], None] | None = None, since_seq: int = 0) -> int:
    """Consumers on in this process until the run settles; `progress` gets each journal event
    after `since_seq` (a resume shows only what happens from the resume on). The journal is
    read after every lane tick (the run settles only in one) and at least every `JOURNAL_POLL_S`, for
    the workers' own progress lines. Ctrl+C is counted by the process's `Interrupts` (the
    command's, installed at its start), else by one installed here; `notice(presses)` is told
    of each press acted on, after its `run.stopping` line."""
    consumers = ConsumerSet(project, queue="all", workers=workers, tasks=tasks)
    installed = Interrupts.installed()
    own = installed is None
    interrupts = Interrupts() if installed is None else installed
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
                    run, stories = s.get_one(Run, run_id), stories_of(s, run_id)
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


def _act_on_presses(project: Project, tasks: Tasks, run_id: str, interrupts: Interrupts,
                    handled: int,
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


def _cleanup_at_start(project: Project) -> None:
    """Debris of earlier crashes goes before the run starts; a failure here is only logged."""
    import logging

    from .cleanup import cleanup

    try:
        cleanup(project)
    except Exception:
        logging.getLogger(__name__).exception("clean-up at run start failed")
