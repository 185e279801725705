"""The lane of one run, and its ticks: `Lane.tick` is the body of every `integration` task.

A `Lane` outlives its ticks: the consumer set (engine/run/consumers.py) keeps it while the run is
live. It holds what the lane learns about its run across them — the conflict relation, the
target's board as last read, the rows as last read and their admission views, the wait reasons
already written — and the candidate verifications its threads run (speculation.py). Each tick
makes one `LanePass` with a fresh reading of the run's policy, and the pass asks a
`LaneStrategy` to integrate: `Sequential` or the speculative `Stack`. The consumer set makes a
run's lane on its first tick and drops it once the run is no longer live and no verification of
it runs here. A caller without a consumer set (a test, a one-off) ticks a throw-away lane with
`tick_once`.

A tick's `LanePass` re-reads the rows and does whatever is due, in this order, until nothing is:

0. at `max_parallel > 1`, fill free worker slots first (see 3), so a slot freed while the lane
   integrates a batch of finished stories does not stay empty for the whole batch;
1. integrate finished stories strictly in plan order, by the run's `LaneStrategy` (`Sequential`,
   or the speculative `Stack` of speculation.py; a finished story waits for every earlier one to
   be integrated or terminal; under `on_escalation = "pause"` an escalated story stops the
   scan, so later finished stories wait as `ready`);
2. turn an escalation into `pausing` (stop dispatching; running siblings finish their story);
3. admit pending stories into free worker slots (see admission.py), and write on the rows what
   holds each of the others back;
4. settle the run: pausing/stopping with nothing in flight becomes paused/stopped; all stories
   terminal becomes completed; a run that cannot move without a human pauses and says why.

Ticks are idempotent: a duplicate or late tick finds nothing to do.

**The rows against git.** The lane's first look at each tick: a story the rows call integrated
must have its commit on the target (an agent may have edited the state database). Only what
changed is looked at: integrations are in plan order, each on top of the last, so the latest
one stands for all; it costs a git call only when it is not where the lane itself last advanced
the target. A row marked integrated without a commit contradicts git whatever the target is.

**Strategies.** Both sit behind `LaneStrategy`, asked by the pass at step 1. A strategy lives
for one tick, like the pass that made it; what must outlast a tick (the verifications running
in this process) belongs to the run's `Lane`. The pass offers a strategy exactly
this: `integrator`, `db`, `run_id`, `policy`, `tasks`, `pause_on_escalation`,
`landing(story, action)` (run an integration step; a target someone else moved pauses the run
and gives None), `after_integration(story, outcome)` (the notifications and the checkpoint
pause an outcome calls for) and `may_land(run)`.

**Wait reasons.** What holds each pending story back is written on its row, and a change is
journaled (`story.waiting`) once: one UPDATE per distinct reason, built once (as the lane's
reads). A pass may admit twice on the same rows (fill free slots first, then dispatch): `told`
(story id -> (row rev, reason) the lane already wrote) keeps the second from journaling the
same wait again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from sqlalchemy import Row, Select, Table, bindparam, func, or_, select, update
from sqlalchemy.orm import Session

from ...db.models import Run, Story, utcnow
from ...git.config_guard import CONFIG_CHANGED_PREFIX
from ...bmad.footprint import tree_directories
from ...states import (
    RUN_LIVE,
    STORY_AWAITING_LANE,
    STORY_IN_FLIGHT,
    STORY_PARKED,
    RunState,
    StopMode,
    StoryState,
)
from .admission import ConflictIndex, admit, StoryView, views_of
from .blame import RED_PREFIX, Blame, TargetRed
from .integrate import Integrator, TargetMoved, LaneFenced
from ..journal import EventKind, record
from ..notify import notify
from ..recovery import recover_orphans
from .stacking import own_paths, restack_stale, stacked_bases
from .speculation import Stack, speculating, Verifications
from ..runrows import LaneRow, StoryRow, lane_rows, next_in_plan, stories_of, run_policy
from ..transitions import transition_run, transition_story
from ..workspace.pool import drain_pool, drain_run_pool
from .writeback import board_done_keys
from ...git.runner import Git
from ...policy import Policy
from ...git.targets import Target
from ..retry import FaultPersisted, pause_for_fault, retrying
from ..leases import LeaseHolder
from ...git.trees.settle import MergeRules

if TYPE_CHECKING:
    from ...queue.tasks import Tasks
    from ..project import Project

__all__ = ["LanePass", "LaneStrategy", "Sequential", "integrated_rows", "rows_contradicting_git",
           "write_wait_reasons", "reasons_told", "Lane", "LaneMemo", "tick_once"]


log = logging.getLogger(__name__)

FOREIGN_MOVE_PREFIX = "target moved by someone else"

_T = TypeVar("_T")

# An integrated story as `integrated_rows` reads it: (key, integrated_sha, seq).
IntegratedRow = Row[str, str | None, int]
# `integrated_rows`: (the latest integrated story, those integrated without a commit).
Integrated = tuple[IntegratedRow | None, list[IntegratedRow]]
# What a tick's first pass reads (`Lane.first_rows`): the integrated rows, the run, its rows.
FirstRows = tuple[Integrated, tuple[Run, list[LaneRow]]]

class LanePass:
    """One tick's work for the run of `lane` (a `Lane`): its passes, until nothing is due.
    What a `LaneStrategy` may use of it is listed in the module's docstring."""

    def __init__(self, lane: Lane, run: Run, policy: Policy,
                 holder: LeaseHolder | None = None) -> None:
        self.project = lane.project
        self.tasks = lane.tasks
        self.db = lane.project.db
        self.run_id = run.id
        self.policy = policy
        self.first_rows = lane.first_rows
        self.integrator = Integrator(lane.project, run, policy,
                                     fence=holder.still_holds if holder is not None else None)
        self.pause_on_escalation = policy.parallel.on_escalation == "pause"
        self.memo = lane.memo
        self.verifications = lane.verifications
        self._landed: int | None = None  # the story the last integration step landed
        self._pending_seen = True  # did this pass's rows hold a pending story?
        self.strategy: LaneStrategy = (
            Stack(self, policy.verify.depth(run.max_parallel))
            if speculating(policy, run.max_parallel) else Sequential(self))
        if isinstance(self.strategy, Stack):  # the stack checks the target in a thread
            run_id, tasks = run.id, lane.tasks
            self.integrator.blame = Blame(self.integrator, checks=self.verifications,
                                          wake=lambda: tasks.enqueue_lane(run_id))
        if run.max_parallel > 1:
            self.integrator.between = self._dispatch_between

    def loop(self, first: FirstRows | None = None) -> None:
        """`first`: the first pass's rows as `_first_rows` read them (None: read them here)."""
        try:
            self._passes(first)
        finally:
            if self.integrator.landed:  # a pass that ended early (an error, a run ended)
                try:
                    self.integrator.clean_landed()
                except Exception:  # leftovers no row owns: `cleanup` removes them
                    log.exception("clean-up after integration failed for run %s", self.run_id)

    def _passes(self, first: FirstRows | None) -> None:
        if first is None:
            with self.db.read() as s:
                first = self.first_rows(s, s.get_one(Run, self.run_id))
        integrated, first_loaded = first
        loaded: tuple[Run, list[LaneRow]] | None = first_loaded
        contradicted = rows_contradicting_git(self.integrator.git, self.integrator.target,
                                              first_loaded[0].head_sha, *integrated)
        if contradicted:
            self._contradicted(contradicted)
            return
        if recover_orphans(self.db, self.tasks, self.run_id, self.policy.leases.ttl_s,
                           any_working=any(r.state == StoryState.WORKING
                                           for r in first_loaded[1])):
            loaded = None  # re-queued or escalated: the first pass reads the rows again
        self.integrator.git.clear_stale_locks()  # git steps of ours that died (journaled)
        for _ in range(10_000):  # bounded: each pass either progresses or returns
            run, stories = loaded or self._load()
            loaded = None  # later passes read what the earlier ones changed
            self._pending_seen = any(s.state == StoryState.PENDING for s in stories)
            if run.state not in RUN_LIVE:
                return
            if restack_stale(self.db, self.integrator.git, self.run_id, stories,
                             own_paths(self.integrator.layout, self.policy.scm)):
                continue
            if self._stop_now(run):
                continue
            if self._dispatch_first(run, stories):
                self.integrator.clean_landed()
                continue
            if self._integrate_next(run, stories):
                loaded = self._rows_after_landing(run, stories)
                continue
            if self._pause_for_escalation(run, stories):
                continue
            if not self.pause_on_escalation and self._block_behind_parked(stories):
                continue
            if run.state == RunState.RUNNING and self._dispatch(run, stories):
                self.integrator.clean_landed()  # the next story is on its way meanwhile
                if self._nothing_left(run, stories):
                    return
                continue
            self._settle(run, stories)
            self.integrator.clean_landed()  # the last stories' refs and branches
            return

    def _contradicted(self, bad: list[IntegratedRow]) -> None:
        listing = ", ".join(f"{st.key} ({(st.integrated_sha or 'no commit')[:12]})" for st in bad)
        reason = (f"the rows contradict git: {listing} marked integrated but not on "
                  f"{self.integrator.target.branch}; check the state database")
        with self.db.transaction() as s:
            record(s, self.run_id, EventKind.ROWS_CONTRADICTED, stories=[st.key for st in bad],
                   reason=reason)
        self._request_pause(reason, pause="rows")
        self._settle(*self._load())

    def _load(self) -> tuple[Run, list[LaneRow]]:
        with self.db.read() as s:
            return s.get_one(Run, self.run_id), lane_rows(s, self.run_id, self.memo.rows)

    def _stop_now(self, run: Run) -> bool:
        """`stop --now` ends the stack's verifications too (their stories wait as ready)."""
        return (run.state == RunState.STOPPING and run.stop_mode == StopMode.NOW
                and self.strategy.stop_now("stopped (now)"))

    # ------------------------------------------------------------ 0. dispatch first
    def _dispatch_first(self, run: Run, stories: list[LaneRow]) -> bool:
        """Start what can start before integrating, when that cannot change the history.

        Not at `max_parallel = 1`: the sequential loop integrates a story before it starts the
        next one, so every story starts on its predecessor's result (same bases, same history
        as the loop without a lane). Not once a story is parked: an escalation must stop
        dispatching before anything else happens. Admission itself is unchanged, so a story that
        conflicts with a finished but unintegrated one still waits for its integration.
        """
        if run.state != RunState.RUNNING or run.max_parallel <= 1:
            return False
        if any(s.state in STORY_PARKED for s in stories):
            return False
        if not any(s.state == StoryState.PENDING for s in stories):
            return False
        if sum(1 for s in stories if s.state in STORY_IN_FLIGHT) >= run.max_parallel:
            return False  # no slot: admission would start nothing (the pass's own dispatch
            # still writes the waiting stories' reasons)
        return self._dispatch(run, stories)

    def _dispatch_between(self) -> None:
        """Mid-integration: a slot a worker freed meanwhile (its wake-up waits in the lane's
        queue) is filled now, by `_dispatch_first`'s rules; no rows read if nothing waits."""
        if not self._pending_seen:
            return  # none in this pass's rows; one made pending since waits for the next pass
        last = getattr(self, "_decision", None)
        if (last is None or last.waiting) and self.tasks.lane_pending() > 0:
            self._dispatch_first(*self._load())

    # ------------------------------------------------------------ 1. integration
    def _integrate_next(self, run: Run, stories: list[LaneRow]) -> bool:
        if not self.may_land(run):
            return False
        self._landed = None
        return self.strategy.step(run, stories)

    def may_land(self, run: Run) -> bool:
        """May anything be integrated now? Not once the run settles, nor while a checkpoint, a
        foreign move or a changed git configuration holds integration."""
        return run.state in (RunState.RUNNING, RunState.PAUSING) and not self._integration_held(run)

    def _rows_after_landing(self, run: Run,
                            stories: list[LaneRow]) -> tuple[Run, list[LaneRow]] | None:
        """At `max_parallel = 1` nothing but the lane moves a story while it integrates (the
        next one starts after it): after a landing the next pass needs only the run's row (a
        stop or a checkpoint may have changed it), not every open story's again."""
        if self._landed is None or run.max_parallel > 1:  # (a stack needs N > 1 too)
            return None
        with self.db.read() as s:
            run = s.get_one(Run, self.run_id)
        return run, [row._replace(state=StoryState.INTEGRATED, port_block=None)
                     if row.id == self._landed else row for row in stories]

    def landing(self, story: StoryRow, action: Callable[[], _T]) -> _T | None:
        """Run an integration step; a target someone else moved, or a red target, pauses the
        run (None)."""
        try:
            return action()
        except TargetMoved as moved:
            self._request_pause(f"{FOREIGN_MOVE_PREFIX}{moved}; inspect it, then "
                                "`bmad-loop resume` adopts the target as it is",
                                pause="foreign-move", story=story.key)
            return None
        except TargetRed as red:  # whatever `on_escalation` says: nothing lands on a red target
            self._request_pause(str(red), pause="target-red", story=story.key)
            return None

    def after_integration(self, story: StoryRow, outcome: str) -> None:
        """The notifications and the checkpoint pause an integration's outcome calls for."""
        if outcome == StoryState.INTEGRATED:
            self._landed = story.id
        if outcome == StoryState.HELD:
            notify(self.db, self.policy, self.run_id, EventKind.STORY_HELD, story=story.key,
                   reason="waiting for operator sign-off")
        if outcome == StoryState.INTEGRATED and story.done_checkpoint:
            self._request_pause(f"checkpoint after {story.key}", pause="checkpoint",
                                story=story.key)
        if outcome == StoryState.ESCALATED:
            notify(self.db, self.policy, self.run_id, EventKind.STORY_ESCALATED, story=story.key,
                   reason=self._story(story.id).reason)

    # ------------------------------------------------------------ 2. escalation
    def _pause_for_escalation(self, run: Run, stories: list[LaneRow]) -> bool:
        if run.state != RunState.RUNNING or not self.pause_on_escalation:
            return False
        escalated = [s for s in stories if s.state == StoryState.ESCALATED]
        if not escalated:
            return False
        first = escalated[0]
        self._request_pause(f"{first.key} escalated: {first.reason}", pause="escalation",
                            story=first.key)
        return True

    def _done_on_target(self, rows: list[LaneRow]) -> list[LaneRow]:
        """Stale-premise check: stories someone shipped since the plan was made. The board is
        read and parsed again only when the target moved since the last read."""
        if not rows or not self.integrator.board_rel:
            return []
        sha = self.integrator.target.sha()  # remote mode: refresh the mirror
        if sha is None:
            return []
        known = self.memo.board_done
        if known is None or known[0] != sha:
            known = self.memo.board_done = (sha, board_done_keys(self.integrator.git, sha,
                                                                  self.integrator.board_rel))
        return [row for row in rows if row.key in known[1]]

    def _block_behind_parked(self, stories: list[LaneRow]) -> bool:
        """on_escalation = continue: what depends on or conflicts with a parked story is blocked."""
        parked = [s for s in stories if s.state in (StoryState.ESCALATED, StoryState.FAILED, StoryState.BLOCKED)]
        if not parked:
            return False
        changed = False
        with self.memo.lock:
            index = self._conflict_index(stories)
        with self.db.transaction() as s:
            for story in stories:
                if story.state != StoryState.PENDING:
                    continue
                why = None
                for other in parked:
                    if other.key in (story.depends_on or ()):
                        why = f"depends on {other.key}, which is {other.state}: {other.reason}"
                        break
                    if other.seq < story.seq:
                        clash = index.reason(story.key, other.key)
                        if clash:
                            why = f"conflicts with {other.key} ({other.state}): {clash}"
                            break
                if why and transition_story(s, story.id, StoryState.PENDING, state=StoryState.BLOCKED, reason=why,
                                            ended_at=utcnow()):
                    record(s, self.run_id, EventKind.STORY_BLOCKED, story.key, reason=why)
                    changed = True
        return changed

    def _request_pause(self, reason: str, *, pause: str, story: str | None = None) -> None:
        with self.db.transaction() as s:
            if transition_run(s, self.run_id, RunState.RUNNING, state=RunState.PAUSING, reason=reason):
                record(s, self.run_id, EventKind.RUN_PAUSING, story, reason=reason, pause=pause)

    # ------------------------------------------------------------ 3. admission
    def _directories(self) -> frozenset[str] | None:
        """The target tree's directories (they decide what a literal path covers); listed
        once per target SHA, and asked for only when some pair of footprints depends on them."""
        return tree_directories(self.integrator.git, self.integrator.target.sha(fetch=False))

    def _conflict_index(self, stories: list[LaneRow]) -> ConflictIndex:
        """The run's conflict relation, brought up to date with these rows and the target."""
        self.memo.index.update(self.memo.views_of(stories, settled=self.integrator.composer.rules), self._directories)
        return self.memo.index

    def _dispatch(self, run: Run, stories: list[LaneRow]) -> bool:
        # Stacked starts only in parallel (N = 1 is the sequential loop), in one clone, and on
        # a fresh branch (a created or resumed story keeps the branch it has).
        stacking = run.max_parallel > 1 and not self.integrator.target.publishes_stories
        self._queued = 0
        with self.memo.lock:
            decision = admit(self.memo.views_of(stories, stacking, self.integrator.composer.rules),
                             max_parallel=run.max_parallel,
                             capacity=self.policy.resources.capacity,
                             gates_mode=self.policy.gates.mode, gates_passed=run.gates_passed or (),
                             index=self.memo.index, directories=self._directories)
        by_key = {s.key: s for s in stories}
        shipped = self._done_on_target([by_key[k] for k in decision.dispatch])
        if shipped:
            with self.db.transaction() as s:
                for row in shipped:
                    if transition_story(s, row.id, StoryState.PENDING, state=StoryState.SKIPPED, ended_at=utcnow(),
                                        reason="already done on the target's board"):
                        record(s, self.run_id, EventKind.STORY_SKIPPED, row.key,
                               reason="stale premise: the target's board marks it done")
            return True  # admit again without them
        # (A stacked start is admitted onto a target that has a SHA.)
        bases = stacked_bases(self.integrator.git,
                              cast(str, self.integrator.target.sha(fetch=False)),
                              decision, by_key, self.integrator.composer.rules) if decision.stacked else {}
        queued = []
        used_blocks = {s.port_block for s in stories if s.state in STORY_IN_FLIGHT and s.port_block is not None}
        with self.db.transaction() as s:
            write_wait_reasons(s, self.run_id, decision.waiting, by_key, self.memo.reasons_written)
            for key in decision.dispatch:
                row = by_key[key]
                stacked = bases.get(key, (None, None))
                block = None
                if self.policy.resources.ports:
                    block = min(i for i in range(run.max_parallel) if i not in used_blocks)
                    used_blocks.add(block)
                fields: dict[str, Any] = ({"base_sha": stacked[0], "stacked_on": stacked[1]}
                                          if stacked[1] else {})
                if transition_story(s, row.id, StoryState.PENDING, state=StoryState.QUEUED, queued_at=utcnow(),
                                    wait_reason=None, port_block=block, **fields):
                    record(s, self.run_id, EventKind.STORY_QUEUED, key, seq=row.seq,
                           **({"base_sha": stacked[0], "stacked_on": [x["key"] for x in stacked[1]]}
                              if stacked[1] else {}))
                    queued.append(row.id)
            if decision.gate is not None:
                self._gate = decision.gate
        self.memo.reasons_written.update(reasons_told(decision.waiting, by_key))  # committed now
        for story_id in queued:
            self.tasks.enqueue_story(self.run_id, story_id)
        self._decision, self._queued = decision, len(queued)
        # Settle on fresh rows: what was just queued is in flight now.
        return bool(queued)

    def _nothing_left(self, run: Run, stories: list[LaneRow]) -> bool:
        """After a dispatch: every slot is taken and no story waits for the lane, so another
        pass would find nothing to do (any story that moves on wakes the lane); the lane stops
        here instead of reading the rows again while the new stories start."""
        busy = sum(1 for s in stories if s.state in STORY_IN_FLIGHT) + self._queued
        return busy >= run.max_parallel and not any(
            s.state in STORY_AWAITING_LANE or s.state in STORY_PARKED for s in stories)

    # ------------------------------------------------------------ 4. settling
    def _settle(self, run: Run, stories: list[LaneRow]) -> None:
        if any(s.state in STORY_IN_FLIGHT for s in stories):
            return  # workers will wake the lane when they finish
        if self.verifications.any():
            return  # so will the stack's verifications
        states = {s.state for s in stories}
        if run.state == RunState.STOPPING:
            return self._end_pause(RunState.STOPPED, run.reason or "stopped")
        if run.state == RunState.PAUSING:
            return self._end_pause(RunState.PAUSED, run.reason or "paused")
        if states <= {StoryState.INTEGRATED, StoryState.SKIPPED}:
            return self._complete()
        if self._integration_due(run, stories):
            return  # integration is due; the next tick does it
        decision = getattr(self, "_decision", None)
        if decision is not None and decision.gate is not None:
            self._set_gate(decision.gate)
            return self._end_pause(RunState.PAUSED, f"gate before epic {decision.gate}: "
                                   "`bmad-loop resume` opens it")
        if decision is not None and decision.approvals:
            return self._end_pause(RunState.PAUSED, "waiting for spec approval of "
                                   + ", ".join(decision.approvals))
        parked = [s for s in stories if s.state in STORY_PARKED]
        if parked:
            listing = "; ".join(f"{s.key} {s.state}: {s.reason}" for s in parked)
            return self._end_pause(RunState.PAUSED, f"needs a human: {listing}")
        waiting = [s for s in stories if s.state == StoryState.PENDING]
        if waiting and (decision is None or not decision.dispatch):
            listing = "; ".join(f"{s.key}: {s.wait_reason}" for s in waiting[:5])
            return self._end_pause(RunState.PAUSED, f"no story can start: {listing}")

    def _integration_held(self, run: Run) -> bool:
        """A checkpoint pauses right after its story, a foreign move, a red target or a changed
        git configuration (its planted code would run in the lane's git) before the next one:
        nothing more lands until `resume`."""
        reason = run.reason or ""
        return run.state == RunState.PAUSING and reason.startswith(
            ("checkpoint", FOREIGN_MOVE_PREFIX, CONFIG_CHANGED_PREFIX, RED_PREFIX))

    def _integration_due(self, run: Run, stories: list[LaneRow]) -> bool:
        """Would `_integrate_next` find a story to integrate? (Same scan, no side effects.)"""
        if self._integration_held(run):
            return False
        story = next_in_plan(stories, self.pause_on_escalation)
        return story is not None and story.state in (StoryState.READY, StoryState.INTEGRATING)

    def _set_gate(self, epic: str) -> None:
        with self.db.transaction() as s:
            s.get_one(Run, self.run_id).gate_epic = epic
            record(s, self.run_id, EventKind.GATE_REACHED, epic=epic)

    def _end_pause(self, state: RunState, reason: str) -> None:
        """Settle as paused (from running or pausing) or stopped (from stopping)."""
        drain_pool(self.integrator.git, self.integrator.layout)  # no worktree parked past the run
        expected = (RunState.STOPPING,) if state == RunState.STOPPED else (RunState.RUNNING, RunState.PAUSING)
        with self.db.transaction() as s:
            if transition_run(s, self.run_id, expected, state=state, reason=reason):
                record(s, self.run_id, EventKind(f"run.{state}"), reason=reason)
            else:
                return
        notify(self.db, self.policy, self.run_id, EventKind(f"run.{state}"), reason=reason)

    def _complete(self) -> None:
        with self.db.transaction() as s:
            completed = transition_run(s, self.run_id, (RunState.RUNNING,), state=RunState.COMPLETED,
                                       ended_at=utcnow(), reason=None)
            if completed:
                stories = stories_of(s, self.run_id)
                record(s, self.run_id, EventKind.RUN_COMPLETED,
                       integrated=sum(1 for x in stories if x.state == StoryState.INTEGRATED),
                       skipped=sum(1 for x in stories if x.state == StoryState.SKIPPED))
        # Every story has landed: the parked worktrees go right after (the tick, and so `run`,
        # ends once they are gone), not on the way to the run's completion.
        drain_pool(self.integrator.git, self.integrator.layout)
        if completed:
            notify(self.db, self.policy, self.run_id, EventKind.RUN_COMPLETED)

    def _story(self, story_id: int) -> Story:
        with self.db.transaction() as s:
            return s.get_one(Story, story_id)


