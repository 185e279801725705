"""Reading a run back from its rows: its policy snapshot, its stories, its board's path."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

from sqlalchemy import Result, Text, bindparam, select, type_coerce
from sqlalchemy.orm import Session

from ..db.models import Run, Story
from ..policy import Policy, policy_from_dict
from ..states import STORY_DONE, StoryState
from ..caches import CACHES

__all__ = ["RUN_STATE", "run_policy", "stories_of", "lane_rows", "LaneRow", "StoryRow",
           "next_in_plan", "path_inside", "board_rel"]


# (run id, snapshot text) -> its Policy, parsed once per process: the lane reads it every tick
# and each worker once per story, and a Policy is frozen, so one object serves every thread.
_policies: OrderedDict[tuple[str, str], Policy] = OrderedDict()
_policies_lock = threading.Lock()
CACHES.register("engine.run_policies", _policies.clear, bound="a few runs (LRU)",
               holds="(run id, snapshot text) -> its frozen Policy")
_KEPT_POLICIES = 8


def run_policy(run: Run) -> Policy:
    """The policy snapshot taken at enqueue: a resumed run keeps its settings. A snapshot
    that does not validate raises every time it is asked for (nothing is kept of it)."""
    key = (run.id, json.dumps(run.policy, sort_keys=True))
    with _policies_lock:
        known = _policies.get(key)
        if known is not None:
            _policies.move_to_end(key)
            return known
    policy = policy_from_dict(run.policy, source=f"run {run.id} policy snapshot", env={})
    with _policies_lock:
        _policies[key] = policy
        while len(_policies) > _KEPT_POLICIES:
            _policies.popitem(last=False)
    return policy


# The run's state, by the parameter `of_run`, built once: the driver polls it after each lane
# tick, and as a subquery it guards a story's transitions (worker/context.py, lane/aftermath.py).
# Not `run_id`: an UPDATE of stories refuses a parameter named like one of its columns.
RUN_STATE = select(Run.state).where(Run.id == bindparam("of_run"))


def stories_of(session: Session, run_id: str) -> list[Story]:
    return list(session.scalars(select(Story).where(Story.run_id == run_id).order_by(Story.seq)))


# What the lane reads of every story (see `lane_rows`); `rev` says when a kept row is stale.
_LANE_COLUMNS = (Story.id, Story.rev, Story.key, Story.seq, Story.epic, Story.state,
                 Story.footprint, Story.footprint_reason, Story.depends_on, Story.approved,
                 Story.to_create, Story.wait_reason, Story.port_block, Story.reason,
                 Story.done_checkpoint, Story.phase,
                 # stacked starts and restacking (lane/stacking.py)
                 Story.branch, Story.human_fix, Story.base_sha, Story.head_sha, Story.stacked_on,
                 Story.worktree)
# The JSON columns are read as stored and decoded here, each distinct text once (`_decoded`):
# decoding every open story's footprint on every pass made a pass cost grow with the sprint.
_JSON_COLUMNS = frozenset({"footprint", "depends_on", "stacked_on"})
_SELECTED = tuple(type_coerce(c, Text).label(c.key) if c.key in _JSON_COLUMNS else c
                  for c in _LANE_COLUMNS)


class LaneRow(NamedTuple):
    """A story as the lane reads it: the columns of `_LANE_COLUMNS`, in their order."""

    id: int
    rev: int
    key: str
    seq: int
    epic: str
    state: str
    footprint: dict[str, Any]
    footprint_reason: str | None
    depends_on: list[str]
    approved: bool
    to_create: bool
    wait_reason: str | None
    port_block: int | None
    reason: str | None
    done_checkpoint: bool
    phase: str | None
    branch: str | None
    human_fix: bool
    base_sha: str | None
    head_sha: str | None
    stacked_on: list[dict[str, str]] | None
    worktree: str | None


if LaneRow._fields != tuple(c.key for c in _LANE_COLUMNS):  # the two lists are kept together
    raise RuntimeError("LaneRow's fields are not the lane's columns")
_JSON_AT = tuple(i for i, c in enumerate(_LANE_COLUMNS) if c.key in _JSON_COLUMNS)
_DECODED: dict[str, object] = {}
_DECODED_KEEP = 20_000
CACHES.register("engine.decoded_json", _DECODED.clear, bound=f"{_DECODED_KEEP} texts",
               holds="a JSON column's text -> its decoded value, shared read-only")
_decoded_lock = threading.Lock()

# lane_rows's statements, built once: the lane runs them on every pass.
_OF_RUN = Story.run_id == bindparam("run_id")
_ALL_ROWS = select(*_SELECTED).where(_OF_RUN).order_by(Story.seq)
_VERSIONS = select(Story.id, Story.rev).where(_OF_RUN).order_by(Story.seq)
_ROWS_BY_ID = select(*_SELECTED).where(Story.id.in_(bindparam("ids", expanding=True)))
# Past this many stale rows one read of them all is cheaper than naming each (and a first
# pass names no long list of ids).
_READ_ALL_FROM = 64


def lane_rows(session: Session, run_id: str,
              kept: dict[int, LaneRow] | None = None) -> list[LaneRow]:
    """The run's stories in plan order as read-only rows of the columns the lane reads (same
    attribute names as `Story`). The lane reads them on every pass: building full ORM objects
    (forty columns, timestamps, JSON) costs several times more per story. Treat the rows and
    their JSON values as read-only: equal texts share one decoded value.

    `kept` (id -> row, the caller's across passes): the rows read before. Only each story's
    `rev` is read, and a row again only when its `rev` moved (any UPDATE moves it: a trigger,
    migration 0010), so a pass costs one narrow read plus what changed since the last one,
    however many stories wait."""
    conn, run = session.connection(), {"run_id": run_id}
    if kept is None:
        return _rows(conn.execute(_ALL_ROWS, run))
    versions = conn.execute(_VERSIONS, run).all()
    current: dict[int, LaneRow] = {}  # this pass's rows: the caller's dict may be updated by another pass meanwhile
    for story_id, rev in versions:
        row = kept.get(story_id)
        if row is not None and row.rev == rev:
            current[story_id] = row
    stale = [story_id for story_id, _ in versions if story_id not in current]
    if stale:
        fresh = (conn.execute(_ALL_ROWS, run) if len(stale) >= _READ_ALL_FROM
                 else conn.execute(_ROWS_BY_ID, {"ids": stale}))
        for row in _rows(fresh):
            current[row.id] = kept[row.id] = row
    if len(kept) > len(versions):  # never in a run's life; a kept row must not outlive its story
        for story_id in [i for i in kept if i not in current]:
            del kept[story_id]
    return [current[story_id] for story_id, _ in versions if story_id in current]


def _rows(result: Result[Any]) -> list[LaneRow]:
    # Every open story's row on every pass: a text's decoded value is looked up without the
    # lock (a dict read is atomic), which is only taken to add one.
    out: list[LaneRow] = []
    make, known_values = LaneRow._make, _DECODED
    for raw in result:
        values = list(raw)
        for i in _JSON_AT:
            value = values[i]
            if value.__class__ is str:
                known = known_values.get(value, known_values)
                values[i] = _decoded(value) if known is known_values else known
        out.append(make(values))
    return out


def _decoded(value: object) -> object:
    """A JSON column's value: SQLite hands back the stored text, PostgreSQL the decoded value."""
    if not isinstance(value, str):
        return value
    with _decoded_lock:
        known = _DECODED.get(value, _DECODED)
        if known is _DECODED:
            known = json.loads(value)
            if len(_DECODED) >= _DECODED_KEEP:
                _DECODED.clear()
            _DECODED[value] = known
    return known


class PlanRow(Protocol):
    """What `next_in_plan` reads of a story: a `Story` or a `LaneRow`."""

    @property
    def seq(self) -> int: ...

    @property
    def state(self) -> str: ...


class StoryRow(PlanRow, Protocol):
    """A story as both its ORM row (`Story`) and the lane's read (`LaneRow`) show it: what the
    lane and the workspace read of a story they were handed either way."""

    @property
    def id(self) -> int: ...

    @property
    def key(self) -> str: ...

    @property
    def epic(self) -> str: ...

    @property
    def phase(self) -> str | None: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def branch(self) -> str | None: ...

    @property
    def worktree(self) -> str | None: ...

    @property
    def base_sha(self) -> str | None: ...

    @property
    def head_sha(self) -> str | None: ...

    @property
    def stacked_on(self) -> list[dict[str, str]] | None: ...

    @property
    def done_checkpoint(self) -> bool: ...

    @property
    def human_fix(self) -> bool: ...


_Row = TypeVar("_Row", bound=PlanRow)


def next_in_plan(stories: Iterable[_Row], pause_on_escalation: bool,
                 after_seq: int | None = None) -> _Row | None:
    """The earliest story in plan order (after `after_seq`) that integration must deal with
    next, or None when the scan stops before any: integration is in plan order, so a held
    story stops it, and so does an escalated or blocked one when escalation pauses the run."""
    for story in stories:
        if after_seq is not None and story.seq <= after_seq:
            continue
        if story.state in STORY_DONE:
            continue
        if story.state == StoryState.HELD:
            return None
        if story.state in (StoryState.ESCALATED, StoryState.BLOCKED):
            if pause_on_escalation:
                return None
            continue
        return story
    return None


def path_inside(path: str | Path, root: Path) -> str | None:
    """`path` relative to `root` (POSIX form), None when it lies outside."""
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return None


def board_rel(run: Run, root: Path) -> str | None:
    """The board's path inside the repository (runs made before `board_rel` existed: derived;
    a BMAD v4 run records its story folder, not a YAML board, and has none)."""
    if run.board_rel or not str(run.board_path).endswith((".yaml", ".yml")):
        return run.board_rel
    return path_inside(run.board_path, root)
