"""The tables: the single source of truth for runs, stories, attempts, candidates, events, leases.

huey messages only say "look at row X"; everything the engine knows lives here, so a lost
message costs a re-queue and never work. The models are the schema's source of truth:
migrations follow them and a test checks that the two never drift.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    false,
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship, validates

from ..states import check_transition

__all__ = [
    "Base",
    "Run",
    "Story",
    "Attempt",
    "Candidate",
    "Event",
    "Lease",
    "DatabaseIdentity",
    "Flake",
    "TargetCheck",
    "utcnow",
]

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class UtcDateTime(TypeDecorator):
    """Stores naive UTC, returns aware UTC (SQLite drops the zone; PostgreSQL keeps it)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict: JSON, list: JSON}


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    project: Mapped[str] = mapped_column(Text)
    target_branch: Mapped[str] = mapped_column(String(255))
    # target_sha: where the target stood when the run started; head_sha: where it stands now.
    target_sha: Mapped[str] = mapped_column(String(64))
    head_sha: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), index=True)
    # The run's settings are its policy snapshot (`policy`); these three columns are
    # projections of it for SQL readers, written whenever the snapshot is (`_project_policy`).
    max_parallel: Mapped[int] = mapped_column(Integer, default=1)
    merge_strategy: Mapped[str] = mapped_column(String(16))
    isolation: Mapped[str] = mapped_column(String(16))
    selection: Mapped[dict] = mapped_column(JSON, default=dict)
    policy: Mapped[dict] = mapped_column(JSON, default=dict)
    board_path: Mapped[str] = mapped_column(Text)
    # The board's path inside the repository: how a consumer in another clone finds it.
    board_rel: Mapped[str | None] = mapped_column(Text)
    # Why the run is paused/stopped/failed, for humans and `status`.
    reason: Mapped[str | None] = mapped_column(Text)
    # How a stop was asked for: "graceful" (safe boundaries) or "now" (kill agent sessions).
    stop_mode: Mapped[str | None] = mapped_column(String(16))
    # Epic gates already passed (per-epic mode), as a list of epic ids ("1", "r", "3-5").
    gates_passed: Mapped[list] = mapped_column(JSON, default=list)
    # The epic whose gate the run is paused at (per-epic mode); `resume` passes it.
    gate_epic: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    host: Mapped[str | None] = mapped_column(String(255))

    stories: Mapped[list[Story]] = relationship(back_populates="run", order_by="Story.seq")

    @validates("state")
    def _check_state(self, _key: str, value: str) -> str:
        check_transition("run", self.state, value)
        return value

    @validates("policy")
    def _project_policy(self, _key: str, snapshot: dict[str, Any] | None) -> dict[str, Any] | None:
        scm = (snapshot or {}).get("scm", {})
        for column in PROJECTED_SCM_KEYS:
            if column in scm:
                setattr(self, column, scm[column])
        return snapshot


# The `[scm]` keys of a run's policy snapshot that are also columns of `runs`.
PROJECTED_SCM_KEYS = ("max_parallel", "merge_strategy", "isolation")


