"""Tokens and cost: as an agent reported them (its CLI's output, or a custom command's usage
file), summed from `attempts` for the read models, and budgets that could never trip.

Each attempt row holds its session's own report (`input_tokens`, `output_tokens`,
`cache_read_tokens`, `cache_write_tokens`, `cost_usd`; NULL where the CLI reported none, e.g.
codex and gemini report no cost). A sum over attempts none of which reported a value stays
None, so `status --json` and `history --json` say "not reported", never a made-up 0.

**The usage file.** A profile's CLI reports tokens and cost in its output (agents/output.py); a
custom command cannot be read that way. One that declares `[adapter] reports_usage = true`
writes one JSON object to the file named by `BMAD_LOOP_USAGE_FILE` (in the story's scratch
folder, one file per session): `input_tokens`, `output_tokens`, `cache_read_tokens`,
`cache_write_tokens` (whole numbers >= 0) and `cost_usd` (a number >= 0), each optional; other
keys are ignored. It is read like a profile's report, so `[limits]` budgets trip on it. A file
that is not such an object (bad JSON, a wrong type, a negative count, a symlink, larger than
`MAX_BYTES`) records nothing for the session and is journaled (`usage.invalid`, with the
reason): the session itself is judged as usual. A session that reported nothing while a budget
is set is journaled too (`usage.missing`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.sql.functions import Function
from sqlalchemy.orm import Session

from ..agents.output import USAGE_COLUMNS, Usage
from ..db.models import Attempt
from ..fileio import LinkRefused, read_beneath
from ..policy import AdapterPolicy, Policy

# One row of summed usage: each of USAGE_COLUMNS, None where no session reported it.
UsageSums = dict[str, float | None]

__all__ = ["USAGE_COLUMNS", "empty_usage", "usage_by_story", "usage_by_run", "usage_by_story_phase",
           "USAGE_FILE_VAR", "MAX_BYTES", "usage_file", "read_usage_file", "budget_warnings",
           "budget_set"]


def empty_usage() -> UsageSums:
    return {name: None for name in USAGE_COLUMNS}


def _sums() -> list[Function[Any]]:
    return [func.sum(getattr(Attempt, name)) for name in USAGE_COLUMNS]


def _row(values: Sequence[Any]) -> UsageSums:
    out: UsageSums = {}
    for name, value in zip(USAGE_COLUMNS, values):
        if value is None:
            out[name] = None
        elif name == "cost_usd":
            out[name] = round(float(value), 6)
        else:
            out[name] = int(value)
    return out


def usage_by_story(session: Session, run_id: str) -> dict[int, UsageSums]:
    """Story id -> its summed usage, for one run."""
    rows = session.execute(select(Attempt.story_id, *_sums()).where(Attempt.run_id == run_id)
                           .group_by(Attempt.story_id)).all()
    return {row[0]: _row(row[1:]) for row in rows}


def usage_by_run(session: Session, run_ids: Iterable[str]) -> dict[str, UsageSums]:
    """Run id -> its summed usage."""
    ids = list(run_ids)
    if not ids:
        return {}
    rows = session.execute(select(Attempt.run_id, *_sums()).where(Attempt.run_id.in_(ids))
                           .group_by(Attempt.run_id)).all()
    return {row[0]: _row(row[1:]) for row in rows}


def usage_by_story_phase(session: Session, run_id: str) -> dict[tuple[int, str], UsageSums]:
    """(story id, phase) -> the summed usage of that story's sessions of that phase."""
    rows = session.execute(select(Attempt.story_id, Attempt.phase, *_sums())
                           .where(Attempt.run_id == run_id)
                           .group_by(Attempt.story_id, Attempt.phase)).all()
    return {(row[0], row[1]): _row(row[2:]) for row in rows}


USAGE_FILE_VAR = "BMAD_LOOP_USAGE_FILE"
MAX_BYTES = 64 * 1024  # one small object; anything larger is not read into memory
_COUNTS = tuple(name for name in USAGE_COLUMNS if name != "cost_usd")


def usage_file(scratch: Path, phase: str, number: int) -> Path:
    """Where the session `phase`-`number` of a story writes its usage (in its scratch state)."""
    return scratch / "state" / f"usage-{phase}-{number}.json"


def read_usage_file(path: Path, scratch: Path | None = None) -> tuple[Usage, str | None]:
    """(the usage the file reports, None) or (nothing, why the file was refused). A missing file
    is (nothing, None): the command reported no usage. `scratch`: the folder `path` is in,
    which bmad-loop trusts; no link below it is followed (the box writes the scratch)."""
    root, rel = (Path(scratch), Path(path).relative_to(scratch)) if scratch is not None \
        else (Path(path).parent, Path(Path(path).name))
    try:
        data = read_beneath(root, str(rel), limit=MAX_BYTES)
    except LinkRefused as exc:
        return Usage(), f"cannot be read ({exc}; a symlink is refused)"
    except OSError as exc:
        return Usage(), f"cannot be read ({exc.strerror})"
    if data is None:
        return Usage(), None
    if len(data) > MAX_BYTES:
        return Usage(), f"is larger than {MAX_BYTES} bytes"
    try:
        report = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return Usage(), f"is not JSON ({str(exc)[:120]})"
    if not isinstance(report, dict):
        return Usage(), f"holds a JSON {type(report).__name__}, not an object"
    return _usage_of(report)


def _usage_of(report: dict[str, Any]) -> tuple[Usage, str | None]:
    values: dict[str, Any] = {}
    for name in _COUNTS:
        value = report.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 2 ** 63:
            return Usage(), f"{name} must be a whole number >= 0, got {json.dumps(value)[:40]}"
        values[name] = value
    cost = report.get("cost_usd")
    if cost is not None:
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost < 1e12:
            return Usage(), f"cost_usd must be a number >= 0, got {json.dumps(cost)[:40]}"
        values["cost_usd"] = float(cost)
    return Usage(**values), None


def budget_set(policy: Policy) -> bool:
    limits = policy.limits
    return limits.max_cost_per_run is not None or limits.max_tokens_per_story is not None


def budget_warnings(policy: Policy) -> list[str]:
    """A budget set for an agent that does not report usage can never trip: say so, naming
    both keys. The agent reports when every phase runs a profile's CLI, or the custom
    command declares `[adapter] reports_usage`."""
    adapter = policy.adapter
    custom = [where for where, command in _commands(adapter) if command]
    if not budget_set(policy) or not custom or adapter.reports_usage:
        return []
    limits = policy.limits
    keys = [f"[limits] {name}" for name in ("max_cost_per_run", "max_tokens_per_story")
            if getattr(limits, name) is not None]
    return [f"{' and '.join(keys)} can never trip: {', '.join(custom)} reports no usage "
            f"([adapter] reports_usage = false); have it write its tokens and cost to "
            f"${USAGE_FILE_VAR} and set [adapter] reports_usage = true"]


def _commands(adapter: AdapterPolicy) -> Iterator[tuple[str, tuple[str, ...] | None]]:
    yield "[adapter] command", adapter.command
    for phase in ("create", "dev", "review", "fix"):
        yield f"[adapter.{phase}] command", adapter.phase(phase).command
