"""Preflight and enqueue: turn a selection into a run with a fixed plan.

Everything that can be wrong with the input is checked before the first row is written, so
bad input leaves no rows, refs or worktrees behind.

**The sprint, as the agents will see it**: from the committed target. `load_sprint` finds the
board (bmad/locations.py), reads it and the story files from the tree of the target commit
(`CommittedTree`; without a target, e.g. `validate` in a folder git cannot read, from the
folder itself), and says where each came from and what it had to guess. The BMAD configs, often
untracked, come from the working copy. `check_committed` refuses a plan whose board or story
files have changes in the checkout that the target does not hold: agents would work from other
text than the plan, and every candidate writes the board.

**The repository checks**, made before anything is written, each refuse with one
`ConfigError` line naming the folder, the policy key or the file:

- `not_a_checkout`: why `git rev-parse --show-toplevel` found no working tree: a bare repository
  (bmad-loop needs a checkout), or no repository at all;
- `check_checkout`: `init`'s refusal of such a folder, saying how to make one;
- `check_has_commits`: an empty repository (no commit yet), where no branch can be a target;
- `check_story_dir`: `[stories] story_dir` outside the repository (story files are read, and
  handed to agents, inside each story's worktree);
- `check_agent`: the agent's argv[0]. A name without a slash is looked up on PATH. A relative
  path with a slash is run from each story's worktree, which is made from the target commit, so
  it must be committed there (executable), or be copied in by `[scm] worktree_seed`; when the
  agent runs in the checkout itself (no worktrees) it must exist there.

**The create phase, planned**: what happens to selected stories that have no story file yet. A
BMAD `backlog` story usually has no story file until create-story writes it. `[stories]
create` decides, before anything is written:

- `"agent"` (default): the story is planned with `stories.to_create` set, and its worker runs the
  create phase before dev (engine/worker/create_step.py);
- `"skip"`: the story is left out of the plan, and the run's journal says so (`story.skipped`);
- `"require"`: the plan is refused (exit 2), naming every such story.

A story past `backlog` (`ready-for-dev`, `drafted`) without its file is an error in every mode:
the board says the file was written, so something is wrong with the board or the story folder.

**Where the run will stop for a human**, said before it starts: an overnight run should not
surprise its owner in the morning, so `run` prints, once the plan is fixed, every point at which
the gates (`[gates] mode`, or `run --gates`) will pause it (`pause_summary`), and whether an
escalation pauses it too (`[parallel] on_escalation`).
"""

from __future__ import annotations

import datetime as dt
import posixpath
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ...agents.adapter import check_binary
from ...agents.profiles import resolve_command
from ...bmad.board import Board, load_board, parse_board
from ...bmad.footprint import footprint_from_mapping
from ...bmad.locations import BoardSource, find_board
from ...bmad.selection import Selection, StorySpec, check_dependencies, select_stories
from ...bmad.story_files import StoryFolder, load_stories, story_folder, uncommitted_plan_files
from ...bmad.v4 import v4_board
from ...db.database import database_id
from ...db.models import Run, Story, utcnow
from ...errors import ConfigError, GitError, StateError
from ...git.runner import branch_name_ok
from ...git.trees.committed import CommittedTree, FolderTree, TreeView
from ...policy import env_override
from ...states import RUN_LIVE, RUN_ONE_PER_TARGET, Phase, RunState, StoryState
from ..journal import EventKind, record
from ..runpaths import Layout
from ..mergerules import check_merge_rules
from ..runrows import path_inside
from ..usage import budget_warnings
from ..verification.childenv import check_port_range
from .ownership import record_run, remove_record, target_check, write_record
from ...git.runner import Git
from ...policy import Policy

if TYPE_CHECKING:
    from ...queue.tasks import Tasks
    from ..project import Project

__all__ = ["Plan", "Selection", "build_plan", "enqueue", "new_run_id", "CREATE_STATUS",
           "needs_creation", "plan_creation", "creation_checks", "journal_skipped", "gate_epics",
           "pause_summary", "check_agent", "check_checkout", "check_has_commits", "check_story_dir",
           "not_a_checkout", "Sprint", "load_sprint", "check_committed"]


