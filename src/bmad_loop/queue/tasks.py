"""The huey tasks, by stable name. Messages carry row ids only; bodies re-read the rows.

Task names are part of the on-disk contract: a queued message names its task, so renaming
one strands the messages already queued. Keep them.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from huey import Huey

from .backends import QueueConfig, QueueProject, backend_of
from .queues import INTEGRATION, STORIES, make_huey

__all__ = ["Tasks", "check_queue", "queue_config", "STORY_TASK", "LANE_TASK"]

STORY_TASK = "bmad_loop.story"
LANE_TASK = "bmad_loop.lane"


def queue_config(project: QueueProject) -> QueueConfig:
    """Where this project's two queues live (see the back-ends in `backends`)."""
    return backend_of(project.policy.queue.backend).config_for(project)


def check_queue(config: QueueConfig, source: str) -> None:
    """Refuse, in one line, a queue that cannot work (redis without its module or its server, a
    queue.db that is not a whole SQLite database), leaving it untouched."""
    backend_of(config.backend).check(config, source)


class Tasks:
    """One project's two queues. Enqueuing needs nothing more; consuming needs `bind()`.

    The task bodies (the story worker and the lane tick) are bound by whoever builds the
    consumers (engine.consumers), so this module depends on no engine code and a process that
    only enqueues never loads it.
    """

    def __init__(self, project: QueueProject):
        self.project = project
        self._config = queue_config(project)
        # Checked now, made on first use: a command refused before it queues anything (bad
        # input, an unknown run) leaves no queue.db behind, and a queue that cannot work (a
        # damaged queue.db, no redis module) is refused before any row is written.
        check_queue(self._config, project.policy.source)
        self._hueys: tuple[Huey, Huey] | None = None
        self._build_lock = threading.Lock()
        self._story_body: Callable[[str, int], None] | None = None
        self._lane_body: Callable[[str], None] | None = None
        self._story: Any = None  # huey's task objects, made with the hueys
        self._lane: Any = None

    def _built(self) -> tuple[Huey, Huey]:
        with self._build_lock:
            if self._hueys is None:
                stories = make_huey(self._config, STORIES)
                integration = make_huey(self._config, INTEGRATION)
                self._story = stories.task(name=STORY_TASK)(self._run_story)
                self._lane = integration.task(name=LANE_TASK)(self._run_lane)
                self._hueys = (stories, integration)
            return self._hueys

    @property
    def stories(self) -> Huey:
        return self._built()[0]

    @property
    def integration(self) -> Huey:
        return self._built()[1]

    def bind(self, *, story: Callable[[str, int], None], lane: Callable[[str], None]) -> None:
        """What a message does in this process: `story(run_id, story_id)`, `lane(run_id)`."""
        self._story_body, self._lane_body = story, lane

    def enqueue_story(self, run_id: str, story_id: int) -> None:
        self._built()  # the task objects exist once both hueys do
        self._story(run_id, story_id)

    def enqueue_lane(self, run_id: str) -> None:
        self._built()
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
