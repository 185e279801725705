"""This state database's runs in a checkout other databases may drive too, and the run records
in the repository that say which database owns each run.

A run is *own* when this database holds its rows (for this project); every other run whose refs
or worktrees are in bmad-loop's namespaces is *foreign*, recorded or not. The records say which
database a foreign run belongs to, so a person can be told, and whether it is still live.

**Run records.** A checkout can be driven from two state databases (a run on PostgreSQL,
another on the SQLite default in a shell without `BMAD_LOOP_DATABASE_URL`). Neither database
sees the other's rows, so each run leaves one small JSON record in the git common dir, under
bmad-loop's own folder ``<git-common-dir>/bmad-loop-runs/<run id>.json``: the database's id and
label (its URL without the password), the run, its target branch, its state and a heartbeat.
It is written before the run's first ref (at enqueue), again at each of the run's transitions,
and its heartbeat is refreshed with the lane's lease.

What a record decides: `run` / `enqueue` / `resume` refuse while another database's record for
the same target is live (`RunRecord.live`) or paused (a paused run beats no heart: it waits for
a person, and holds its target until it is resumed or abandoned, as it does in its own
database), and only warn about a stale one (a live state, no heartbeat: its driver died);
`cleanup` keeps a run's refs and worktrees unless this database holds the run's rows. A record
that cannot be read (damaged, planted, half-written by hand) counts as no record: the refs it
would describe stay foreign, so the worst a bad file can do is keep things or refuse a run,
never delete work.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field, asdict
import datetime as dt
import fcntl
import json
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from sqlalchemy import select

from ...db.database import database_id, database_label
from ...db.models import Run, utcnow
from ...errors import StateError
from ...states import RUN_LIVE, RunState
from ..runrows import run_policy
from ...git.runner import Git

if TYPE_CHECKING:
    from ..project import Project

__all__ = ["record_run", "save_run", "refresh_live_runs", "TargetCheck", "target_check", "Owners",
           "owners", "RECORDS_DIRNAME", "RunRecord", "records_dir", "read_records", "write_record",
           "remove_record", "records_lock", "LIVE_FACTOR", "MAX_TTL_S"]


log = logging.getLogger(__name__)


def record_run(project: Project, run: Run, now: dt.datetime | None = None) -> RunRecord:
    """The record of one of this database's runs, as it stands in `run`'s row."""
    ttl: float
    try:
        ttl = run_policy(run).leases.ttl_s
    except Exception:  # a snapshot that no longer validates: the default ttl
        ttl = 60.0
    return RunRecord(database_id=database_id(project.db), database=database_label(project.database_url),
                     run=run.id, target=run.target_branch, state=run.state,
                     heartbeat_at=now or utcnow(), ttl_s=float(ttl), host=project.host)


def save_run(project: Project, run: Run) -> None:
    """Rewrite the run's record at a transition. A failure is logged, not raised: the record
    only protects against another database, and the run must not stop over it."""
    try:
        write_record(project.git(), record_run(project, run))
    except Exception:
        log.warning("run %s: could not write its record in the repository", run.id, exc_info=True)


def refresh_live_runs(project: Project) -> None:
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
def target_check(project: Project, target: str,
                 now: dt.datetime | None = None) -> Iterator[TargetCheck]:
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


def _mine(project: Project) -> str | None:
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


def owners(project: Project, has_rows: bool = True) -> tuple[Owners, list[str]]:
    """Own runs (rows of this database and project) and the records; plus unreadable files."""
    records, unreadable = read_records(project.git())
    if not has_rows:
        return Owners(set(), records, None), unreadable
    with project.db.read() as s:
        own = set(s.scalars(select(Run.id).where(Run.project == project.key)))
    return Owners(own, records, database_id(project.db)), unreadable


RECORDS_DIRNAME = "bmad-loop-runs"
LIVE_FACTOR = 3  # a record is live while its heartbeat is younger than 3 × its ttl_s
MAX_TTL_S = 86_400.0  # a larger ttl_s is not believed (a planted record would never go stale)
MAX_RECORD_BYTES = 4096  # a record is ~300 bytes; a planted giant is not read into memory
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True)
class RunRecord:
    database_id: str
    database: str  # the database's URL without its password
    run: str
    target: str
    state: str
    heartbeat_at: dt.datetime
    ttl_s: float
    host: str

    def age_s(self, now: dt.datetime) -> float:
        return (now - self.heartbeat_at).total_seconds()

    def live(self, now: dt.datetime | None = None) -> bool:
        """A live state and a heartbeat younger than 3 × ttl_s. A heartbeat as far in the
        future (a skewed clock, a planted file) is not believed either: stale."""
        age = self.age_s(now or utcnow())
        return self.state in RUN_LIVE and abs(age) < LIVE_FACTOR * self.ttl_s

    def describe(self, now: dt.datetime | None = None) -> str:
        age = self.age_s(now or utcnow())
        since = (f"since {_ago(age)}" if self.state == RunState.PAUSED
                 else f"last heartbeat {_ago(age)}")
        return (f"run {self.run} of the state database {self.database} (id {self.database_id}) "
                f"is {self.state} on {self.target}, {since} from host {self.host}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["heartbeat_at"] = self.heartbeat_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return data

    @classmethod
    def from_json(cls, data: Any) -> "RunRecord":
        """Refuses (ValueError) anything not shaped exactly as `to_json` writes it."""
        if not isinstance(data, dict) or set(data) != set(cls.__dataclass_fields__):
            raise ValueError("not a run record")
        texts = {k: data[k] for k in ("database_id", "database", "run", "target", "state", "host")}
        if not all(isinstance(v, str) and v for v in texts.values()) or not _RUN_ID.match(data["run"]):
            raise ValueError("a field is not a non-empty string")
        ttl = data["ttl_s"]
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= MAX_TTL_S \
                or not math.isfinite(ttl):
            raise ValueError(f"ttl_s must be a number in (0, {MAX_TTL_S:g}]")
        beat = dt.datetime.strptime(data["heartbeat_at"], "%Y-%m-%dT%H:%M:%S.%fZ")
        return cls(**texts, ttl_s=float(ttl), heartbeat_at=beat.replace(tzinfo=dt.timezone.utc))


def _ago(age_s: float) -> str:
    return f"{int(age_s)} s ago" if age_s >= 0 else f"{int(-age_s)} s in the future"


def records_dir(git: Git) -> Path:
    return git.common_dir() / RECORDS_DIRNAME


def read_records(git: Git) -> tuple[dict[str, RunRecord], list[str]]:
    """{run id: its record} and a line for each file that is not a readable record (those
    count as no record). Reading creates nothing."""
    folder = records_dir(git)
    records: dict[str, RunRecord] = {}
    unreadable: list[str] = []
    if not folder.is_dir():
        return records, unreadable
    for path in sorted(folder.glob("*.json")):
        try:
            if path.is_symlink() or not path.is_file():  # a FIFO would block the read
                raise ValueError("not a regular file")
            if path.stat().st_size > MAX_RECORD_BYTES:
                raise ValueError(f"larger than {MAX_RECORD_BYTES} bytes")
            record = RunRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
            if path.stem != record.run:
                raise ValueError(f"names run {record.run}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            unreadable.append(f"{path}: not a run record ({exc}); ignored")
            continue
        records[record.run] = record
    return records, unreadable


def write_record(git: Git, record: RunRecord) -> None:
    """Atomically (a temporary file renamed over the old): a reader sees the old or the new."""
    folder = records_dir(git)
    folder.mkdir(exist_ok=True)
    final = folder / f"{record.run}.json"
    temp = folder / f".{record.run}.{os.getpid()}.tmp"
    temp.write_text(json.dumps(record.to_json(), sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temp, final)


def remove_record(git: Git, run_id: str) -> bool:
    try:
        (records_dir(git) / f"{run_id}.json").unlink()
        return True
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def records_lock(git: Git) -> Iterator[None]:
    """Serialise check-then-write of the records across processes and databases (two runs
    racing to enqueue on one target). A lock on the git common dir itself: taking it writes
    nothing, so a command refused under it leaves no file behind."""
    fd = os.open(git.common_dir(), os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