@dataclass
class Plan:
    target_branch: str
    target_sha: str
    board: Board
    stories: list[StorySpec]
    all_stories: list[StorySpec]
    agent_argv: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: list[StorySpec] = field(default_factory=list)  # no story file, [stories] create = "skip"
    foreign: list[str] = field(default_factory=list)  # another database's stale runs on the target


def new_run_id(now: dt.datetime | None = None) -> str:
    now = now or utcnow()
    return now.strftime("%Y%m%d-%H%M%S-") + f"{random.getrandbits(16):04x}"


def target_branch_of(project: Project, policy: Policy) -> tuple[str, str]:
    git = project.git(policy)
    if git.toplevel() is None:
        raise not_a_checkout(project.root, git)
    branch = policy.scm.target_branch or git.current_branch()
    if not branch:
        raise ConfigError(f"{project.root}: HEAD is detached and [scm] target_branch is not set")
    try:
        # Remote mode: the remote's target is the truth, whatever this checkout has.
        sha = project.target(git, branch).sha()
    except GitError as exc:
        raise ConfigError(f"{policy.source}: [scm] remote: {exc}") from None
    if sha is None:
        check_has_commits(project.root, git, branch)
        raise ConfigError(f"{policy.source}: [scm] target_branch: branch '{branch}' does not exist")
    return branch, sha


def load_board_and_stories(project: Project, policy: Policy, target_sha: str | None = None,
                           branch: str = "") -> tuple[Board, list[StorySpec]]:
    """(board, every story of it), read from the target commit (see `load_sprint`)."""
    sprint = load_sprint(project, policy, target_sha, branch)
    return sprint.board, sprint.stories


def agent_command(policy: Policy, project: Project | None = None,
                  target_sha: str | None = None) -> list[str]:
    """The dev-phase argv template, with its binary checked: a missing agent is bad input
    (a relative path: where each story's worktree will have it, see `check_agent`)."""
    adapter = policy.adapter
    if not adapter.profile and not adapter.command and not adapter.phase(Phase.DEV).command:
        raise ConfigError(f"{policy.source}: [adapter]: no agent configured "
                          "(set [adapter] profile or [adapter] command)")
    checked: list[str] = []
    for phase in (Phase.DEV, Phase.REVIEW, Phase.FIX, Phase.CREATE):
        if phase != Phase.DEV and phase == Phase.REVIEW and not policy.review.enabled:
            continue
        template = resolve_command(profile=adapter.profile, command=adapter.command,
                                   phase_command=adapter.phase(phase).command, model="",
                                   tier_args=())
        if not template:
            raise ConfigError(f"{policy.source}: [adapter] command: empty argv for phase {phase}")
        if template[0] not in checked:
            check_agent(template[0], f"{policy.source}: [adapter]", project=project,
                        policy=policy, target_sha=target_sha,
                        from_checkout=policy.scm.isolation == "none")
            checked.append(template[0])
        if phase == Phase.DEV:
            dev = template
    return dev


def build_plan(project: Project, policy: Policy, selection: Selection,
               run_id_for_checks: str = "20000101-000000-0000") -> Plan:
    target_branch, target_sha = target_branch_of(project, policy)
    sprint = load_sprint(project, policy, target_sha, target_branch)
    check_merge_rules(policy, sprint.source.rel)
    board, all_stories = sprint.board, sprint.stories
    chosen = select_stories(all_stories, board, epic=selection.epic, story=selection.stories,
                            max_stories=selection.max_stories)
    chosen, skipped = plan_creation(policy, chosen)
    check_dependencies(all_stories, chosen)
    check_committed(project, policy, sprint, chosen, target_branch)
    layout = Layout(project.state_dir, run_id_for_checks)
    for spec in chosen:
        branch = layout.story_branch(spec.key, policy.scm.branch_per)
        if not branch_name_ok(branch):
            raise ConfigError(f"{board.path}: story '{spec.key}': git refuses the branch name {branch}")
        if spec.tier and spec.tier not in policy.adapter.tiers:
            raise ConfigError(f"{spec.story_file or board.path}: story '{spec.key}': tier "
                              f"'{spec.tier}' is not defined in [adapter.tiers]")
    argv = agent_command(policy, project, target_sha) if chosen else []
    check_port_range(policy)
    warnings = list(sprint.warnings)  # a guessed story folder
    if policy.scm.isolation == "worktree" and policy.scm.max_parallel > 1 and policy.scm.rollback_on_failure:
        warnings.append("[scm] rollback_on_failure is ignored in parallel worktree mode")
    warnings.extend(budget_warnings(policy))  # a budget the agent never reports to
    return Plan(target_branch, target_sha, board, chosen, all_stories, argv, warnings, skipped)