class Story(Base):
    __tablename__ = "stories"
    __table_args__ = (UniqueConstraint("run_id", "key"), UniqueConstraint("run_id", "seq"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    key: Mapped[str] = mapped_column(String(255))
    seq: Mapped[int] = mapped_column(Integer)  # plan order = integration order, fixed at enqueue
    epic: Mapped[str] = mapped_column(String(64))  # the BMAD epic id: "1", "r", "3-5"
    title: Mapped[str] = mapped_column(Text, default="")
    story_path: Mapped[str | None] = mapped_column(Text)  # repository-relative
    state: Mapped[str] = mapped_column(String(16), index=True)
    phase: Mapped[str | None] = mapped_column(String(16))
    footprint: Mapped[dict] = mapped_column(JSON, default=dict)
    footprint_reason: Mapped[str | None] = mapped_column(Text)
    depends_on: Mapped[list] = mapped_column(JSON, default=list)
    merge_class: Mapped[str] = mapped_column(String(16), default="self")
    tier: Mapped[str | None] = mapped_column(String(64))
    done_checkpoint: Mapped[bool] = mapped_column(Boolean, default=False)
    approved: Mapped[bool] = mapped_column(Boolean, default=False)  # spec approval before dev
    signed_off: Mapped[bool] = mapped_column(Boolean, default=False)  # operator sign-off (held)
    # Index of the port block handed to this story's worker ([resources] ports), while in flight.
    port_block: Mapped[int | None] = mapped_column(Integer)
    # Grows with every claim; a worker writes only while the row still carries its claim, so a
    # stalled worker that lost its story to recovery is fenced out.
    claim: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The row's version: the database adds one on every UPDATE of the row, whoever runs it (a
    # trigger, migration 0010), so the lane keeps rows across passes and reads again only those
    # whose `rev` moved (engine/runrows.py). Never written by the code.
    rev: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    worktree: Mapped[str | None] = mapped_column(Text)
    branch: Mapped[str | None] = mapped_column(String(255))
    base_sha: Mapped[str | None] = mapped_column(String(64))
    # A stacked start: the finished, unintegrated stories under `base_sha`, in plan order, each
    # {"key", "head"} (the head its layer was composed from). None: started on the target.
    stacked_on: Mapped[list | None] = mapped_column(JSON)
    # {path: text} a story added to a git-ignored union ledger, captured at ready and appended
    # to the checkout's copy once it lands (engine/mergerules.py). Null: none.
    ledger_lines: Mapped[dict | None] = mapped_column(JSON)
    head_sha: Mapped[str | None] = mapped_column(String(64))
    integrated_sha: Mapped[str | None] = mapped_column(String(64))
    dev_attempts: Mapped[int] = mapped_column(Integer, default=0)  # counted dev attempts
    review_cycles: Mapped[int] = mapped_column(Integer, default=0)
    # Repair sessions used in the current budget ([limits] max_repairs; `resume` resets it).
    repairs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Last verify failure / review notes, handed to the next attempt's prompt.
    feedback: Mapped[dict] = mapped_column(JSON, default=dict)
    # A human changed the escalated story's branch before `resume`: verify and integrate it
    # without the agent.
    human_fix: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The story file does not exist yet: the next worker runs the create phase before dev.
    to_create: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The phase the next verify follows (fix: a failing verify starts another fix cycle).
    after_phase: Mapped[str | None] = mapped_column(String(16))
    # What holds a pending story back (conflict, resource, gate); journaled when it changes.
    wait_reason: Mapped[str | None] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)  # why escalated / blocked / skipped / failed
    session: Mapped[str | None] = mapped_column(String(255))
    log: Mapped[str | None] = mapped_column(Text)
    host: Mapped[str | None] = mapped_column(String(255))
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    queued_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    started_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    ready_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)

    run: Mapped[Run] = relationship(back_populates="stories")

    @validates("state")
    def _check_state(self, _key: str, value: str) -> str:
        check_transition("story", self.state, value)
        return value


class Attempt(Base):
    """One agent session (dev, review or fix) of one story."""

    __tablename__ = "attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    story_id: Mapped[int] = mapped_column(ForeignKey("stories.id"), index=True)
    phase: Mapped[str] = mapped_column(String(16))
    number: Mapped[int] = mapped_column(Integer)  # BMAD_LOOP_ATTEMPT
    # running | succeeded | failed | timed-out | crashed | interrupted
    state: Mapped[str] = mapped_column(String(16))
    counted: Mapped[bool] = mapped_column(Boolean, default=True)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    worktree: Mapped[str | None] = mapped_column(Text)
    branch: Mapped[str | None] = mapped_column(String(255))
    base_sha: Mapped[str | None] = mapped_column(String(64))
    head_sha: Mapped[str | None] = mapped_column(String(64))
    session: Mapped[str | None] = mapped_column(String(255))
    log: Mapped[str | None] = mapped_column(Text)
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    started_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    duration_s: Mapped[float | None] = mapped_column(Float)
    # Why the attempt ended as it did ("no changes", "stalled", a CLI's own words for a limit).
    reason: Mapped[str | None] = mapped_column(Text)
    # Ran in the OS sandbox (bmad_loop.sandbox); NULL: recorded before it was known.
    boxed: Mapped[bool | None] = mapped_column(Boolean)
    # What the agent CLI reported it used; NULL where the CLI reports nothing.
    input_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    cache_read_tokens: Mapped[int | None] = mapped_column(Integer)
    cache_write_tokens: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)

    @validates("state")
    def _check_state(self, _key: str, value: str) -> str:
        check_transition("attempt", self.state, value)
        return value


