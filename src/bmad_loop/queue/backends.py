"""Where the two queues live: one class per kind of storage, chosen by `[queue] backend`.

A back-end knows three things: where a project's queues are (`config_for`), whether they can
work before anything is queued (`check`), and how to build the huey instance of one queue
(`build`). The kinds are named once, by the policy's `QueueBackendKind`; `BACKENDS` holds one
back-end per member and is the one place a kind is chosen. A new kind of storage is a member
there and one class here (tests/test_backends.py fails on a kind with no class).
"""

from __future__ import annotations

import hashlib
import sqlite3
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from huey import Huey, RedisHuey, SqliteHuey
from huey.storage import SqliteStorage

from ..errors import ConfigError
from ..policy import Policy
from ..policy.choices import QueueBackendKind

__all__ = ["QueueConfig", "QueueProject", "QueueBackend", "SqliteBackend", "RedisBackend",
           "BACKENDS", "backend_of"]

# Redis consumers wait in BRPOP; this bounds how long a stop waits for one to notice.
REDIS_READ_TIMEOUT_S = 1


@dataclass(frozen=True)
class QueueConfig:
    backend: QueueBackendKind
    url: str = ""
    sqlite_path: Path | None = None
    prefix: str = "bmad-loop"
    extra: dict[str, object] = field(default_factory=dict)


class QueueProject(Protocol):
    """What the queues need of a project: its policy, its folders and its identity."""

    @property
    def policy(self) -> Policy: ...

    @property
    def home(self) -> Path: ...

    @property
    def home_state_dir(self) -> Path: ...

    @property
    def key(self) -> str: ...


class QueueBackend(ABC):
    kind: ClassVar[QueueBackendKind]

    @abstractmethod
    def config_for(self, project: QueueProject) -> QueueConfig:
        """Where `project`'s queues live."""

    @abstractmethod
    def check(self, config: QueueConfig, source: str) -> None:
        """Refuse, in one line naming `source`, queues that cannot work; change nothing."""

    @abstractmethod
    def build(self, config: QueueConfig, name: str) -> Huey:
        """The huey instance named `name`."""


class _QueueStorage(SqliteStorage):
    """huey's SQLite storage, committing without an fsync (WAL, `synchronous = NORMAL`).

    A message is only a wake-up: one lost to a power cut is re-queued from the state database
    on resume (recovery re-queues every non-terminal row), and WAL with NORMAL cannot corrupt
    the file. huey's default (FULL) syncs the log on every enqueue and dequeue."""

    def _create_connection(self) -> sqlite3.Connection:
        conn = super()._create_connection()
        conn.execute("pragma synchronous = NORMAL")
        return conn


class _SqliteQueue(SqliteHuey):
    storage_class = _QueueStorage


class SqliteBackend(QueueBackend):
    """The embedded default: huey's SQLite storage in the policy folder's `.bmad-loop/queue.db`,
    apart from the state database so the two never contend for one lock. Its consumers poll
    (huey's SQLite storage cannot block), with the back-off set in `queues`."""

    kind = QueueBackendKind.SQLITE

    def config_for(self, project: QueueProject) -> QueueConfig:
        url = project.policy.queue.url
        if not url:
            return QueueConfig(backend=self.kind, sqlite_path=project.home_state_dir / "queue.db")
        path = project.home / url
        return QueueConfig(backend=self.kind, sqlite_path=path)

    def check(self, config: QueueConfig, source: str) -> None:
        from ..db.sqlitefile import check_sqlite_file

        assert config.sqlite_path is not None  # config_for always names the file
        check_sqlite_file(config.sqlite_path, "queue database")

    def build(self, config: QueueConfig, name: str) -> Huey:
        assert config.sqlite_path is not None
        config.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
        return _SqliteQueue(name=f"{config.prefix}-{name}", filename=str(config.sqlite_path),
                            results=False, utc=True, timeout=30)


class RedisBackend(QueueBackend):
    """A Redis server shared by several hosts. Consumers block in BRPOP, so a message is taken
    as soon as it is pushed. Several projects (and test runs) share one server, so the queue names carry a
    short hash of the project's identity (`Project.key`: the root's path in local mode, the
    remote's URL in remote mode — the same identity as `runs.project` and the lane lease)."""

    kind = QueueBackendKind.REDIS

    def config_for(self, project: QueueProject) -> QueueConfig:
        digest = hashlib.sha1(project.key.encode("utf-8")).hexdigest()[:10]
        return QueueConfig(backend=self.kind, url=project.policy.queue.url,
                           prefix=f"bmad-loop-{digest}")

    def check(self, config: QueueConfig, source: str) -> None:
        try:
            import redis
        except ImportError as exc:
            raise ConfigError(f'{source}: [queue] backend = "redis" needs the redis module '
                              f"({exc}): install bmad-loop[redis]") from None
        try:  # one round trip, so a server that is down is refused before any row is written
            client = redis.Redis.from_url(config.url, socket_connect_timeout=5, socket_timeout=5)
            try:
                client.ping()
            finally:
                client.close()
        except redis.RedisError as exc:
            shown = config.url.split("@", 1)[-1]  # a password stays out of the message
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"{source}: [queue] url: cannot reach redis at {shown}: {reason}") from None

    def build(self, config: QueueConfig, name: str) -> Huey:
        return RedisHuey(name=f"{config.prefix}-{name}", url=config.url, results=False, utc=True,
                         blocking=True, read_timeout=REDIS_READ_TIMEOUT_S)


BACKENDS: dict[QueueBackendKind, QueueBackend] = {
    b.kind: b for b in (SqliteBackend(), RedisBackend())}


def backend_of(kind: str) -> QueueBackend:
    """The back-end of `kind` (a `QueueBackendKind` member or its string)."""
    return BACKENDS[QueueBackendKind(kind)]