def one_run_per_target(session: Session, project: Project, live: Run) -> str:
    """Why a second run on the target is refused, and what to do: `stop` a run a process is
    driving (`control.driver_of`, from the lane's heartbeat), `resume` one nobody drives."""
    from .control import driver_of

    holder = driver_of(session, project, live)
    if holder is not None:
        return (f"run {live.id} is already {live.state} on {live.target_branch}, driven by the "
                f"lane of {holder}: `bmad-loop stop {live.id}` first (or watch it with "
                f"`bmad-loop status --watch`)")
    end = "stop" if live.state in RUN_LIVE else "abandon"  # abandon refuses a live run
    return (f"run {live.id} is {live.state} on {live.target_branch}: `bmad-loop resume "
            f"{live.id}` continues it (or `bmad-loop {end} {live.id}` ends it)")


def enqueue(project: Project, tasks: Tasks, policy: Policy,
            selection: Selection) -> tuple[str | None, Plan]:
    """Create the run and its plan; returns (run id or None when there is nothing to do, plan)."""
    plan = build_plan(project, policy, selection)
    if not plan.stories:
        return None, plan
    run_id = new_run_id()
    with target_check(project, plan.target_branch) as foreign:
        plan.foreign = foreign.warnings
        plan.warnings.extend(foreign.warnings)
        _create_run(project, policy, selection, plan, run_id)
    tasks.enqueue_lane(run_id)
    return run_id, plan


def _create_run(project: Project, policy: Policy, selection: Selection, plan: Plan,
                run_id: str) -> None:
    """The run's rows, and its record in the repository (written before the rows commit, so
    before any ref of the run can exist; taken back if they do not)."""
    git = project.git(policy)
    database_id(project.db)  # read before the write transaction (the record names it)
    try:
        _insert_run(project, policy, selection, plan, run_id, git)
    except BaseException:
        remove_record(git, run_id)
        raise


def _insert_run(project: Project, policy: Policy, selection: Selection, plan: Plan, run_id: str,
                git: Git) -> None:
    with project.db.transaction() as s:
        live = s.scalars(select(Run).where(Run.target_branch == plan.target_branch,
                                           Run.project == project.key,
                                           Run.state.in_(RUN_ONE_PER_TARGET))).first()
        if live is not None:
            raise StateError(one_run_per_target(s, project, live))
        run = Run(id=run_id, project=project.key, target_branch=plan.target_branch,
                  target_sha=plan.target_sha, head_sha=plan.target_sha, state=RunState.RUNNING,
                  selection=selection.to_dict(),
                  policy=policy.to_dict(),  # and the columns projected from it
                  board_path=str(plan.board.path), gates_passed=[],
                  # None: a board outside the repository, which the lane cannot edit,
                  # or a BMAD v4 project, which has no board (its story files are written).
                  board_rel=None if plan.board.format == "v4" else path_inside(plan.board.path, project.root),
                  created_at=utcnow(), started_at=utcnow(), host=project.host)
        s.add(run)
        for seq, spec in enumerate(plan.stories, start=1):
            s.add(Story(
                run_id=run_id, key=spec.key, seq=seq, epic=spec.epic, title=spec.title,
                story_path=spec.story_path, state=StoryState.PENDING, footprint=spec.footprint.to_dict(),
                footprint_reason=spec.footprint.reason, depends_on=list(spec.depends_on),
                merge_class=spec.merge_class or policy.parallel.merge_class,
                tier=spec.tier or (policy.parallel.tier or None),
                done_checkpoint=spec.done_checkpoint, feedback={}, to_create=spec.story_file is None,
            ))
        record(s, run_id, EventKind.RUN_CREATED, target_branch=plan.target_branch,
               target_sha=plan.target_sha, max_parallel=policy.scm.max_parallel,
               strategy=policy.scm.merge_strategy, isolation=policy.scm.isolation,
               plan=[spec.key for spec in plan.stories], selection=selection.to_dict())
        for spec in plan.stories:
            if spec.footprint.reason:
                record(s, run_id, EventKind.FOOTPRINT_EXCLUSIVE, spec.key, reason=spec.footprint.reason)
        for warning in plan.warnings:
            record(s, run_id, EventKind.RUN_WARNING, message=warning)
        journal_skipped(s, run_id, plan.skipped)
        s.flush()
        write_record(git, record_run(project, run))


