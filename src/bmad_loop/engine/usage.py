"""Tokens and cost as the agent CLIs reported them, summed from `attempts` for the read models.

Each attempt row holds its session's own report (`input_tokens`, `output_tokens`,
`cache_read_tokens`, `cache_write_tokens`, `cost_usd`; NULL where the CLI reported none, e.g.
codex and gemini report no cost). A sum over attempts none of which reported a value stays
None, so `status --json` and `history --json` say "not reported", never a made-up 0.
"""

from __future__ import annotations

from sqlalchemy import func, select

from ..agents.output import USAGE_COLUMNS
from ..db.models import Attempt

__all__ = ["USAGE_COLUMNS", "empty_usage", "usage_by_story", "usage_by_run", "usage_by_story_phase"]


def empty_usage() -> dict:
    return {name: None for name in USAGE_COLUMNS}


def _sums():
    return [func.sum(getattr(Attempt, name)) for name in USAGE_COLUMNS]


def _row(values) -> dict:
    out = {}
    for name, value in zip(USAGE_COLUMNS, values):
        if value is None:
            out[name] = None
        elif name == "cost_usd":
            out[name] = round(float(value), 6)
        else:
            out[name] = int(value)
    return out


def usage_by_story(session, run_id: str) -> dict[int, dict]:
    """Story id -> its summed usage, for one run."""
    rows = session.execute(select(Attempt.story_id, *_sums()).where(Attempt.run_id == run_id)
                           .group_by(Attempt.story_id)).all()
    return {row[0]: _row(row[1:]) for row in rows}


def usage_by_run(session, run_ids) -> dict[str, dict]:
    """Run id -> its summed usage."""
    ids = list(run_ids)
    if not ids:
        return {}
    rows = session.execute(select(Attempt.run_id, *_sums()).where(Attempt.run_id.in_(ids))
                           .group_by(Attempt.run_id)).all()
    return {row[0]: _row(row[1:]) for row in rows}


def usage_by_story_phase(session, run_id: str) -> dict[tuple[int, str], dict]:
    """(story id, phase) -> the summed usage of that story's sessions of that phase."""
    rows = session.execute(select(Attempt.story_id, Attempt.phase, *_sums())
                           .where(Attempt.run_id == run_id)
                           .group_by(Attempt.story_id, Attempt.phase)).all()
    return {(row[0], row[1]): _row(row[2:]) for row in rows}
