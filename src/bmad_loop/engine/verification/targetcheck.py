"""The target checked on its own: does a candidate's failing command fail on the target too?

A candidate composed on the target (the bottom of the stack) failed verification even after its
retries. Before the story is blamed, the lane runs the failing command on the target's own commit
— with the commands before it, which may build what it needs — in a detached worktree made
exactly that commit (`candidates/<run>/target`, removed afterwards; never the user's checkout),
boxed like the candidate's verification and under the same retries. If the target fails too, the
failure is inherited: the target is red and no story is to blame (engine/lane/blame.py
decides what follows; this module only runs the check and keeps its verdict).

The result is kept per (run, target SHA, command) in `target_checks`: `running` while it runs,
then `passed` or `failed`, so a target is checked once per commit and command. A row left
`running` by a lane that died is run again; `resume` drops the failed rows of its run, so a
target someone fixed outside the tree (a service back up) is checked again.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Sequence, cast

from sqlalchemy import CursorResult, delete, select
from sqlalchemy.orm import Session

from ...db.models import TargetCheck, utcnow
from ...git.worktrees import make_exact
from ...git.worktrees import ensure_detached_worktree, remove_worktree
from ..journal import EventKind, record
from .runner import LaneVerifier, VerifyResult, record_flakes
from ...db.database import Database

__all__ = ["RUNNING", "PASSED", "FAILED", "CheckKey", "commands_through", "recorded", "begin",
           "run_check", "finish", "forget_failed"]

log = logging.getLogger(__name__)

RUNNING, PASSED, FAILED = "running", "passed", "failed"


@dataclass(frozen=True)
class CheckKey:
    """One check: the failing `command` on the target commit `target_sha`."""

    target_sha: str
    command: str


def commands_through(commands: Sequence[str], failed: str) -> tuple[str, ...]:
    """The verify commands up to and including `failed` (all of them if it is not one: the
    check then runs what the candidate ran)."""
    commands = tuple(commands)
    return commands[: commands.index(failed) + 1] if failed in commands else commands


def _row(session: Session, run_id: str, key: CheckKey) -> TargetCheck | None:
    return session.scalars(select(TargetCheck).where(
        TargetCheck.run_id == run_id, TargetCheck.target_sha == key.target_sha,
        TargetCheck.command == key.command)).first()


def recorded(db: Database, run_id: str, key: CheckKey) -> TargetCheck | None:
    with db.read() as s:
        return _row(s, run_id, key)


def begin(db: Database, run_id: str, key: CheckKey, story: str) -> None:
    """The check's row, `running` (a row a dead lane left running is taken over)."""
    with db.transaction() as s:
        row = _row(s, run_id, key)
        if row is None:
            s.add(TargetCheck(run_id=run_id, target_sha=key.target_sha, command=key.command,
                              state=RUNNING, story=story, started_at=utcnow()))
        else:
            row.state, row.story, row.started_at, row.ended_at = RUNNING, story, utcnow(), None


def run_check(verifier: LaneVerifier, key: CheckKey, env: dict[str, str],
              stop_event: threading.Event | None = None) -> VerifyResult:
    """Run the check in the target's worktree (made exactly `key.target_sha`, and again for
    each retry), then remove it."""
    git, layout = verifier.git, verifier.layout
    commands = commands_through(verifier.policy.verify.commands, key.command)
    worktree = layout.target_worktree()
    ensure_detached_worktree(git, worktree, key.target_sha)
    try:
        return verifier.verify_tree(
            commands, worktree, layout.target_log(key.target_sha), layout.target_scratch(), env,
            stop_event=stop_event, exact_sha=key.target_sha)
    finally:
        try:
            remove_worktree(git, worktree)
        except Exception:  # debris only: the next check makes it exact again, `cleanup` removes it
            log.warning("could not remove the target check's worktree %s", worktree, exc_info=True)


def finish(db: Database, run_id: str, key: CheckKey, result: VerifyResult) -> str:
    """Write the check's verdict (and its flakes); `passed` or `failed`."""
    state = PASSED if result.ok else FAILED
    with db.transaction() as s:
        row = _row(s, run_id, key)
        if row is None:  # dropped meanwhile (a resume): write it again
            row = TargetCheck(run_id=run_id, target_sha=key.target_sha, command=key.command,
                              started_at=utcnow())
            s.add(row)
        row.state, row.log, row.exit_code, row.ended_at = state, result.log, result.exit_code, utcnow()
        record_flakes(s, run_id, None, "target", result.flakes, tree=key.target_sha)
        record(s, run_id, EventKind.TARGET_CHECKED, row.story, target_sha=key.target_sha,
               command=key.command, state=state, log=result.log,
               failed_command=result.failed_command, exit_code=result.exit_code)
    return state


def forget_failed(session: Session, run_id: str) -> int:
    """`resume`: the run's failed target checks are dropped, so a red target is checked again."""
    result = session.execute(delete(TargetCheck).where(
        TargetCheck.run_id == run_id, TargetCheck.state == FAILED))
    return cast("CursorResult[Any]", result).rowcount or 0  # a DELETE's result is a cursor's
