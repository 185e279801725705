"""What a story's steps receive, instead of the worker object itself, and what each decides.

`StoryContext` is what stays fixed while one worker holds one story: who, where, with what
policy. `Claim` is the worker's hold on the row: every write goes through `own()` or `write()`,
which refuse once recovery gave the story to someone else (the claim generation moved), and
`beat()` renews the row's heartbeat and the story's lease. `Outcome` is what a phase decided
(or it raises `escalation.Escalate` to hand the story to a human).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import bindparam, select
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm import Session

from ...db.models import Attempt, Run, Story, utcnow
from ...errors import StopRequested
from ...states import Phase, StoryState
from ...agents.profiles import Profile, load_profile
from ...db.database import Database
from ...git.runner import Git
from ...git.targets import Target
from ...policy import Policy
from .. import leases
from ..journal import journal_git_locks
from ..runpaths import Layout
from ..verification.childenv import PortBlock, worker_block
from ..verification.runner import Flaky
from ..runrows import RUN_STATE, board_rel
from ..transitions import transition_story_reading
from ..workspace import Workspace, make_workspace

if TYPE_CHECKING:
    from ..project import Project

__all__ = ["StoryContext", "Claim", "Fenced", "Outcome", "FinishedSession", "StepResult",
           "Walker", "story_context"]

log = logging.getLogger(__name__)

# Claim.write's clauses, built once (transitions.py keeps the UPDATE made with them): the claim
# still this worker's, and the run's state read by the same statement.
_CLAIM_HELD = Story.claim == bindparam("claim_generation")
_RUN_STATE = RUN_STATE.scalar_subquery()
# Claim.state's read.
_STORY_STATE = select(Story.state).where(Story.id == bindparam("story_id"))


class Fenced(StopRequested):
    """This worker's claim on the story is gone (recovery gave it to another): write nothing."""


@dataclass(frozen=True)
class StoryContext:
    db: Database
    run_id: str
    story_id: int
    key: str
    target_branch: str
    policy: Policy
    git: Git
    layout: Layout
    target: Target
    workspace: Workspace
    profile: Profile | None
    port_block: PortBlock | None  # this worker slot's ports ([resources] ports)
    host: str
    guard_hooks: Path   # where the target guard's hook scripts live
    board_rel: str | None  # the board's path in the repository (a lane-owned file)

    @property
    def scratch(self) -> Path:
        return self.layout.scratch(self.key)


@dataclass
class Claim:
    db: Database
    run_id: str
    story_id: int
    generation: int
    owner: str
    token: int
    ttl_s: float
    stop_event: threading.Event = field(default_factory=threading.Event)
    lease_dropped: bool = False  # by the transaction that took the story out of `working`

    def own(self, session: Session) -> Story:
        """The story row, if this worker still holds its claim; otherwise Fenced."""
        row = session.get_one(Story, self.story_id)
        if row.state != StoryState.WORKING or row.claim != self.generation:
            raise Fenced()
        return row

    def write(self, session: Session, known: Story | None, /, **values: Any) -> str:
        """Write `values` (column name -> value) to the story row if this worker still holds
        its claim, otherwise Fenced; returns the run's state, read by the same statement (a
        stop asked for ends the walk). One Core UPDATE instead of loading the row (forty
        columns) and flushing it: these run at every phase's end. `known`, the row as this walk
        last left it (nobody else writes it while the claim holds, but for its heartbeat),
        takes the new values."""
        written = transition_story_reading(
            session, self.story_id, StoryState.WORKING, _RUN_STATE, when=_CLAIM_HELD,
            params={"claim_generation": self.generation, "of_run": self.run_id}, **values)
        if not written:  # None: the claim moved on (a row read back always holds the state)
            raise Fenced()
        if known is not None:
            for name, value in values.items():
                set_committed_value(known, name, value)
        return written[0]

    def load(self) -> Story:
        with self.db.read() as s:
            row = s.get_one(Story, self.story_id)
            return row

    def state(self) -> str | None:
        """The story's state now (one column, no row loaded)."""
        with self.db.read() as s:
            return s.connection().execute(_STORY_STATE, {"story_id": self.story_id}).scalar()

    def drop_lease_in(self, session: Session) -> None:
        """Release the story's lease inside the transaction that ends its `working` state (the
        lease only ever guards a working story), so the worker's end costs no transaction."""
        leases.release_in(session, leases.story_lease_name(self.story_id), self.owner)
        self.lease_dropped = True

    def beat(self, attempt_id: int | None = None) -> None:
        now = utcnow()
        with self.db.transaction() as s:
            row = s.get_one(Story, self.story_id)
            if row.state != StoryState.WORKING or row.claim != self.generation:
                self.stop_event.set()  # fenced: end the session; the walk then stops
                return
            row.heartbeat_at = now
            if attempt_id is not None:
                s.get_one(Attempt, attempt_id).heartbeat_at = now
        if not leases.renew(self.db, leases.story_lease_name(self.story_id), self.owner, self.token,
                            self.ttl_s, now):
            # The row still carries our claim, so the work goes on; orphan recovery judges
            # the lease, so say loudly that it may take the story back.
            log.warning("story %s: lease renewal refused (owner %s, token %s)",
                        self.story_id, self.owner, self.token)


class FinishedSession(Protocol):
    """What closing a session's attempt row reads of it (a `sessions.SessionResult`)."""

    attempt_id: int
    phase: str
    number: int
    state: str
    exit_code: int | None

    def attempt_values(self) -> dict[str, Any]: ...


class StepResult(FinishedSession, Protocol):
    """What a phase step reads (and amends) of its session's result (a `sessions.SessionResult`)."""

    ok: bool
    summary: str
    output: str
    reason: str | None


class Walker(Protocol):
    """What a phase step kept in its own module (create_step.py, repair.py) needs of the
    worker walking its story (a `walk.StoryWorker`, which imports those modules)."""

    ctx: StoryContext
    claim: Claim
    policy: Policy

    @property
    def last_row(self) -> Story | None: ...

    def session(self, phase: Phase, number: int) -> StepResult: ...


@dataclass
class Outcome:
    """What a phase decided; the worker writes all of it in one transaction.

    `next_phase` is where the walk goes next; `ready` ends it with the story committed;
    `pending` ends it with the story back in line for admission (its file was just created);
    `escalate` ends it with the story escalated."""

    next_phase: Phase | None = None
    ready: bool = False
    pending: bool = False
    escalate: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)  # increments: dev_attempts, …
    feedback: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)  # plain column values
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (kind, data)
    session: FinishedSession | None = None  # a SessionResult whose attempt row this closes
    flakes: tuple[Flaky, ...] = ()  # of the story's own verify: rows and `verify.flaky` events


def story_context(project: Project, run: Run, story: Story, policy: Policy) -> StoryContext:
    git = journal_git_locks(project.git(policy), project.db, run.id, story.key)
    layout = Layout(project.state_dir, run.id)
    target = project.target(git, run.target_branch)
    profile = load_profile(policy.adapter.profile) if policy.adapter.profile else None
    return StoryContext(
        db=project.db, run_id=run.id, story_id=story.id, key=story.key,
        target_branch=run.target_branch, policy=policy, git=git, layout=layout, target=target,
        workspace=make_workspace(policy, git, layout, target, root=project.root, profile=profile),
        profile=profile, port_block=worker_block(policy, story.port_block), host=project.host,
        guard_hooks=project.path("guard-hooks"), board_rel=board_rel(run, project.root),
    )
