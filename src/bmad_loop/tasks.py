"""The huey tasks, by stable name. Messages carry row ids only; bodies re-read the rows.

Task names are part of the on-disk contract: a queued message names its task, so renaming
one strands the messages already queued. Keep them.
"""

from __future__ import annotations

import hashlib

from .queue import INTEGRATION, STORIES, QueueConfig, make_huey

__all__ = ["Tasks", "queue_config", "STORY_TASK", "LANE_TASK"]

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


class Tasks:
    """One project's two queues. Enqueuing needs nothing more; consuming needs `bind()`.

    The task bodies (the story worker and the lane tick) are bound by whoever builds the
    consumers (engine.consumers), so this module depends on no engine code and a process that
    only enqueues never loads it.
    """

    def __init__(self, project):
        self.project = project
        config = queue_config(project)
        self.stories = make_huey(config, STORIES)
        self.integration = make_huey(config, INTEGRATION)
        self._story = self.stories.task(name=STORY_TASK)(self._run_story)
        self._lane = self.integration.task(name=LANE_TASK)(self._run_lane)
        self._story_body = None
        self._lane_body = None

    def bind(self, *, story, lane) -> None:
        """What a message does in this process: `story(run_id, story_id)`, `lane(run_id)`."""
        self._story_body, self._lane_body = story, lane

    def enqueue_story(self, run_id: str, story_id: int) -> None:
        self._story(run_id, story_id)

    def enqueue_lane(self, run_id: str) -> None:
        self._lane(run_id)

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