# The one board status whose story may not have a file yet.
CREATE_STATUS = "backlog"
SKIP_REASON = "no story file ([stories] create = \"skip\")"


def needs_creation(spec: StorySpec) -> bool:
    """A story the create phase would write: no story file yet, and still in the backlog."""
    return spec.story_file is None and spec.status == CREATE_STATUS


def _where(spec: StorySpec) -> str:
    return spec.story_path or f"<story folder>/{spec.key}.md"


def _missing_files(chosen: Sequence[StorySpec]) -> None:
    """A story past the backlog must have its file: ConfigError naming the first that has not."""
    for spec in chosen:
        if spec.story_file is None and spec.status != CREATE_STATUS:
            raise ConfigError(f"{_where(spec)}: story {spec.key} is {spec.status} on the board "
                              "but its story file does not exist")


def _refusals(policy: Policy, uncreated: Sequence[StorySpec]) -> str | None:
    """Why the create phase cannot run for these stories under this policy, or None."""
    if not uncreated:
        return None
    keys = ", ".join(s.key for s in uncreated)
    mode = policy.stories.create
    if mode == "require":
        return (f'{policy.source}: [stories] create = "require": no story file for {keys} '
                f"(expected at {', '.join(_where(s) for s in uncreated)})")
    if mode != "agent":
        return None
    outside = [s.key for s in uncreated if not s.story_path]
    if outside:
        return (f"{policy.source}: [stories] create: the story folder is outside the repository, "
                f"so no agent can write the story file of {', '.join(outside)}")
    scm = policy.scm
    if (scm.isolation, scm.branch_per) != ("worktree", "story"):
        # The created file is committed on the story's own branch and carried to the target
        # before dev; in place (or on a shared run branch) there is no such branch to keep it.
        return (f'{policy.source}: [stories] create = "agent" needs [scm] isolation = "worktree" '
                f'and branch_per = "story" (stories without a story file: {keys}); write their '
                'files first or set [stories] create = "skip"')
    return None


def plan_creation(policy: Policy,
                  chosen: Sequence[StorySpec]) -> tuple[list[StorySpec], list[StorySpec]]:
    """(the stories to plan, the stories skipped for want of a file). ConfigError when the
    policy refuses them or a story past the backlog has no file. Planned stories without a
    file are the ones whose rows get `to_create`."""
    _missing_files(chosen)
    uncreated = [s for s in chosen if needs_creation(s)]
    refusal = _refusals(policy, uncreated)
    if refusal:
        raise ConfigError(refusal)
    if policy.stories.create == "skip":
        return [s for s in chosen if not needs_creation(s)], uncreated
    return list(chosen), []


def creation_checks(policy: Policy, actionable: Sequence[StorySpec]) -> list[tuple[str, str]]:
    """`validate`'s lines about story files still to be written: (status, detail)."""
    try:
        _missing_files(actionable)
    except ConfigError as exc:
        return [("error", str(exc))]
    uncreated = [s for s in actionable if needs_creation(s)]
    if not uncreated:
        return []
    refusal = _refusals(policy, uncreated)
    if refusal:
        return [("error", refusal)]
    keys = ", ".join(s.key for s in uncreated)
    if policy.stories.create == "skip":
        return [("warn", f"{len(uncreated)} backlog stories without a story file are skipped: {keys}")]
    many = len(uncreated) != 1
    return [("ok", f"{len(uncreated)} backlog {'stories get' if many else 'story gets'} the create "
                   f"phase first: {keys}")]


def journal_skipped(session: Session, run_id: str, skipped: Sequence[StorySpec]) -> None:
    """One `story.skipped` per story left out of the plan for want of a file (no row: unplanned)."""
    for spec in skipped:
        record(session, run_id, EventKind.STORY_SKIPPED, spec.key, reason=SKIP_REASON,
               story_file=_where(spec), planned=False)


