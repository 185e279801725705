"""Which state database owns each run, recorded in the repository itself.

A checkout can be driven from two state databases (a run on PostgreSQL, another on the SQLite
default in a shell without `BMAD_LOOP_DATABASE_URL`). Neither database sees the other's rows,
so each run leaves one small JSON record in the git common dir, under bmad-loop's own folder
``<git-common-dir>/bmad-loop-runs/<run id>.json``: the database's id and label (its URL
without the password), the run, its target branch, its state and a heartbeat. It is written
before the run's first ref (at enqueue), again at each of the run's transitions, and its
heartbeat is refreshed with the lane's lease.

What a record decides: `run` / `enqueue` / `resume` refuse while another database's record for
the same target is live (`RunRecord.live`) or paused (a paused run beats no heart: it waits for
a person, and holds its target until it is resumed or abandoned, as it does in its own
database), and only warn about a stale one (a live state, no heartbeat: its driver died); `cleanup` keeps a
run's refs and worktrees unless this database holds the run's rows. A record that cannot be read
(damaged, planted, half-written by hand) counts as no record: the refs it would describe stay
foreign, so the worst a bad file can do is keep things or refuse a run, never delete work.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ...db.models import utcnow
from ...states import RUN_LIVE, RunState

__all__ = ["RECORDS_DIRNAME", "RunRecord", "records_dir", "read_records", "write_record",
           "remove_record", "records_lock", "LIVE_FACTOR", "MAX_TTL_S"]

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

    def to_json(self) -> dict:
        data = asdict(self)
        data["heartbeat_at"] = self.heartbeat_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return data

    @classmethod
    def from_json(cls, data) -> "RunRecord":
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


def records_dir(git) -> Path:
    return git.common_dir() / RECORDS_DIRNAME


def read_records(git) -> tuple[dict[str, RunRecord], list[str]]:
    """{run id: its record} and a line for each file that is not a readable record (those
    count as no record). Reading creates nothing."""
    folder = records_dir(git)
    records, unreadable = {}, []
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


def write_record(git, record: RunRecord) -> None:
    """Atomically (a temporary file renamed over the old): a reader sees the old or the new."""
    folder = records_dir(git)
    folder.mkdir(exist_ok=True)
    final = folder / f"{record.run}.json"
    temp = folder / f".{record.run}.{os.getpid()}.tmp"
    temp.write_text(json.dumps(record.to_json(), sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temp, final)


def remove_record(git, run_id: str) -> bool:
    try:
        (records_dir(git) / f"{run_id}.json").unlink()
        return True
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def records_lock(git):
    """Serialise check-then-write of the records across processes and databases (two runs
    racing to enqueue on one target). A lock on the git common dir itself: taking it writes
    nothing, so a command refused under it leaves no file behind."""
    fd = os.open(git.common_dir(), os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
