"""This state database's runs in a checkout other databases may drive too (runrecords.py).

A run is *own* when this database holds its rows (for this project); every other run whose refs
or worktrees are in bmad-loop's namespaces is *foreign*, recorded or not. The records say which
database a foreign run belongs to, so a person can be told, and whether it is still live.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

from sqlalchemy import select

from ...db.database import database_id, database_label
from ...db.models import Run, utcnow
from ...errors import StateError
from ...states import RUN_LIVE, RunState
from .runrecords import LIVE_FACTOR, RunRecord, read_records, records_lock, write_record
from ..runs import run_policy

__all__ = ["record_run", "save_run", "refresh_live_runs", "TargetCheck", "target_check",
           "Owners", "owners"]

log = logging.getLogger(__name__)


def record_run(project, run: Run, now=None) -> RunRecord:
    """The record of one of this database's runs, as it stands in `run`'s row."""
    try:
        ttl = run_policy(run).leases.ttl_s
    except Exception:  # a snapshot that no longer validates: the default ttl
        ttl = 60.0
    return RunRecord(database_id=database_id(project.db), database=database_label(project.database_url),
                     run=run.id, target=run.target_branch, state=run.state,
                     heartbeat_at=now or utcnow(), ttl_s=float(ttl), host=project.host)


def save_run(project, run: Run) -> None:
    """Rewrite the run's record at a transition. A failure is logged, not raised: the record
    only protects against another database, and the run must not stop over it."""
    try:
        write_record(project.git(), record_run(project, run))
    except Exception:
        log.warning("run %s: could not write its record in the repository", run.id, exc_info=True)


def refresh_live_runs(project) -> None:
    """The lane's heartbeat: every live run of this project and database gets a fresh one."""
    with project.db.read() as s:
        runs = list(s.scalars(select(Run).where(Run.project == project.key, Run.state.in_(RUN_LIVE))))
    for run in runs:
        save_run(project, run)


@dataclass
class TargetCheck:
    """What another database's records say about a target: warnings (stale runs, unreadable
    files) for the person; a live foreign run has already been refused."""

    warnings: list[str] = field(default_factory=list)


@contextlib.contextmanager
def target_check(project, target: str, now=None):
    """Hold the records lock while the caller creates or resumes a run on `target`: a live
    record of another database for it is refused (exit 2), a stale one warned about. The
    caller writes its own record (`write_record`) before leaving, so two databases racing to
    start runs on one target are decided one after the other."""
    git = project.git()
    with records_lock(git):
        records, unreadable = read_records(git)
        mine = _mine(project) if any(r.target == target for r in records.values()) else None
        now = now or utcnow()
        check = TargetCheck(warnings=list(unreadable))
        for record in records.values():
            if record.database_id == mine or record.target != target:
                continue
            if record.state == RunState.PAUSED:
                raise StateError(f"{record.describe(now)}: a paused run of another state database "
                                 f"holds this target until it is resumed or abandoned there "
                                 f"(`bmad-loop abandon {record.run}` with that database), or "
                                 f"`bmad-loop cleanup --forget-database {record.database_id}` "
                                 "if that database is gone")
            if record.live(now):
                raise StateError(f"{record.describe(now)}: another state database is driving this "
                                 f"target; stop that run there, or wait until its heartbeat is "
                                 f"{int(LIVE_FACTOR * record.ttl_s)} s old")
            if record.state in RUN_LIVE:  # its driver died: no heartbeat for 3 x ttl_s
                check.warnings.append(f"{record.describe(now)} (stale: no heartbeat for over "
                                      f"{int(LIVE_FACTOR * record.ttl_s)} s, so whatever drove "
                                      f"it is gone; going ahead); its refs are kept. `bmad-loop "
                                      f"cleanup --forget-database {record.database_id}` forgets "
                                      "a database that is gone")
        yield check


def _mine(project) -> str | None:
    """This database's id; None while it does not exist yet (no record can be its own, and
    a command refused here must not create it)."""
    if not project.policy.database.url and not (project.home_state_dir / "state.db").exists():
        return None
    return database_id(project.db)


@dataclass
class Owners:
    """Who owns each run id found in bmad-loop's namespaces."""

    own: set[str]
    records: dict[str, RunRecord]
    mine: str | None

    def is_own(self, run_id: str) -> bool:
        return run_id in self.own

    def label(self, run_id: str) -> str:
        record = self.records.get(run_id)
        if record is None:
            return "no record (made before run records, or by another tool)"
        if record.database_id == self.mine:
            return f"this database's record, but no rows here ({record.database})"
        return f"{record.database} (id {record.database_id})"


def owners(project, has_rows: bool = True) -> tuple[Owners, list[str]]:
    """Own runs (rows of this database and project) and the records; plus unreadable files."""
    records, unreadable = read_records(project.git())
    if not has_rows:
        return Owners(set(), records, None), unreadable
    with project.db.read() as s:
        own = set(s.scalars(select(Run.id).where(Run.project == project.key)))
    return Owners(own, records, database_id(project.db)), unreadable
