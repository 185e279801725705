"""What holds each pending story back: the lane writes it on the rows and journals a change
(`story.waiting`) once.

One UPDATE per distinct reason, built once (as the lane's reads). A pass may admit twice on the
same rows (fill free slots first, then dispatch): `told` (story id -> (row rev, reason) the
lane already wrote) keeps the second from journaling the same wait again.
"""

from __future__ import annotations

from sqlalchemy import bindparam, update

from ...db.models import Story
from ..journal import record

__all__ = ["write_wait_reasons", "reasons_told"]

_STORIES = Story.__table__
_SET_WAIT_REASON = (update(_STORIES).where(_STORIES.c.id.in_(bindparam("ids", expanding=True)))
                    .values(wait_reason=bindparam("why")))


def write_wait_reasons(s, run_id: str, waiting: dict[str, str], by_key: dict, told: dict) -> None:
    """Write and journal each waiting story's reason that changed (`waiting`: key -> reason)."""
    changed: dict[str, list[int]] = {}  # reason -> ids: no row loaded
    for key, why in waiting.items():
        row = by_key[key]
        if row.wait_reason != why and told.get(row.id) != (row.rev, why):
            changed.setdefault(why, []).append(row.id)
            record(s, run_id, "story.waiting", key, reason=why)
    for why, ids in changed.items():
        s.connection().execute(_SET_WAIT_REASON, {"ids": ids, "why": why})


def reasons_told(waiting: dict[str, str], by_key: dict) -> dict[int, tuple[int, str]]:
    """What `write_wait_reasons` wrote on these rows, for `told` once its transaction is in."""
    return {by_key[key].id: (by_key[key].rev, why) for key, why in waiting.items()}