def gate_epics(plan: Sequence[StorySpec]) -> list[tuple[str, str]]:
    """(epic, first story key) for each epic after the plan's first, in order of first
    appearance: where `per-epic` gates pause the run (the first epic starts without a gate)."""
    seen: list[str] = []
    points: list[tuple[str, str]] = []
    for story in plan:
        epic = str(story.epic)
        if epic in seen or not epic:  # a story in no epic ("") never meets a gate (admission)
            continue
        if seen:
            points.append((epic, story.key))
        seen.append(epic)
    return points


def pause_summary(plan: Sequence[StorySpec], gates_mode: str, on_escalation: str) -> str:
    """One line: where this plan will pause, under this gates mode."""
    if gates_mode == "per-epic":
        points = gate_epics(plan)
        if points:
            where = ", ".join(f"before epic {epic} ({key})" for epic, key in points)
            gates = f"gates per-epic: pauses {where}; `bmad-loop resume` opens each gate"
        else:
            gates = "gates per-epic: one epic in the plan, no gate pause"
    elif gates_mode == "per-story-spec-approval":
        gates = (f"gates per-story-spec-approval: each of the {len(plan)} stories waits for "
                 "`bmad-loop approve RUN STORY` before dev")
    else:
        gates = "gates none: no gate pause"
    if on_escalation == "pause":
        return f"{gates}; a story that needs a human pauses the run"
    return f"{gates}; a story that needs a human is parked and the rest go on"


_EXECUTABLE_MODES = ("100755", "120000")  # an executable file, or a symlink


def not_a_checkout(root: Path, git: Git) -> ConfigError:
    """The error for a folder where git finds no working tree."""
    proc = git.run("rev-parse", "--is-bare-repository", check=False)
    if proc.returncode == 0 and proc.stdout.strip() == "true":
        return ConfigError(f"{root}: a bare repository (no working tree); bmad-loop needs a "
                           "checkout: clone it and run bmad-loop in the clone")
    return ConfigError(f"{root}: not a git repository")


def check_checkout(project: Project) -> None:
    """`init` refuses a folder where git finds no working tree, before anything is written."""
    git = project.git()
    if git.toplevel() is None:
        raise ConfigError(f"{not_a_checkout(project.root, git)}; run `git init` (or clone the "
                          "repository) first, then `bmad-loop init` in it")


def check_has_commits(root: Path, git: Git, branch: str) -> None:
    """Refuse an empty repository by name; a missing branch is the caller's message."""
    proc = git.run("for-each-ref", "--count=1", "--format=%(refname)", "refs/heads", check=False)
    if proc.returncode == 0 and not proc.stdout.strip() and git.rev("HEAD") is None:
        raise ConfigError(f"{root}: an empty repository (no commits yet, branch '{branch}' is "
                          "unborn); commit the sprint board and story files first")


def check_story_dir(project: Project, policy: Policy, story_dir: Path) -> None:
    value = policy.stories.story_dir
    if value and path_inside(story_dir, project.root) is None:
        raise ConfigError(f"{policy.source}: [stories] story_dir: {value!r} is outside the "
                          f"repository {project.root} (story files must be in the repository)")


def _seeded(rel: str, seeds: Iterable[str]) -> bool:
    path = PurePosixPath(rel)
    return any(path == PurePosixPath(seed) or PurePosixPath(seed) in path.parents for seed in seeds)


def check_agent(argv0: str, source: str, *, project: Project | None = None,
                policy: Policy | None = None,
                target_sha: str | None = None, from_checkout: bool = False) -> None:
    """Check the agent binary where it will run (see the module docstring). `from_checkout`:
    the agent runs in the project's own checkout, not in worktrees."""
    is_relative_path = "/" in argv0 and not argv0.startswith("/")
    if project is None or policy is None or not is_relative_path:
        check_binary(argv0, source)
        return
    rel = posixpath.normpath(argv0)
    if rel == ".." or rel.startswith("../"):
        raise ConfigError(f"{source} command: agent '{argv0}' is outside the worktree it runs "
                          "in; give an absolute path or a name on PATH")
    if from_checkout or _seeded(rel, policy.scm.worktree_seed):
        check_binary(argv0, source, cwd=project.root)
        return
    if target_sha is None:  # no target to look in (validate: the git check failed already)
        return
    git = project.git(policy)
    proc = git.run("ls-tree", target_sha, "--", rel, check=False)
    fields = proc.stdout.split() if proc.returncode == 0 else []
    if not fields or fields[1] != "blob":
        raise ConfigError(f"{source} command: agent '{argv0}' is not committed on the target "
                          "branch, and each story runs it from its own worktree made from "
                          "there: commit it, list it in [scm] worktree_seed, or give an "
                          "absolute path or a name on PATH")
    if fields[0] not in _EXECUTABLE_MODES:
        raise ConfigError(f"{source} command: agent '{argv0}' is committed without its "
                          f"executable bit (mode {fields[0]}; git update-index --chmod=+x)")


