"""Reading a run back from its rows: its policy snapshot, its stories, its board's path."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict, namedtuple
from pathlib import Path

from sqlalchemy import Text, bindparam, or_, select, type_coerce
from sqlalchemy.orm import Session

from ..db.models import Run, Story
from ..policy import Policy, policy_from_dict
from ..states import STORY_DONE, StoryState

__all__ = ["run_policy", "stories_of", "lane_rows", "next_in_plan", "path_inside", "board_rel"]


# (run id, snapshot text) -> its Policy, parsed once per process: the lane reads it every tick
# and each worker once per story, and a Policy is frozen, so one object serves every thread.
_policies: OrderedDict[tuple[str, str], Policy] = OrderedDict()
_policies_lock = threading.Lock()
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


def stories_of(session: Session, run_id: str) -> list[Story]:
    return list(session.scalars(select(Story).where(Story.run_id == run_id).order_by(Story.seq)))


# What the lane reads of every story on every pass (see `lane_rows`).
_LANE_COLUMNS = (Story.id, Story.key, Story.seq, Story.epic, Story.state, Story.footprint,
                 Story.footprint_reason, Story.depends_on, Story.approved, Story.to_create,
                 Story.wait_reason, Story.port_block, Story.reason, Story.done_checkpoint,
                 # stacked starts (stacking.py, restack.py)
                 Story.branch, Story.human_fix, Story.base_sha, Story.head_sha, Story.stacked_on,
                 Story.worktree)
# The JSON columns are read as stored and decoded here, each distinct text once (`_decoded`):
# decoding every open story's footprint on every pass made a pass cost grow with the sprint.
_JSON_COLUMNS = frozenset({"footprint", "depends_on", "stacked_on"})
_SELECTED = tuple(type_coerce(c, Text).label(c.key) if c.key in _JSON_COLUMNS else c
                  for c in _LANE_COLUMNS)
LaneRow = namedtuple("LaneRow", [c.key for c in _LANE_COLUMNS])
_JSON_AT = tuple(i for i, c in enumerate(_LANE_COLUMNS) if c.key in _JSON_COLUMNS)
_DECODED: dict[str, object] = {}
_DECODED_KEEP = 20_000
_decoded_lock = threading.Lock()


# A story in one of these states never changes again: its row, once read, is kept.
_SETTLED_FOR_GOOD = (StoryState.INTEGRATED, StoryState.SKIPPED)


# lane_rows's statements, built once: the lane runs them on every pass.
_OF_RUN = Story.run_id == bindparam("run_id")
_ALL_ROWS = select(*_SELECTED).where(_OF_RUN).order_by(Story.seq)
_SETTLED_IDS = select(Story.id).where(_OF_RUN, Story.state.in_(_SETTLED_FOR_GOOD))
_OPEN_ROWS = select(*_SELECTED).where(_OF_RUN, Story.state.not_in(_SETTLED_FOR_GOOD))
_OPEN_AND_NEW_ROWS = select(*_SELECTED).where(_OF_RUN, or_(
    Story.state.not_in(_SETTLED_FOR_GOOD), Story.id.in_(bindparam("new", expanding=True))))


def lane_rows(session: Session, run_id: str, kept: dict | None = None) -> list:
    """The run's stories in plan order as read-only rows of the columns the lane reads (same
    attribute names as `Story`). The lane reads them on every pass: building full ORM objects
    (forty columns, timestamps, JSON) costs several times more per story. Treat the rows and
    their JSON values as read-only: equal texts share one decoded value.

    `kept` (id -> row, the caller's across passes) holds the rows of integrated and skipped
    stories, which never change: only their ids are read again, so a pass late in a long run
    does not parse hundreds of finished footprints."""
    conn, run = session.connection(), {"run_id": run_id}
    if kept is None:
        return _rows(conn.execute(_ALL_ROWS, run))
    settled = set(conn.execute(_SETTLED_IDS, run).scalars())
    new = [i for i in settled if i not in kept]
    fresh = _rows(conn.execute(_OPEN_AND_NEW_ROWS, {**run, "new": new}) if new
                  else conn.execute(_OPEN_ROWS, run))
    for row in fresh:
        if row.state in _SETTLED_FOR_GOOD:
            kept[row.id] = row
    rows = fresh + [row for i, row in kept.items() if i in settled and i not in new]
    return sorted(rows, key=lambda row: row.seq)


def _rows(result) -> list:
    # Every open story's row on every pass: a text's decoded value is looked up without the
    # lock (a dict read is atomic), which is only taken to add one.
    out, make, known_values = [], LaneRow._make, _DECODED
    for raw in result:
        values = list(raw)
        for i in _JSON_AT:
            value = values[i]
            if value.__class__ is str:
                known = known_values.get(value, known_values)
                values[i] = _decoded(value) if known is known_values else known
        out.append(make(values))
    return out


def _decoded(value):
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


def next_in_plan(stories, pause_on_escalation: bool, after_seq: int | None = None):
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


def path_inside(path, root: Path) -> str | None:
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
