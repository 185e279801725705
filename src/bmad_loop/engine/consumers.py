"""Consumers for one project: the `stories` pool and the single-threaded lane, in this process.

Used by `bmad-loop worker` (until interrupted) and by `bmad-loop run` / `resume` (until the run
settles). On start, live runs are re-queued, so a consumer that comes back after a crash picks
up where the dead one stopped. A watchdog thread wakes the lane of live runs periodically, so a
lost message delays work by seconds instead of losing it.
"""

from __future__ import annotations

import datetime as dt
import threading

from sqlalchemy import select

from ..db.models import Run
from ..errors import ConfigError
from ..queue import BackgroundConsumer
from ..tasks import Tasks
from .control import recover_live_runs

__all__ = ["ConsumerSet", "QUEUES"]

QUEUES = ("stories", "integration", "all")


class ConsumerSet:
    def __init__(self, project, *, queue: str = "all", workers: int = 1, tasks: Tasks | None = None):
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
        self._consumers: list[BackgroundConsumer] = []
        self._watchdog_stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    @property
    def runs_lane(self) -> bool:
        return self.queue in ("integration", "all")

    def start(self) -> None:
        project = self.project
        project.db  # migrate once, before any consumer thread touches the database
        ttl = project.policy.leases.ttl_s
        recover_live_runs(project, self.tasks, stale_after=dt.timedelta(seconds=ttl))
        if self.queue in ("stories", "all"):
            self._consumers.append(BackgroundConsumer(self.tasks.stories, self.workers))
        if self.runs_lane:
            self._consumers.append(BackgroundConsumer(self.tasks.integration, 1))
        for consumer in self._consumers:
            consumer.start()
        if self.runs_lane:
            self._watchdog = threading.Thread(target=self._watch, daemon=True, name="bmad-watchdog")
            self._watchdog.start()

    def stop(self, graceful: bool = True) -> None:
        self._watchdog_stop.set()
        for consumer in self._consumers:
            consumer.stop(graceful=graceful)
        self._consumers.clear()
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)

    def _watch(self) -> None:
        interval = max(min(self.project.policy.leases.ttl_s / 3.0, 5.0), 0.5)
        while not self._watchdog_stop.wait(interval):
            try:
                if self.tasks.lane_pending() > 0:
                    continue
                with self.project.db.transaction() as s:
                    ids = list(s.scalars(select(Run.id).where(
                        Run.project == str(self.project.root),
                        Run.state.in_(("running", "pausing", "stopping")))))
                for run_id in ids:
                    self.tasks.enqueue_lane(run_id)
            except Exception:  # the watchdog must outlive a passing database hiccup
                continue
