"""How a lane integrates what is ready: one candidate at a time, or a speculative stack.

Both strategies sit behind one small interface, asked by the lane's pass (tick.py) at step 1
of every pass. A strategy lives for one tick, like the pass that made it; what must outlast a
tick (the verifications running in this process) belongs to the run's `Lane` (lane.py).

The pass offers a strategy exactly this (`LanePass`): `integrator`, `db`, `run_id`, `policy`,
`tasks`, `pause_on_escalation`, `landing(story, action)` (run an integration step; a target
someone else moved pauses the run and gives None), `after_integration(story, outcome)` (the
notifications and the checkpoint pause an outcome calls for) and `may_land(run)`.
"""

from __future__ import annotations

from typing import Protocol

from ...db.models import Run
from ...states import StoryState
from ..runs import next_in_plan

__all__ = ["LaneStrategy", "Sequential"]


class LaneStrategy(Protocol):
    def step(self, run: Run, stories) -> bool:
        """Do the next integration step that is due; whether anything was done."""

    def stop_now(self, reason: str) -> bool:
        """`stop --now`: give up what is being integrated and can still be given up (its
        stories wait as ready); whether anything changed."""


class Sequential:
    """The lane without speculation: the earliest open story in plan order is composed,
    verified and landed, then the next; a finished story waits for every earlier one."""

    def __init__(self, lane_pass):
        self.lane = lane_pass

    def step(self, run: Run, stories) -> bool:
        lane = self.lane
        story = next_in_plan(stories, lane.pause_on_escalation)
        if story is None or story.state not in (StoryState.READY, StoryState.INTEGRATING):
            return False  # the earliest open story is not finished: later ones wait
        outcome = lane.landing(story, lambda: lane.integrator.integrate(story.id))
        if outcome is not None:
            lane.after_integration(story, outcome)
        return True

    def stop_now(self, reason: str) -> bool:
        return False  # one candidate at a time: the story in hand finishes (or is stopped)