@dataclass
class Sprint:
    board: Board
    source: BoardSource
    folder: StoryFolder
    stories: list[StorySpec]
    where: str  # what the files were read from
    warnings: list[str] = field(default_factory=list)


def _read_board(project: Project, tree: TreeView, source: BoardSource, branch: str) -> Board:
    if source.format == "v4":
        return v4_board(tree, source.story_folder or "", project.root)
    if source.rel is None:  # a policy sprint_status outside the repository: read where it is
        return load_board(source.path)
    if not tree.is_file(source.rel):
        if (project.root / source.rel).is_file():
            raise ConfigError(f"{source.path}: the sprint board is not committed on {branch} "
                              "(the plan is read from the committed target); commit it first")
        raise ConfigError(f"{source.path}: sprint status file not found ({source.reason})")
    return parse_board(tree.text(source.rel, "sprint status file", source.path), source.path)


def _overrides(policy: Policy, board: Board,
               problems: list[str] | None = None) -> dict[str, dict[str, Any]]:
    overrides = {k: {"files": list(v.files), "shared": list(v.shared), "resources": list(v.resources)}
                 for k, v in policy.footprints.overrides.items()}
    for key in list(overrides):
        problem = None
        if board.entry(key) is None:
            problem = f"{policy.source}: [footprints.\"{key}\"]: no such story on {board.path}"
        else:
            fp = footprint_from_mapping(overrides[key])
            if fp.reason and fp.reason.startswith("invalid"):
                problem = f"{policy.source}: [footprints.\"{key}\"]: {fp.reason}"
        if problem is not None:
            if problems is None:
                raise ConfigError(problem)
            problems.append(problem)
            del overrides[key]
    return overrides


def load_sprint(project: Project, policy: Policy, target_sha: str | None = None, branch: str = "",
                problems: list[str] | None = None) -> Sprint:
    """The board and every story of it, read from the target commit `target_sha` (the folder
    on disk when None). A story file's or a footprint override's problem is a ConfigError, or
    with a `problems` list, a line appended to it (`validate`: every problem in one pass)."""
    tree: TreeView
    if target_sha:
        tree = CommittedTree(project.git(policy), target_sha, branch)
    else:
        tree = FolderTree(project.root)
    named = env_override("stories", "sprint_status") or "policy [stories] sprint_status"
    source = find_board(project.root, tree, policy.stories.sprint_status, config_root=project.home,
                        named=named)
    board = _read_board(project, tree, source, branch).with_extra_keys(policy.stories.extra_keys)
    folder = story_folder(project.root, tree, board, source, policy.stories.story_dir,
                          config_root=project.home)
    check_story_dir(project, policy, folder.path)
    stories = load_stories(project.root, board, folder.rel if folder.rel is not None else folder.path,
                           _overrides(policy, board, problems), tree=tree, problems=problems)
    return Sprint(board, source, folder, stories, tree.where, list(folder.warnings))


def check_committed(project: Project, policy: Policy, sprint: Sprint, chosen: Sequence[StorySpec],
                    branch: str) -> None:
    """ConfigError naming the board and chosen story files the checkout changed but the target
    does not hold. Only when the checkout has the target branch checked out: on another
    branch, its files are simply not the plan's."""
    git = project.git(policy)
    if git.current_branch() != branch:
        return
    changed = uncommitted_plan_files(git, sprint.source.rel, sprint.folder.rel, sprint.board,
                                     chosen)
    if changed:
        raise ConfigError(f"{project.root}: uncommitted changes to {', '.join(changed)}: the plan "
                          f"and the agents read the committed {branch}; commit them first")