class LaneStrategy(Protocol):
    def step(self, run: Run, stories: list[LaneRow]) -> bool:
        """Do the next integration step that is due; whether anything was done."""

    def stop_now(self, reason: str) -> bool:
        """`stop --now`: give up what is being integrated and can still be given up (its
        stories wait as ready); whether anything changed."""


class Sequential:
    """The lane without speculation: the earliest open story in plan order is composed,
    verified and landed, then the next; a finished story waits for every earlier one."""

    def __init__(self, lane_pass: LanePass) -> None:
        self.lane = lane_pass

    def step(self, run: Run, stories: list[LaneRow]) -> bool:
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


def _integrated_statement() -> Select[str, str | None, int]:
    integrated = (Story.run_id == bindparam("run_id"), Story.state == StoryState.INTEGRATED)
    latest_seq = select(func.max(Story.seq)).where(*integrated).scalar_subquery()
    return (select(Story.key, Story.integrated_sha, Story.seq)
            .where(*integrated, or_(Story.integrated_sha.is_(None), Story.seq == latest_seq))
            .order_by(Story.seq))


_INTEGRATED = _integrated_statement()  # built once: the lane reads it every tick


def integrated_rows(session: Session, run_id: str) -> Integrated:
    """(the latest integrated story, those integrated without a commit), as (key,
    integrated_sha) rows, in one statement."""
    rows = list(session.connection().execute(_INTEGRATED, {"run_id": run_id}))
    if not rows:
        return None, []
    return rows[-1], [row for row in rows if row.integrated_sha is None]


