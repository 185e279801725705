"""When the agent cannot work, or the run has spent what it may: pause (or wait), charge nothing.

- `settle_unavailable`: a session ended by an environment fault (rate or usage limit, auth,
  trust, unknown model, network; `agents/faults.py`). Its attempt is closed `interrupted` and
  uncounted with the fault as its reason, and `agent.unavailable` is journaled with the category
  and the CLI's own words. With `[adapter] on_limit = "wait"` and a reset time the CLI printed,
  the worker waits until then (lease renewed, `stop` obeyed) and the caller runs the session
  again; otherwise `PauseRun` is raised: the story goes back to `pending` with its phase and
  work kept, and the run pauses through `retry.pause_for_fault` (exit 3 for `run`).
- `check_budget`: before each agent session, `[limits] max_cost_per_run` (the run's summed
  `cost_usd`) and `max_tokens_per_story` (the story's input + output tokens; cache reads are not
  counted) — crossing either raises `PauseRun`. Raise the limit and `resume --reload-policy`.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from ...agents.faults import AgentFault
from ...db.models import Attempt, Run, utcnow
from ...errors import StopRequested
from ...states import AttemptState, RunState
from ...transient import Fault
from ..journal import EventKind, record
from ..retry import pause_for_fault
from .context import Claim
from ...db.database import Database
from .context import StoryContext

if TYPE_CHECKING:
    from .sessions import SessionResult

__all__ = ["PauseRun", "settle_unavailable", "check_budget", "pause_run", "MAX_WAITS"]

MAX_WAITS = 5  # waits for one session in a row before the run pauses anyway


class PauseRun(Exception):
    """Hand the story back and pause the run, for a reason that is not the story's."""

    def __init__(self, reason: str, kind: str, where: str, words: str):
        super().__init__(reason)
        self.reason = reason
        self.fault = Fault(kind, where, words)


def settle_unavailable(ctx: StoryContext, claim: Claim, result: SessionResult, waited: int, *,
                       now: dt.datetime | None = None) -> None:
    """Close the session's attempt as an uncharged environment fault; wait for its reset when
    the policy says so and the CLI said when (then return), else raise `PauseRun`."""
    assert result.fault is not None  # called for a session an environment fault ended
    fault: AgentFault = result.fault
    cli = ctx.policy.adapter.profile or "agent"
    wait = (ctx.policy.adapter.on_limit == "wait" and fault.reset_at is not None
            and waited < MAX_WAITS)
    with ctx.db.transaction() as s:
        claim.own(s)
        att = s.get_one(Attempt, result.attempt_id)
        for name, value in result.attempt_values().items():
            setattr(att, name, value)
        att.counted = False
        record(s, ctx.run_id, EventKind.ATTEMPT_FINISHED, ctx.key, phase=result.phase,
               attempt=result.number, state=AttemptState.INTERRUPTED, counted=False,
               reason=result.reason)
        record(s, ctx.run_id, EventKind.AGENT_UNAVAILABLE, ctx.key, phase=result.phase,
               attempt=result.number, cli=cli, category=fault.category, words=fault.words,
               reset_at=_iso(fault.reset_at), action="wait" if wait else "pause")
    where = f"{cli} {result.phase} session of {ctx.key}"
    if not wait:
        raise PauseRun(f"agent unavailable ({fault.category}): {fault.words}", fault.category,
                       where, fault.words)
    assert fault.reset_at is not None  # `wait` needs it
    _wait_until(ctx, claim, fault.reset_at)


def _wait_until(ctx: StoryContext, claim: Claim, until: dt.datetime) -> None:
    """Sleep until `until` in short steps (the lease renewed by the heartbeat); a stop ends it."""
    from .sessions import Heartbeat  # sessions imports this module's neighbours: keep it lazy

    with ctx.db.transaction() as s:
        record(s, ctx.run_id, EventKind.AGENT_WAITING, ctx.key, until=_iso(until))
    with Heartbeat(ctx, claim):
        while True:
            remaining = (until - utcnow()).total_seconds()
            if remaining <= 0:
                return
            if claim.stop_event.wait(min(remaining, 1.0)):
                raise StopRequested()
            with ctx.db.transaction() as s:
                if s.get_one(Run, ctx.run_id).state in (RunState.STOPPING, RunState.STOPPED):
                    raise StopRequested()


def check_budget(ctx: StoryContext, claim: Claim) -> None:
    """Raise `PauseRun` when the run's cost or the story's tokens crossed their limit."""
    limits = ctx.policy.limits
    if limits.max_cost_per_run is None and limits.max_tokens_per_story is None:
        return
    with ctx.db.transaction() as s:
        cost = s.scalar(select(func.sum(Attempt.cost_usd)).where(Attempt.run_id == ctx.run_id))
        tokens = s.scalar(select(func.sum(func.coalesce(Attempt.input_tokens, 0)
                                          + func.coalesce(Attempt.output_tokens, 0)))
                          .where(Attempt.story_id == ctx.story_id))
    if limits.max_cost_per_run is not None and (cost or 0) >= limits.max_cost_per_run:
        words = f"the run has cost ${cost:.2f}, [limits] max_cost_per_run is ${limits.max_cost_per_run:.2f}"
        raise PauseRun(f"cost limit reached: {words}", "budget", "[limits] max_cost_per_run", words)
    if limits.max_tokens_per_story is not None and (tokens or 0) >= limits.max_tokens_per_story:
        words = (f"{ctx.key} has used {tokens} tokens (input + output), [limits] "
                 f"max_tokens_per_story is {limits.max_tokens_per_story}")
        raise PauseRun(f"token limit reached: {words}", "budget", "[limits] max_tokens_per_story", words)


def pause_run(db: Database, run_id: str, story: str, exc: PauseRun) -> bool:
    """Pause the run for `exc` with the existing pause machinery (`run.paused` with its fault)."""
    return pause_for_fault(db, run_id, exc.fault, 1, story=story,
                           reason=f"paused: {exc.reason}; `bmad-loop resume` once it is fixed")


def _iso(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if value else None