class Candidate(Base):
    """One composition of one story onto the target (attempt 1, 2, … on recomposition)."""

    __tablename__ = "candidates"
    __table_args__ = (UniqueConstraint("story_id", "attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    story_id: Mapped[int] = mapped_column(ForeignKey("stories.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    strategy: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    ref: Mapped[str | None] = mapped_column(String(255))
    worktree: Mapped[str | None] = mapped_column(Text)
    target_sha: Mapped[str] = mapped_column(String(64))  # the target it was composed on
    branch_sha: Mapped[str | None] = mapped_column(String(64))
    candidate_sha: Mapped[str | None] = mapped_column(String(64))
    evidence: Mapped[str | None] = mapped_column(Text)  # path of a JSON file
    reason: Mapped[str | None] = mapped_column(Text)
    verify_s: Mapped[float | None] = mapped_column(Float)
    # Its place in the lane's stack of speculative candidates (1 = composed on the target) and
    # the candidate it was composed on (None: on the target itself).
    stack: Mapped[int | None] = mapped_column(Integer)
    on_candidate_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)

    @validates("state")
    def _check_state(self, _key: str, value: str) -> str:
        check_transition("candidate", self.state, value)
        return value


class Event(Base):
    """The journal: append-only, ordered by seq."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_run_id_seq", "run_id", "seq"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(40))
    ts: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(64), index=True)
    story: Mapped[str | None] = mapped_column(String(255))
    data: Mapped[dict] = mapped_column(JSON, default=dict)


class Flake(Base):
    """A verify command that failed and passed on a retry of the very same tree
    (`[verify] retries`): in a story's worktree, on a candidate, or on the target itself."""

    __tablename__ = "flakes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    story: Mapped[str | None] = mapped_column(String(255))  # None: the target's own check
    site: Mapped[str] = mapped_column(String(16))  # story | candidate | target
    attempt: Mapped[int | None] = mapped_column(Integer)  # the candidate's attempt
    command: Mapped[str] = mapped_column(Text)
    tree: Mapped[str | None] = mapped_column(String(64))  # the commit verified, where known
    retry: Mapped[int] = mapped_column(Integer)  # which retry passed (1: the first)
    failed_log: Mapped[str | None] = mapped_column(Text)
    passed_log: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)  # of the failed run
    at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)


class TargetCheck(Base):
    """The lane's check of the target itself, once per (run, target commit, failing command):
    a candidate composed on the target still failed after retries; `failed` = the target is red."""

    __tablename__ = "target_checks"
    __table_args__ = (UniqueConstraint("run_id", "target_sha", "command"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    target_sha: Mapped[str] = mapped_column(String(64))
    command: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))  # running | passed | failed
    story: Mapped[str | None] = mapped_column(String(255))  # whose candidate asked for it
    log: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)


class Lease(Base):
    """A named lease with a fencing token: the lane, or one in-flight worker attempt."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255))
    host: Mapped[str | None] = mapped_column(String(255))
    token: Mapped[int] = mapped_column(Integer, default=1)  # grows on every takeover
    acquired_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    renewed_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    expires_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)



class DatabaseIdentity(Base):
    """One row: this state database's random id, made at its first migration (0011). The
    repository's run records name the database owning each run by it (engine/run/ownership.py)."""

    __tablename__ = "database_identity"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