def rows_contradicting_git(git: Git, target: Target, head_sha: str | None,
                           latest: IntegratedRow | None,
                           bad: list[IntegratedRow]) -> list[IntegratedRow]:
    """The stories whose rows contradict git (see the module's docstring). `head_sha`: where
    the lane last advanced the target (the run's row); `target`: the run's target."""
    if latest is None:
        return []
    if not bad and latest.integrated_sha != head_sha:
        target_now = target.sha(fetch=False)
        if target_now and (git.rev(f"{latest.integrated_sha}^{{commit}}") is None
                           or not git.is_ancestor(latest.integrated_sha, target_now)):
            bad = [latest]
    return bad


_STORIES = cast(Table, Story.__table__)  # a mapped class's table is typed as any FromClause
_SET_WAIT_REASON = (update(_STORIES).where(_STORIES.c.id.in_(bindparam("ids", expanding=True)))
                    .values(wait_reason=bindparam("why")))


def write_wait_reasons(s: Session, run_id: str, waiting: dict[str, str],
                       by_key: Mapping[str, LaneRow],
                       told: Mapping[int, tuple[int, str]]) -> None:
    """Write and journal each waiting story's reason that changed (`waiting`: key -> reason)."""
    changed: dict[str, list[int]] = {}  # reason -> ids: no row loaded
    for key, why in waiting.items():
        row = by_key[key]
        if row.wait_reason != why and told.get(row.id) != (row.rev, why):
            changed.setdefault(why, []).append(row.id)
            record(s, run_id, EventKind.STORY_WAITING, key, reason=why)
    for why, ids in changed.items():
        s.connection().execute(_SET_WAIT_REASON, {"ids": ids, "why": why})


