"""`bmad-loop validate`: every check enqueue would make, reported one by one instead of failing fast."""

from __future__ import annotations

from pathlib import Path

from ...bmad.board import ACTIONABLE
from ...git.trees.compose import dirty_paths
from ...db.database import check_driver, check_reachable
from ...db.sqlitefile import check_folder_writable, check_sqlite_file
from ...errors import BmadLoopError
from ...policy.schema import verify_advice
from ...bmad.selection import dependency_problems
from ...policy import env_override, load_policy
from ...agents.profiles import custom_command_warnings
from ...sandbox import startup_notes
from ...queue.tasks import check_queue, queue_config
from .agentcheck import bmad_checks, version_checks
from .creation import creation_checks
from ..mergerules import merge_rule_checks
from .planning import agent_command, target_branch_of
from ..project import Project
from .sprintload import Sprint, check_committed, load_sprint
from ..worker.usagefile import budget_warnings

__all__ = ["preflight"]


def preflight(root: Path) -> dict:
    checks: list[dict] = []

    def add(name, status, detail):
        checks.append({"name": name, "status": status, "detail": detail})

    policy = _check_policy(add, checks, root)
    if policy is None:
        return _report(checks)
    _check_sandbox(add, policy)
    project = Project(root=root, policy=policy)
    sha = branch = None
    found: dict = {}  # the board and the stories, for --json
    try:
        branch, sha = target_branch_of(project, policy)
        add("git", "ok", f"target branch {branch} at {sha[:10]}")
    except BmadLoopError as exc:
        add("git", "error", str(exc))
    if sha:
        _check_checkout(add, project, policy, branch)
    try:
        _check_state(project, policy)
        add("state", "ok", _state_detail(project, policy))
    except BmadLoopError as exc:
        add("state", "error", str(exc))
    _check_sprint(add, project, policy, sha, branch, found)
    try:
        argv = agent_command(policy, project, sha)
        add("agent", "ok", " ".join(argv))
        checks.extend(version_checks(policy))  # the profile's CLI against its checked release
    except BmadLoopError as exc:
        add("agent", "error", str(exc))
    try:
        bmad, seen = bmad_checks(project)
        checks.extend(bmad)
        found.update(seen)
    except BmadLoopError as exc:  # not a repository: the git check says so already
        add("bmad", "warn", f"cannot tell what is seeded: {exc}")
    return _report(checks, **found)


def _check_policy(add, checks: list, root: Path):
    """The policy, or None when it cannot be loaded; its warnings added."""
    try:
        policy = load_policy(root)
    except BmadLoopError as exc:
        add("policy", "error", str(exc))
        return None
    add("policy", "ok", policy.source)
    checks.extend(verify_advice(policy))  # warnings only (policy/schema.py)
    checks.extend({"name": "agent", "status": "warn", "detail": w}
                  for w in custom_command_warnings(policy.adapter))  # exit verdicts on a known CLI
    checks.extend({"name": "limits", "status": "warn", "detail": w}
                  for w in budget_warnings(policy))  # a budget nothing reports to
    return policy


def _check_sprint(add, project, policy, sha, branch, found: dict) -> None:
    """The board, its stories and their files, footprints, creation and merge rules. Every
    problem of a story file, a dependency or an override is its own line, and the checks after
    them still run: one pass shows them all."""
    try:
        problems: list[str] = []
        sprint = load_sprint(project, policy, sha, branch or "", problems=problems)
        board, stories = sprint.board, sprint.stories
        actionable = [s for s in stories if s.status in ACTIONABLE]
        problems += dependency_problems(stories, actionable)
        for problem in problems:
            add("stories", "error", problem)
        add("board", "ok", f"{sprint.source.rel or sprint.source.path} ({sprint.source.reason}); "
            f"story files in {sprint.folder.rel or '.'} ({sprint.folder.reason}); read from "
            f"{sprint.where}")
        if not problems:  # else each problem is its own FAIL line above
            add("stories", "ok", f"{board.path}: {len(stories)} stories, {len(actionable)} "
                f"actionable, {sum(1 for s in actionable if s.story_file)} with a story file")
        for warning in sprint.warnings:  # a story_location that had to be guessed
            add("stories", "warn", warning)
        found.update(_found(sprint, actionable))
        _check_committed(add, project, policy, sprint, actionable, branch if sha else None)
        for warning in board.warnings():  # unknown statuses, keys outside the grammar
            add("board", "warn", warning)
        for spec in actionable:
            # A story still to be created declares its footprint in the file create writes:
            # the `create` line speaks for it.
            refused = any(p.startswith(f"{spec.story_file}:") for p in problems)  # said above
            if spec.footprint.reason and spec.story_file is not None and not refused:
                add("footprint", "warn", f"story {spec.key}: footprint {spec.footprint.reason} "
                    "(treated as exclusive)")
        for status, detail in creation_checks(policy, actionable):
            add("create", status, detail)
        for status, detail in merge_rule_checks(project, policy, sprint.source.rel, sha):
            add("merge", status, detail)
    except BmadLoopError as exc:
        add("stories", "error", str(exc))


