"""Flakes: a verify command that failed, then passed on a retry of the very same tree.

One place writes them, whoever verified (a story's worker, the lane's candidate verification,
the target check): a `flakes` row (the `v_flaky_commands` view counts them per command) and a
`verify.flaky` journal event naming the command and both logs, in the caller's transaction.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from ...db.models import Flake
from ..journal import record

__all__ = ["SITES", "record_flakes"]

SITES = ("story", "candidate", "target")  # where the flaky verification ran


def record_flakes(s: Session, run_id: str, story: str | None, site: str, flakes, *,
                  attempt: int | None = None, tree: str | None = None) -> None:
    """Write each of `flakes` (`verify.Flaky`) as a row and a journal event."""
    if site not in SITES:
        raise ValueError(f"unknown verify site {site!r}")
    for flaky in flakes:
        s.add(Flake(run_id=run_id, story=story, site=site, attempt=attempt, command=flaky.command,
                    tree=tree, retry=flaky.retry, failed_log=flaky.failed_log,
                    passed_log=flaky.passed_log, exit_code=flaky.exit_code))
        record(s, run_id, "verify.flaky", story, site=site, tree=tree,
               **({"attempt": attempt} if attempt is not None else {}), **flaky.event_data())
