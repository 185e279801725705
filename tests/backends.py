"""Back-end fixtures: a fresh PostgreSQL database and a private Redis namespace per test.

The contract tests in `test_backends.py` run once per back-end (`BACKENDS`): the embedded
default (SQLite files in `tmp_path`) and the scale-out pair (huey's Redis storage plus a
PostgreSQL database). Each test gets resources nobody else sees, so the suite runs in parallel
under xdist:

- PostgreSQL: `CREATE DATABASE bmad_<random>` on the local server, dropped `WITH (FORCE)` after
  the test (a consumer thread that still holds a connection cannot keep it alive).
- Redis: a queue-name prefix of its own per test; every key huey made under it is deleted after.
  Projects get their prefix from their root path (`bmad_loop.queue.tasks.queue_config`), and every
  test's project lives under its own `tmp_path`, so two tests never share a queue either.

A service that is not running skips the test on a developer's machine and *fails* it in CI
(`CI=true`), so a broken CI service is never mistaken for a green run. Where the services live
can be changed with `BMAD_TEST_POSTGRES_URL` (an admin URL: a database the test user may
`CREATE DATABASE` from) and `BMAD_TEST_REDIS_URL`; the names deliberately avoid the
`BMAD_LOOP_` prefix, which the policy reads and the test HOME fixture clears.

conftest.py registers this module as a plugin, so every test module can ask for the fixtures
by name; outside a fixture, `fresh_postgres_database()` gives the same database as a context
manager.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support import CI

__all__ = [
    "BACKENDS",
    "CI",
    "REDIS_URL",
    "Backend",
    "RedisNamespace",
    "backend",
    "fresh_postgres_database",
    "postgres_admin_url",
    "postgres_url",
    "redis_namespace",
    "redis_server",
    "service_missing",
]

BACKENDS = ["sqlite", "redis+postgres"]
# The marker lets `-m "not scaleout"` leave the services out (pyproject registers it).
BACKEND_PARAMS = ["sqlite", pytest.param("redis+postgres", marks=pytest.mark.scaleout)]
REDIS_URL = os.environ.get("BMAD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_ADMIN_CANDIDATES = tuple(filter(None, (
    os.environ.get("BMAD_TEST_POSTGRES_URL"),
    "postgresql+psycopg://root@127.0.0.1:5432/postgres",
    "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
)))


def service_missing(what: str, error: BaseException):
    """Skip on a developer's machine, fail in CI: a missing service must never look green."""
    if CI:
        raise error
    pytest.skip(f"{what} is not available here ({type(error).__name__}: {error}); "
                "in CI (CI=true) this is a failure")


# --- PostgreSQL ----------------------------------------------------------------------------


def _admin_engine(url: str):
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    return create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool,
                         connect_args={"connect_timeout": 5})


def find_postgres_admin_url() -> str:
    """The first admin URL that connects (users root, then postgres); skips (fails in CI)."""
    from sqlalchemy import text

    last: BaseException | None = None
    for url in PG_ADMIN_CANDIDATES:
        engine = _admin_engine(url)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return url
        except Exception as exc:  # the driver's OperationalError: refused, no such role, ...
            last = exc
        finally:
            engine.dispose()
    service_missing("PostgreSQL on " + ", ".join(PG_ADMIN_CANDIDATES), last or RuntimeError("no URL"))