def _check_checkout(add, project, policy, branch: str) -> None:
    """A warning for local changes in the checkout of the target: a story whose candidate
    touches one of them escalates before the target moves (bmad-loop's own folder aside)."""
    git = project.git(policy)
    try:
        checkout = project.target(git, branch).checkout()
        dirty = sorted(p for p in dirty_paths(git, checkout) if not p.startswith(".bmad-loop/")) \
            if checkout is not None else []
    except BmadLoopError:
        return  # the git check speaks for the repository
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        add("checkout", "warn", f"{checkout}: {len(dirty)} uncommitted change(s) on {branch} "
            f"({shown}): a story whose candidate touches one escalates before {branch} moves; "
            "commit or stash them first")


def _check_state(project, policy) -> None:
    """What opening the state would refuse, without opening (or creating) anything: a missing
    driver, a damaged state.db or queue.db, a state folder that cannot be written."""
    key = _database_key(policy)
    check_driver(policy.database.url, key)
    check_queue(queue_config(project), policy.source)
    check_reachable(policy.database.url, key)
    if not policy.database.url:
        check_folder_writable(project.state_dir, "state folder")
        check_sqlite_file(project.home_state_dir / "state.db", "state database")


def _database_key(policy) -> str:
    """Where `[database] url` came from: its environment variable wins over the file."""
    return env_override("database", "url") or f"{policy.source}: [database] url"


def _state_detail(project, policy) -> str:
    url = policy.database.url  # its scheme only: a URL may hold a password
    database = url.split("://", 1)[0] if url else f"sqlite {project.home_state_dir / 'state.db'}"
    return f"database {database}, queue {policy.queue.backend}"


def _found(sprint: Sprint, actionable) -> dict:
    """Where the board was found and why, and per actionable story where its file is (or,
    without one, where the create phase will write it)."""
    source = sprint.source
    return {
        "board": {"path": source.rel if source.rel is not None else str(source.path),
                  "reason": source.reason, "format": source.format,
                  "story_folder": sprint.folder.rel, "story_folder_reason": sprint.folder.reason,
                  "read_from": sprint.where},
        "stories": [{"key": s.key, "status": s.status, "file": s.story_path,
                     "found": s.story_file is not None} for s in actionable],
    }


def _check_committed(add, project, policy, sprint: Sprint, actionable, branch) -> None:
    """The board and the actionable stories' files must be committed (`sprintload`)."""
    if branch is None:
        return  # no target commit to compare with: the git check failed already
    try:
        check_committed(project, policy, sprint, actionable, branch)
        add("committed", "ok", f"the board and story files are committed on {branch}")
    except BmadLoopError as exc:
        add("committed", "error", str(exc))


def _report(checks, **found):
    return {"ok": all(c["status"] != "error" for c in checks), "checks": checks, **found}


def _check_sandbox(add, policy) -> None:
    """The OS sandbox the policy asks for: ok, unboxed with a warning, or refused ("on")."""
    try:
        notes = startup_notes(policy)
    except BmadLoopError as exc:
        add("sandbox", "error", str(exc))
        return
    for note in notes:
        add("sandbox", "warn", note)
    if not notes:
        modes = {policy.adapter.sandbox, policy.verify.sandbox}
        add("sandbox", "ok", "off" if modes == {"off"} else "agents and verify commands run boxed"
            if "off" not in modes else "boxed where the policy asks for it")