def reasons_told(waiting: dict[str, str],
                 by_key: Mapping[str, LaneRow]) -> dict[int, tuple[int, str]]:
    """What `write_wait_reasons` wrote on these rows, for `told` once its transaction is in."""
    return {by_key[key].id: (by_key[key].rev, why) for key, why in waiting.items()}


class LaneMemo:
    """What the lane keeps across the ticks of its run, read and written by its passes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # one lane thread, but a test may also tick by hand
        self.index = ConflictIndex()
        self.board_done: tuple[str, frozenset[str]] | None = None  # (target sha, done keys)
        self.rows: dict[int, LaneRow] = {}  # the run's stories' rows as last read, by id (runs.lane_rows)
        self.reasons_written: dict[int, tuple[int, str]] = {}  # id -> (rev, reason) written
        # (story id, stacking) -> (row, its admission view, rules)
        self._views: dict[tuple[int, bool], tuple[LaneRow, StoryView, MergeRules | None]] = {}

    def views_of(self, rows: Sequence[LaneRow], stacking: bool = False,
                 settled: MergeRules | None = None) -> list[StoryView]:
        """`admission.views_of`, made once per row: a row kept across passes (the same object
        while its `rev` stands) keeps its view, so a pass over a long sprint does not rebuild
        hundreds of them. A row read again, or made for the pass, is a new object: a new view."""
        views: list[StoryView] = []
        kept = self._views
        for row in rows:
            hit = kept.get((row.id, stacking))
            if hit is None or hit[0] is not row or hit[2] != settled:  # rules compare by value
                hit = kept[row.id, stacking] = (row, views_of((row,), stacking, settled)[0], settled)
            views.append(hit[1])
        if len(kept) > 2 * len(rows) + 64:  # stories that left the run: not kept forever
            current = {row.id for row in rows}
            for key in [key for key in kept if key[0] not in current]:
                del kept[key]
        return views


class Lane:
    """The lane of run `run_id` in this process."""

    def __init__(self, project: Project, tasks: Tasks, run_id: str) -> None:
        self.project = project
        self.tasks = tasks
        self.run_id = run_id
        self.memo = LaneMemo()
        self.verifications = Verifications()  # the stack's, running in this process

    def busy(self) -> bool:
        """Does a verification of this run still run here (it wakes the lane when it ends)?"""
        return self.verifications.any()

    def tick(self, holder: LeaseHolder | None = None) -> None:
        """One tick. `holder` is this lane's lease holder (None: unfenced, as in a
        single-process test); a standby or a fenced holder changes nothing."""
        db = self.project.db
        if holder is not None and not holder.held:
            return  # a standby lane never acts; the active one has this run
        with db.read() as s:  # the run, and the first pass's rows with it: one read
            run = s.get(Run, self.run_id)
            if run is None or run.state not in RUN_LIVE:
                return
            policy = run_policy(run)
            fenced = holder is not None and not holder.still_holds(s)
            first = [] if fenced else [self.first_rows(s, run)]
        if fenced:
            # It thinks it holds the lease, but another lane took over: fenced, change nothing.
            with db.transaction() as s:
                record(s, self.run_id, EventKind.LANE_FENCED, reason="lost the lane lease (it expired or "
                       "another lane took it over); this tick changes nothing",
                       owner=holder.owner if holder is not None else None)
            return
        try:
            def one_try() -> None:  # a retry reads everything again
                LanePass(self, run, policy, holder).loop(first.pop() if first else None)

            retrying(one_try, db=db, run_id=self.run_id, story=None, what="lane tick")
        except FaultPersisted as exc:
            if pause_for_fault(db, self.run_id, exc.fault, exc.attempts):
                notify(db, policy, self.run_id, EventKind.RUN_PAUSED, reason=exc.fault.describe())
        except LaneFenced as exc:
            log.warning("%s", exc)
            with db.transaction() as s:
                record(s, self.run_id, EventKind.LANE_FENCED, reason=str(exc))
        except Exception as exc:  # no retry can fix it: failed, and `resume` once it is fixed
            self._fail(policy, exc)

    def first_rows(self, s: Session, run: Run) -> FirstRows:
        """What a tick's first pass reads, in one snapshot: the rows for the check against git
        (tick.py), the run, and the lane's rows of its stories."""
        return integrated_rows(s, run.id), (run, lane_rows(s, run.id, self.memo.rows))

    def _fail(self, policy: Policy, exc: Exception) -> None:
        log.exception("lane tick failed for run %s", self.run_id)
        db = self.project.db
        with db.transaction() as s:
            if transition_run(s, self.run_id, RUN_LIVE, state=RunState.FAILED,
                              reason=f"lane error: {exc}", ended_at=utcnow()):
                record(s, self.run_id, EventKind.RUN_FAILED, reason=f"lane error: {exc}")
        drain_run_pool(self.project, self.run_id, policy)  # parked worktrees go when the run settles
        notify(db, policy, self.run_id, EventKind.RUN_FAILED, reason=str(exc))


def tick_once(project: Project, tasks: Tasks, run_id: str,
              holder: LeaseHolder | None = None) -> None:
    """One tick of a lane made for it (nothing kept across ticks): for callers without a
    consumer set. Speculation needs a kept `Lane`: this one forgets its verifications."""
    Lane(project, tasks, run_id).tick(holder)
