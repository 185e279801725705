"""Preflight and enqueue: turn a selection into a run with a fixed plan.

Everything that can be wrong with the input is checked before the first row is written, so
bad input leaves no rows, refs or worktrees behind.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from sqlalchemy import select

from ...bmad.board import Board
from ...git.refnames import branch_name_ok
from ...db.database import database_id
from ...db.models import Run, Story, utcnow
from ...errors import ConfigError, GitError, StateError
from ...agents.profiles import resolve_command
from ...bmad.selection import Selection, StorySpec, check_dependencies, select_stories
from ...states import RUN_LIVE, RUN_ONE_PER_TARGET, Phase, RunState, StoryState
from .creation import journal_skipped, plan_creation
from ..journal import record
from ..layout import Layout
from ..ports import check_port_range
from .repocheck import check_agent, check_has_commits, not_a_checkout
from .ownership import record_run, target_check
from .runrecords import remove_record, write_record
from ..runs import path_inside
from ..mergerules import check_merge_rules
from .sprintload import check_committed, load_sprint
from ..worker.usagefile import budget_warnings

__all__ = ["Plan", "Selection", "build_plan", "enqueue", "new_run_id"]


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


def new_run_id(now=None) -> str:
    now = now or utcnow()
    return now.strftime("%Y%m%d-%H%M%S-") + f"{random.getrandbits(16):04x}"


def target_branch_of(project, policy) -> tuple[str, str]:
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


def load_board_and_stories(project, policy, target_sha: str | None = None, branch: str = ""):
    """(board, every story of it), read from the target commit (see `sprintload`)."""
    sprint = load_sprint(project, policy, target_sha, branch)
    return sprint.board, sprint.stories


def agent_command(policy, project=None, target_sha: str | None = None) -> list[str]:
    """The dev-phase argv template, with its binary checked: a missing agent is bad input
    (a relative path: where each story's worktree will have it, see `repocheck.check_agent`)."""
    adapter = policy.adapter
    if not adapter.profile and not adapter.command and not adapter.phase(Phase.DEV).command:
        raise ConfigError(f"{policy.source}: [adapter]: no agent configured "
                          "(set [adapter] profile or [adapter] command)")
    checked = []
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


def build_plan(project, policy, selection: Selection, run_id_for_checks: str = "20000101-000000-0000") -> Plan:
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


def one_run_per_target(session, project, live: Run) -> str:
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


def enqueue(project, tasks, policy, selection: Selection) -> tuple[str | None, Plan]:
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


def _create_run(project, policy, selection: Selection, plan: Plan, run_id: str) -> None:
    """The run's rows, and its record in the repository (written before the rows commit, so
    before any ref of the run can exist; taken back if they do not)."""
    git = project.git(policy)
    database_id(project.db)  # read before the write transaction (the record names it)
    try:
        _insert_run(project, policy, selection, plan, run_id, git)
    except BaseException:
        remove_record(git, run_id)
        raise


def _insert_run(project, policy, selection, plan, run_id, git) -> None:
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
        record(s, run_id, "run.created", target_branch=plan.target_branch,
               target_sha=plan.target_sha, max_parallel=policy.scm.max_parallel,
               strategy=policy.scm.merge_strategy, isolation=policy.scm.isolation,
               plan=[spec.key for spec in plan.stories], selection=selection.to_dict())
        for spec in plan.stories:
            if spec.footprint.reason:
                record(s, run_id, "footprint.exclusive", spec.key, reason=spec.footprint.reason)
        for warning in plan.warnings:
            record(s, run_id, "run.warning", message=warning)
        journal_skipped(s, run_id, plan.skipped)
        s.flush()
        write_record(git, record_run(project, run))
