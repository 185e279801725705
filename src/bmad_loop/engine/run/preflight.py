"""`bmad-loop validate`: every check enqueue would make, reported one by one instead of failing fast.

It also looks at the agent CLI and the BMAD install the sessions will meet. A profile's flags
were checked against one release of its CLI (`checked_version`); an older CLI may lack a flag
and fail every story, so `validate` asks the binary for its version (one short `--version`
call) and says how it compares. It also says which BMAD the project has and what is seeded
into each worktree (bmad/install.py).
"""

from __future__ import annotations

from pathlib import Path
import re
import shutil
import subprocess
from typing import Any, Callable, Sequence

from ...bmad.board import ACTIONABLE
from ...git.trees.compose import dirty_paths
from ...db.database import check_driver, check_reachable
from ...db.sqlitefile import check_folder_writable, check_sqlite_file
from ...errors import BmadLoopError
from ...policy.schema import verify_advice
from ...bmad.selection import StorySpec, dependency_problems
from ...policy import env_override, load_policy
from ...agents.profiles import custom_command_warnings, load_profile
from ...sandbox import startup_notes
from ...queue.tasks import check_queue, queue_config
from .planning import creation_checks
from ..mergerules import merge_rule_checks
from .planning import agent_command, target_branch_of
from ..project import Project
from .planning import Sprint, check_committed, load_sprint
from ..usage import budget_warnings
from ...bmad.install import bmad_seeds, detect_bmad
from ...policy import Policy

__all__ = ["preflight", "cli_version", "version_checks", "bmad_checks"]

# `add(name, status, detail)`: one line of the report.
Add = Callable[[str, str, str], None]


def preflight(root: Path) -> dict[str, Any]:
    checks: list[dict[str, Any]] = []

    def add(name: str, status: str, detail: str) -> None:
        checks.append({"name": name, "status": status, "detail": detail})

    policy = _check_policy(add, checks, root)
    if policy is None:
        return _report(checks)
    _check_sandbox(add, policy)
    project = Project(root=root, policy=policy)
    sha: str | None = None
    branch: str | None = None
    found: dict[str, Any] = {}  # the board and the stories, for --json
    try:
        branch, sha = target_branch_of(project, policy)
        add("git", "ok", f"target branch {branch} at {sha[:10]}")
    except BmadLoopError as exc:
        add("git", "error", str(exc))
    if sha:
        assert branch is not None  # found with the sha
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


def _check_policy(add: Add, checks: list[dict[str, Any]], root: Path) -> Policy | None:
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


def _check_sprint(add: Add, project: Project, policy: Policy, sha: str | None,
                  branch: str | None, found: dict[str, Any]) -> None:
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


def _check_checkout(add: Add, project: Project, policy: Policy, branch: str) -> None:
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


def _check_state(project: Project, policy: Policy) -> None:
    """What opening the state would refuse, without opening (or creating) anything: a missing
    driver, a damaged state.db or queue.db, a state folder that cannot be written."""
    key = _database_key(policy)
    check_driver(policy.database.url, key)
    check_queue(queue_config(project), policy.source)
    check_reachable(policy.database.url, key)
    if not policy.database.url:
        check_folder_writable(project.state_dir, "state folder")
        check_sqlite_file(project.home_state_dir / "state.db", "state database")


def _database_key(policy: Policy) -> str:
    """Where `[database] url` came from: its environment variable wins over the file."""
    return env_override("database", "url") or f"{policy.source}: [database] url"


def _state_detail(project: Project, policy: Policy) -> str:
    url = policy.database.url  # its scheme only: a URL may hold a password
    database = url.split("://", 1)[0] if url else f"sqlite {project.home_state_dir / 'state.db'}"
    return f"database {database}, queue {policy.queue.backend}"


def _found(sprint: Sprint, actionable: Sequence[StorySpec]) -> dict[str, Any]:
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


def _check_committed(add: Add, project: Project, policy: Policy, sprint: Sprint,
                     actionable: Sequence[StorySpec], branch: str | None) -> None:
    """The board and the actionable stories' files must be committed (`check_committed`, planning.py)."""
    if branch is None:
        return  # no target commit to compare with: the git check failed already
    try:
        check_committed(project, policy, sprint, actionable, branch)
        add("committed", "ok", f"the board and story files are committed on {branch}")
    except BmadLoopError as exc:
        add("committed", "error", str(exc))


def _report(checks: list[dict[str, Any]], **found: Any) -> dict[str, Any]:
    return {"ok": all(c["status"] != "error" for c in checks), "checks": checks, **found}


def _check_sandbox(add: Add, policy: Policy) -> None:
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


_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def cli_version(binary: str, timeout_s: float = 10.0) -> str | None:
    """The first line `binary --version` prints, or None when it cannot tell."""
    try:
        proc = subprocess.run([binary, "--version"], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0].strip() if proc.returncode == 0 and lines else None


def _number(text: str) -> tuple[int, int, int] | None:
    m = _VERSION_RE.search(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def version_checks(policy: Policy) -> list[dict[str, Any]]:
    """One check for the profile's CLI: ok, or a warning when it is older than the release its
    flags were checked against, or when it will not say its version. None without a profile."""
    adapter = policy.adapter
    if not adapter.profile or adapter.command:
        return []
    profile = load_profile(adapter.profile)
    binary = profile.command[0]
    if shutil.which(binary) is None:
        return []  # the agent check says so, as an error
    shown = cli_version(binary)
    checked = profile.checked_version
    if shown is None:
        return [_check("warn", f"{binary} --version printed no version; the {profile.name} "
                               f"profile was checked against {checked or 'a recent release'}")]
    have, want = _number(shown), _number(checked) if checked else None
    if have and want and have < want:
        return [_check("warn", f"{binary} {shown} is older than {checked}, the release the "
                               f"{profile.name} profile's flags were checked against: update it, "
                               "or a flag it lacks fails every session")]
    against = f" (profile checked against {checked})" if checked else ""
    return [_check("ok", f"{binary} {shown}{against}")]


def bmad_checks(project: Project) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What BMAD the project has, and what is seeded into worktrees: (checks, the --json part)."""
    root = project.root
    install = detect_bmad(root)
    scm = project.policy.scm
    seeds = bmad_seeds(project.git(), root) if scm.seed_bmad else []
    if install.kind == "skills":
        names = sorted({path.rsplit("/", 1)[-1] for path in install.skills.values()})
        detail = f"BMAD skills: {', '.join(names)}"
    elif install.kind == "workflows":
        folders = sorted({path.rsplit("/", 1)[0] for path in install.workflows.values()})
        detail = f"BMAD workflow folders in {', '.join(folders)}"
    elif install.kind == "v4":
        detail = "BMAD v4 (.bmad-core/)"
    else:
        # Not a warning: a board kept by hand is a fine way to use bmad-loop.
        return ([_check("ok", "no BMAD install found (no bmad-* skills, no workflow folders, no "
                              ".bmad-core/): agents are told to work by hand", name="bmad")],
                {"bmad": {"kind": "none", "skills": {}, "workflows": {}, "seeded": []}})
    if seeds:
        detail += f"; untracked, so seeded into each worktree: {', '.join(seeds)}"
    return ([_check("ok", detail, name="bmad")],
            {"bmad": {"kind": install.kind, "skills": dict(install.skills),
                      "workflows": dict(install.workflows), "seeded": seeds}})


def _check(status: str, detail: str, name: str = "agent") -> dict[str, Any]:
    return {"name": name, "status": status, "detail": detail}
