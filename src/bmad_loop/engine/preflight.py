"""`bmad-loop validate`: every check enqueue would make, reported one by one instead of failing fast."""

from __future__ import annotations

from pathlib import Path

from ..board import ACTIONABLE
from ..db.database import check_driver
from ..db.sqlitefile import check_folder_writable, check_sqlite_file
from ..errors import BmadLoopError
from ..operator.advice import verify_advice
from ..selection import check_dependencies
from ..policy import load_policy
from ..tasks import check_queue, queue_config
from .creation import creation_checks
from .planning import agent_command, load_board_and_stories, target_branch_of
from .project import Project

__all__ = ["preflight"]


def preflight(root: Path) -> dict:
    checks: list[dict] = []

    def add(name, status, detail):
        checks.append({"name": name, "status": status, "detail": detail})

    try:
        policy = load_policy(root)
        add("policy", "ok", policy.source)
        checks.extend(verify_advice(policy))  # warnings only (operator/advice.py)
    except BmadLoopError as exc:
        add("policy", "error", str(exc))
        return _report(checks)
    project = Project(root=root, policy=policy)
    sha = None
    try:
        branch, sha = target_branch_of(project, policy)
        add("git", "ok", f"target branch {branch} at {sha[:10]}")
    except BmadLoopError as exc:
        add("git", "error", str(exc))
    try:
        _check_state(project, policy)
        add("state", "ok", _state_detail(project, policy))
    except BmadLoopError as exc:
        add("state", "error", str(exc))
    try:
        board, stories = load_board_and_stories(project, policy)
        check_dependencies(stories, [s for s in stories if s.status in ACTIONABLE])
        actionable = [s for s in stories if s.status in ACTIONABLE]
        add("stories", "ok", f"{board.path}: {len(stories)} stories, {len(actionable)} actionable")
        for warning in board.warnings():  # unknown statuses, keys outside the grammar
            add("board", "warn", warning)
        for spec in actionable:
            if spec.footprint.reason:
                add("footprint", "warn", f"story {spec.key}: footprint {spec.footprint.reason} "
                    "(treated as exclusive)")
        for status, detail in creation_checks(policy, actionable):
            add("create", status, detail)
    except BmadLoopError as exc:
        add("stories", "error", str(exc))
    try:
        argv = agent_command(policy, project, sha)
        add("agent", "ok", " ".join(argv))
    except BmadLoopError as exc:
        add("agent", "error", str(exc))
    return _report(checks)


def _check_state(project, policy) -> None:
    """What opening the state would refuse, without opening (or creating) anything: a missing
    driver, a damaged state.db or queue.db, a state folder that cannot be written."""
    check_driver(policy.database.url, f"{policy.source}: [database] url")
    check_queue(queue_config(project), policy.source)
    if not policy.database.url:
        check_folder_writable(project.state_dir, "state folder")
        check_sqlite_file(project.home_state_dir / "state.db", "state database")


def _state_detail(project, policy) -> str:
    url = policy.database.url  # its scheme only: a URL may hold a password
    database = url.split("://", 1)[0] if url else f"sqlite {project.home_state_dir / 'state.db'}"
    return f"database {database}, queue {policy.queue.backend}"


def _report(checks):
    return {"ok": all(c["status"] != "error" for c in checks), "checks": checks}
