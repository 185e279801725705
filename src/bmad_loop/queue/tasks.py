"""The huey tasks, by stable name. Messages carry row ids only; bodies re-read the rows.

Task names are part of the on-disk contract: a queued message names its task, so renaming
one strands the messages already queued. Keep them.
"""

from __future__ import annotations

import hashlib
import threading

from ..errors import ConfigError
from .queues import INTEGRATION, STORIES, QueueConfig, announce, make_huey

__all__ = ["Tasks", "check_queue", "queue_config", "STORY_TASK", "LANE_TASK"]

STORY_TASK = "bmad_loop.story"
LANE_TASK = "bmad_loop.lane"


def queue_config(project) -> QueueConfig:
    """Where this project's two queues live.

    On Redis several projects (and test runs) share one server, so the queue names carry a
    short hash of the project's identity (`Project.key`: the root's path in local mode, the
    remote's URL in remote mode — the same identity as `runs.project` and the lane lease):
    `bmad-loop-<hash>-stories`. SQLite queues live in the policy folder's
    `.bmad-loop/queue.db` and keep the plain names (queued messages stay readable).
    """
    q = project.policy.queue
    if q.backend == "redis":
        digest = hashlib.sha1(project.key.encode("utf-8")).hexdigest()[:10]
        return QueueConfig(backend="redis", url=q.url, prefix=f"bmad-loop-{digest}")
    state = project.home_state_dir
    path = state / "queue.db" if not q.url else project.home / q.url
    return QueueConfig(backend="sqlite", sqlite_path=path)


def check_queue(config: QueueConfig, source: str) -> None:
    """Refuse, in one line, a queue that cannot work: redis without its module, or a queue.db
    that is not a whole SQLite database (left untouched)."""
    if config.backend == "redis":
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
            raise ConfigError(f"{source}: [queue] url: cannot reach redis at {shown}: "
                              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        return
    from ..db.sqlitefile import check_sqlite_file

    check_sqlite_file(config.sqlite_path, "queue database")


class Tasks:
    """One project's two queues. Enqueuing needs nothing more; consuming needs `bind()`.

    The task bodies (the story worker and the lane tick) are bound by whoever builds the
    consumers (engine.consumers), so this module depends on no engine code and a process that
    only enqueues never loads it.
    """

    def __init__(self, project):
        self.project = project
        self._config = queue_config(project)
        # Checked now, made on first use: a command refused before it queues anything (bad
        # input, an unknown run) leaves no queue.db behind, and a queue that cannot work (a
        # damaged queue.db, no redis module) is refused before any row is written.
        check_queue(self._config, project.policy.source)
        self._hueys = None
        self._build_lock = threading.Lock()
        self._story_body = None
        self._lane_body = None

    def _built(self):
        with self._build_lock:
            if self._hueys is None:
                stories = make_huey(self._config, STORIES)
                integration = make_huey(self._config, INTEGRATION)
                self._story = stories.task(name=STORY_TASK)(self._run_story)
                self._lane = integration.task(name=LANE_TASK)(self._run_lane)
                self._hueys = (stories, integration)
            return self._hueys

    @property
    def stories(self):
        return self._built()[0]

    @property
    def integration(self):
        return self._built()[1]

    def bind(self, *, story, lane) -> None:
        """What a message does in this process: `story(run_id, story_id)`, `lane(run_id)`."""
        self._story_body, self._lane_body = story, lane

    def enqueue_story(self, run_id: str, story_id: int) -> None:
        stories, _ = self._built()
        self._story(run_id, story_id)
        announce(stories)  # an idle consumer, here or in another process, starts it at once

    def enqueue_lane(self, run_id: str) -> None:
        _, integration = self._built()
        self._lane(run_id)
        announce(integration)

    def lane_pending(self) -> int:
        return self.integration.pending_count()

    def _run_story(self, run_id: str, story_id: int) -> None:
        if self._story_body is None:
            raise RuntimeError("story task consumed by a Tasks that was never bound")
        self._story_body(run_id, story_id)

    def _run_lane(self, run_id: str) -> None:
        if self._lane_body is None:
            raise RuntimeError("lane task consumed by a Tasks that was never bound")
        self._lane_body(run_id)
