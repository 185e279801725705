"""The one vocabulary of states, phases and outcomes, with the transitions each machine allows.

Every state the engine writes comes from here: runs, stories, agent attempts and candidates.
The members are `StrEnum`s, so they compare equal to the strings stored in the rows and
shown in `status --json`; no other module spells a state as a literal.

The transition tables are enforced in two places: the guarded UPDATEs of
`engine.transitions` and an ORM validator on each model's `state` column, so an assignment
the table does not allow raises `IllegalTransition` instead of writing a row that no reader
expects. `docs/architecture.md` draws the same tables; a test keeps the two in step.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Mapping

__all__ = [
    "RunState", "StoryState", "Phase", "AttemptState", "CandidateState", "StopMode",
    "RUN_LIVE", "RUN_ONE_PER_TARGET", "RUN_RESUMABLE", "RUN_SETTLED", "RUN_TERMINAL",
    "RUN_ABANDONABLE",
    "STORY_IN_FLIGHT", "STORY_PARKED", "STORY_NEEDS_HUMAN", "STORY_DONE", "STORY_TERMINAL",
    "STORY_AWAITING_LANE", "STORY_STACKABLE", "AGENT_PHASES", "CANDIDATE_ENDED", "CANDIDATE_OPEN",
    "RUN_TRANSITIONS", "STORY_TRANSITIONS", "CANDIDATE_TRANSITIONS", "ATTEMPT_TRANSITIONS",
    "RUN_INITIAL", "STORY_INITIAL", "CANDIDATE_INITIAL", "ATTEMPT_INITIAL",
    "IllegalTransition", "check_transition",
]


class RunState(StrEnum):
    RUNNING = "running"
    PAUSING = "pausing"      # parking: running siblings finish, then paused
    PAUSED = "paused"
    STOPPING = "stopping"    # `stop` asked: settles at safe boundaries, then stopped
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"        # something no retry could fix; `resume` takes it over once fixed
    ABANDONED = "abandoned"  # ended for good by `bmad-loop abandon`


class StoryState(StrEnum):
    PENDING = "pending"          # waiting for admission
    QUEUED = "queued"            # admitted, a wake-up sent to the story workers
    WORKING = "working"          # a worker holds it (see `Phase`)
    READY = "ready"              # committed on its branch, waiting for the lane
    INTEGRATING = "integrating"  # the lane is composing, verifying or advancing it
    HELD = "held"                # verified, waiting for an operator's sign-off
    INTEGRATED = "integrated"
    ESCALATED = "escalated"      # needs a human; `resume` retries it
    BLOCKED = "blocked"          # behind a parked dependency or conflict
    SKIPPED = "skipped"
    FAILED = "failed"


class Phase(StrEnum):
    """Where a story is: the worker's steps, then the lane's."""

    PREPARE = "prepare"
    CREATE = "create"  # BMAD's create-story writes the story file; then back to pending for dev
    DEV = "dev"
    VERIFY = "verify"
    REVIEW = "review"
    FIX = "fix"
    # The lane sent it back to its agent: its candidate failed on the current target, or did not
    # compose. bmad-loop merges the target into the story's worktree; the agent mends the result.
    REPAIR = "repair"
    COMMIT = "commit"
    INTEGRATE = "integrate"


class AttemptState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed-out"
    CRASHED = "crashed"
    INTERRUPTED = "interrupted"  # bmad-loop itself stopped or crashed: not counted
# (`crashed` is kept for rows written by older versions; nothing writes it now.)


class CandidateState(StrEnum):
    COMPOSING = "composing"
    VERIFYING = "verifying"
    VERIFIED = "verified"
    ADVANCING = "advancing"
    ADVANCED = "advanced"
    STALE = "stale"              # the target moved under it: recomposed
    CONFLICT = "conflict"
    VERIFY_FAILED = "verify-failed"
    ABANDONED = "abandoned"


class StopMode(StrEnum):
    GRACEFUL = "graceful"  # safe boundaries
    NOW = "now"            # kill agent sessions


# Agent sessions run in these phases; each has its prompt instructions.
AGENT_PHASES = (Phase.CREATE, Phase.DEV, Phase.REVIEW, Phase.FIX, Phase.REPAIR)

# -- named sets ----------------------------------------------------------------------------

RUN_LIVE = frozenset({RunState.RUNNING, RunState.PAUSING, RunState.STOPPING})  # consumers re-queue
RUN_ONE_PER_TARGET = RUN_LIVE | {RunState.PAUSED}  # at most one such run per target branch
RUN_RESUMABLE = RUN_LIVE | {RunState.PAUSED, RunState.STOPPED, RunState.FAILED}
RUN_SETTLED = frozenset({RunState.COMPLETED, RunState.FAILED, RunState.PAUSED, RunState.STOPPED,
                         RunState.ABANDONED})
# Nothing more happens to the run: its clean-up follows `keep_failed` and run retention.
RUN_TERMINAL = frozenset({RunState.COMPLETED, RunState.ABANDONED})
# A run `abandon` may end: one that nothing is working on.
RUN_ABANDONABLE = frozenset({RunState.PAUSED, RunState.STOPPED, RunState.FAILED})

STORY_IN_FLIGHT = frozenset({StoryState.QUEUED, StoryState.WORKING})
STORY_AWAITING_LANE = frozenset({StoryState.READY, StoryState.INTEGRATING})
# Finished, not yet integrated: a later story may start on a base stacked on such a story.
STORY_STACKABLE = STORY_AWAITING_LANE | {StoryState.HELD}
STORY_NEEDS_HUMAN = frozenset({StoryState.ESCALATED, StoryState.BLOCKED, StoryState.HELD})
STORY_PARKED = STORY_NEEDS_HUMAN | {StoryState.FAILED}
# Done for scheduling: nothing more happens to the story; conflicts with it are released.
STORY_DONE = frozenset({StoryState.INTEGRATED, StoryState.SKIPPED, StoryState.FAILED})
# Nothing more happens in this run unless an operator resumes it.
STORY_TERMINAL = STORY_DONE | {StoryState.ESCALATED, StoryState.BLOCKED}

CANDIDATE_ENDED = frozenset({CandidateState.ADVANCED, CandidateState.STALE, CandidateState.CONFLICT,
                             CandidateState.VERIFY_FAILED, CandidateState.ABANDONED})
# Still on its way to the target: a lane that died left it there, and the next one picks it up.
CANDIDATE_OPEN = frozenset(CandidateState) - CANDIDATE_ENDED

# -- transition tables ---------------------------------------------------------------------
# old state -> the states it may move to. A row is created in one of the *_INITIAL states.

R, S, C, A = RunState, StoryState, CandidateState, AttemptState

RUN_INITIAL = frozenset({R.RUNNING})
RUN_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    R.RUNNING: frozenset({R.PAUSING, R.PAUSED, R.STOPPING, R.COMPLETED, R.FAILED}),
    R.PAUSING: frozenset({R.RUNNING, R.PAUSED, R.STOPPING, R.FAILED}),
    R.STOPPING: frozenset({R.RUNNING, R.STOPPED, R.FAILED}),
    R.PAUSED: frozenset({R.RUNNING, R.STOPPED, R.ABANDONED}),
    R.STOPPED: frozenset({R.RUNNING, R.ABANDONED}),
    R.FAILED: frozenset({R.RUNNING, R.ABANDONED}),
    R.COMPLETED: frozenset(),
    R.ABANDONED: frozenset(),
}

STORY_INITIAL = frozenset({S.PENDING})
STORY_TRANSITIONS: dict[StoryState, frozenset[StoryState]] = {
    S.PENDING: frozenset({S.QUEUED, S.BLOCKED, S.SKIPPED}),
    S.QUEUED: frozenset({S.PENDING, S.WORKING}),
    S.WORKING: frozenset({S.PENDING, S.QUEUED, S.READY, S.ESCALATED}),
    S.READY: frozenset({S.INTEGRATING, S.PENDING}),  # pending: restacked (engine/lane/stacking.py)
    # ready: its speculative candidate was given up (one below it failed, or the run stopped),
    # or the target itself fails the check its candidate failed (red: no story blamed)
    # pending: sent back to its agent for a repair (phase `repair`), next in plan order
    S.INTEGRATING: frozenset({S.HELD, S.INTEGRATED, S.ESCALATED, S.READY, S.PENDING}),
    S.HELD: frozenset({S.READY, S.ESCALATED, S.PENDING}),  # pending: `retry --from dev|review`
    # ready: escalated by something outside the story (resume), or `retry --from integrate`
    S.ESCALATED: frozenset({S.PENDING, S.READY}),
    S.BLOCKED: frozenset({S.PENDING}),
    S.INTEGRATED: frozenset(),
    S.SKIPPED: frozenset(),
    S.FAILED: frozenset(),
}

CANDIDATE_INITIAL = frozenset({C.COMPOSING})
CANDIDATE_TRANSITIONS: dict[CandidateState, frozenset[CandidateState]] = {
    C.COMPOSING: frozenset({C.VERIFYING, C.CONFLICT, C.ABANDONED}),
    C.VERIFYING: frozenset({C.VERIFIED, C.VERIFY_FAILED, C.ABANDONED}),
    C.VERIFIED: frozenset({C.ADVANCING, C.ABANDONED}),
    C.ADVANCING: frozenset({C.ADVANCED, C.STALE, C.ABANDONED}),
    C.ADVANCED: frozenset(),
    C.STALE: frozenset(),
    C.CONFLICT: frozenset(),
    C.VERIFY_FAILED: frozenset(),
    C.ABANDONED: frozenset(),
}

ATTEMPT_INITIAL = frozenset({A.RUNNING})
ATTEMPT_TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    A.RUNNING: frozenset({A.SUCCEEDED, A.FAILED, A.TIMED_OUT, A.INTERRUPTED}),
    A.SUCCEEDED: frozenset(),
    A.FAILED: frozenset(),
    A.TIMED_OUT: frozenset(),
    A.CRASHED: frozenset(),
    A.INTERRUPTED: frozenset(),
}

del R, S, C, A

# Each machine's table is keyed by its own enum; the lookup below is by a member of that enum.
_MACHINES: dict[str, tuple[type[StrEnum], frozenset[StrEnum], Mapping[Any, frozenset[StrEnum]]]] = {
    "run": (RunState, RUN_INITIAL, RUN_TRANSITIONS),
    "story": (StoryState, STORY_INITIAL, STORY_TRANSITIONS),
    "candidate": (CandidateState, CANDIDATE_INITIAL, CANDIDATE_TRANSITIONS),
    "attempt": (AttemptState, ATTEMPT_INITIAL, ATTEMPT_TRANSITIONS),
}


class IllegalTransition(RuntimeError):
    """A programming error: code asked for a state change its machine does not allow."""


def check_transition(machine: str, old: str | None, new: str) -> None:
    """Raise `IllegalTransition` unless `old -> new` is in `machine`'s table.

    `old` None is a new row, which must start in an initial state; staying put is allowed.
    """
    vocabulary, initial, table = _MACHINES[machine]
    try:
        new_state = vocabulary(new)
    except ValueError:
        raise IllegalTransition(f"{machine}: unknown state {new!r}") from None
    if old is None:
        if new_state not in initial:
            raise IllegalTransition(f"{machine}: a new row cannot start {new_state}")
        return
    old_state = vocabulary(old)
    if old_state != new_state and new_state not in table[old_state]:
        raise IllegalTransition(f"{machine}: {old_state} -> {new_state} is not allowed")