@contextlib.contextmanager
def fresh_postgres_database(admin_url: str | None = None):
    """A brand-new, empty PostgreSQL database (its URL) for one test; dropped (FORCE) after."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    admin_url = admin_url or find_postgres_admin_url()
    name = f"bmad_{uuid.uuid4().hex[:16]}"
    admin = _admin_engine(admin_url)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        try:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        finally:
            admin.dispose()


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """The admin URL, found once per xdist worker."""
    return find_postgres_admin_url()


@pytest.fixture
def postgres_url(postgres_admin_url) -> str:
    """A brand-new, empty PostgreSQL database for this test only; dropped (FORCE) afterwards."""
    with fresh_postgres_database(postgres_admin_url) as url:
        yield url


# --- Redis ---------------------------------------------------------------------------------


@dataclass
class RedisNamespace:
    """One test's share of the Redis server: queue prefixes whose keys are deleted after it."""

    url: str
    prefix: str
    _prefixes: list[str] = field(default_factory=list)

    def __post_init__(self):
        self._prefixes.append(self.prefix)

    def queue_config(self):
        from bmad_loop.queue.queues import QueueConfig

        return QueueConfig(backend="redis", url=self.url, prefix=self.prefix)

    def adopt(self, prefix: str) -> str:
        """Also clean up after another prefix (a project's own, derived from its root path)."""
        self._prefixes.append(prefix)
        return prefix

    def keys(self) -> list[bytes]:
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            found: list[bytes] = []
            for prefix in self._prefixes:
                clean = re.sub("[^A-Za-z0-9_]", "", prefix)  # how huey spells a queue name
                found.extend(client.scan_iter(match=f"huey.*.{clean}*", count=1000))
            return found
        finally:
            client.close()

    def delete_all(self) -> None:
        import redis

        keys = self.keys()
        if keys:
            client = redis.Redis.from_url(self.url)
            try:
                client.delete(*keys)
            finally:
                client.close()


@pytest.fixture(scope="session")
def redis_server() -> str:
    """The Redis URL, checked once per xdist worker with a PING."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5)
    try:
        client.ping()
    except Exception as exc:  # redis.ConnectionError and friends
        service_missing(f"Redis at {REDIS_URL}", exc)
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def redis_namespace(redis_server) -> RedisNamespace:
    """A queue prefix no other test uses (xdist runs tests at once on one Redis server)."""
    space = RedisNamespace(url=redis_server, prefix=f"bmadtest-{uuid.uuid4().hex[:12]}")
    try:
        yield space
    finally:
        space.delete_all()


# --- the parametrized back-end -------------------------------------------------------------


@dataclass
class Backend:
    """Where one contract test keeps its rows and its queues."""

    name: str  # "sqlite" | "redis+postgres"
    database_url: str
    tmp: Path
    redis: RedisNamespace | None = None

    @property
    def is_sqlite(self) -> bool:
        return self.name == "sqlite"

    def queue_config(self):
        from bmad_loop.queue.queues import QueueConfig

        if self.redis is not None:
            return self.redis.queue_config()
        return QueueConfig(backend="sqlite", sqlite_path=self.tmp / "queue.db",
                           prefix=f"bmadtest-{uuid.uuid4().hex[:8]}")

    def database(self, lock_dir: Path | None = None):
        from bmad_loop.db.database import Database

        return Database(self.database_url, lock_dir=lock_dir or self.tmp)

    def policy_toml(self) -> str:
        """The [queue] and [database] sections a project on this back-end needs (none: defaults)."""
        if self.redis is None:
            return ""
        return (f'[queue]\nbackend = "redis"\nurl = "{self.redis.url}"\n'
                f'[database]\nurl = "{self.database_url}"\n')

    def environment(self) -> dict[str, str]:
        """The same settings as `BMAD_LOOP_<SECTION>_<KEY>` variables, as containers get them."""
        if self.redis is None:
            return {}
        return {"BMAD_LOOP_QUEUE_BACKEND": "redis", "BMAD_LOOP_QUEUE_URL": self.redis.url,
                "BMAD_LOOP_DATABASE_URL": self.database_url}

    def adopt_project(self, root: Path) -> None:
        """Clean up the project's own Redis queues (named after its root) after the test."""
        if self.redis is not None:
            from bmad_loop.engine.project import Project
            from bmad_loop.queue.tasks import queue_config

            self.redis.adopt(queue_config(Project.open(root)).prefix)


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request, tmp_path) -> Backend:
    """The same contract test on the embedded default and on Redis + PostgreSQL."""
    if request.param == "sqlite":
        return Backend("sqlite", f"sqlite:///{tmp_path / 'state.db'}", tmp_path)
    postgres = request.getfixturevalue("postgres_url")
    redis_space = request.getfixturevalue("redis_namespace")
    return Backend("redis+postgres", postgres, tmp_path, redis_space)
