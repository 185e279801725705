"""Set-up and running commands: init, validate, enqueue, worker, run, resume, demo, cleanup.
Registered on `cli` when `bmad_loop.cli` imports this module.

Each command parses options, calls one service, prints.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..engine.run.presses import Interrupts
from ..errors import EXIT_OK, EXIT_USAGE, ConfigError
from .app import (
    cli,
    handle_errors,
    has_state,
    json_option,
    open_project,
    project_option,
    run_ref_argument,
)
from ..engine.journal import EventKind

if TYPE_CHECKING:
    from ..engine.project import Project

__all__ = ["init", "validate", "enqueue", "worker", "run", "resume", "demo", "cleanup"]


def selection_options(fn):
    fn = click.option("--max-stories", type=int, default=None, help="Run at most N stories.")(fn)
    fn = click.option("--story", "stories", multiple=True,
                      help="Story key, E-S, E.S or a unique slug fragment (repeatable).")(fn)
    fn = click.option("--epic", type=str, default=None, help="Only stories of epic E (1, r, 3-5).")(fn)
    fn = click.option("--parallel", type=str, default=None,
                      help="Override [scm] max_parallel for this run.")(fn)
    fn = click.option("--gates", "gates", default=None,
                      type=click.Choice(["none", "per-epic", "per-story-spec-approval"]),
                      help="Override [gates] mode for this run.")(fn)
    return fn


def report_options(fn):
    fn = click.option("--report-html", "report_html", type=click.Path(dir_okay=False, path_type=Path),
                      default=None, help="Write the run's HTML report here when it settles.")(fn)
    fn = click.option("--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path),
                      default=None, help="Write a JUnit XML file here (one test case per story).")(fn)
    fn = click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
                      default=None, help="Write a JSON summary of the run here when it settles.")(fn)
    return fn


def clone_option(fn):
    return click.option("--clone", "clone_dir", default=None, envvar="BMAD_LOOP_CLONE",
                        type=click.Path(file_okay=False, path_type=Path),
                        help="Remote mode: work in this clone of [scm] remote (made if absent).")(fn)


def host_option(fn):
    return click.option("--host", "host", default=None,
                        help="The name this host goes by in leases and rows [BMAD_LOOP_HOST or the hostname].")(fn)


def _set_host(host: str | None) -> None:
    import os

    from ..hostid import HOST_ENV

    if host:
        os.environ[HOST_ENV] = host


def _policy_for_run(project, parallel: str | None, gates: str | None = None):
    policy = project.policy
    if gates is not None:
        policy = policy.with_gates_mode(gates, source="--gates")
    if parallel is None:
        return policy
    try:
        value = int(parallel)
    except ValueError:
        raise ConfigError(f"--parallel: expected an integer >= 1, got '{parallel}'") from None
    return policy.with_max_parallel(value, source="--parallel")


def _selection(epic, stories, max_stories):
    from ..bmad.selection import Selection

    if max_stories is not None and max_stories < 1:
        raise ConfigError(f"--max-stories: must be >= 1, got {max_stories}")
    return Selection(epic=epic, stories=tuple(stories), max_stories=max_stories)


def _enqueue(project_dir, parallel, gates, epic, stories, max_stories):
    """Open the project and enqueue a run of the selection: (project, policy, tasks, run id or
    None when nothing matches, plan)."""
    from ..engine.run.planning import enqueue as do_enqueue
    from ..sandbox import startup_notes
    from ..queue.tasks import Tasks

    project = open_project(project_dir)
    policy = _policy_for_run(project, parallel, gates)
    for note in startup_notes(policy):  # "on" without a working sandbox: ConfigError, exit 2
        click.echo(f"warning: {note}", err=True)
    tasks = Tasks(project)
    run_id, plan = do_enqueue(project, tasks, policy, _selection(epic, stories, max_stories))
    for line in plan.foreign:  # another state database's stale run on the target
        click.echo(f"warning: {line}", err=True)
    return project, policy, tasks, run_id, plan


def _progress_printer(ci: bool = False):
    """One plain line per event (CI logs and terminals alike: no colour, no cursor tricks),
    the waits of one moment grouped by reason (`progress`)."""
    from .progress import ProgressPrinter

    return ProgressPrinter(ci)


# ---------------------------------------------------------------------------- set-up
@cli.command()
@project_option
@click.option("--force", is_flag=True, help="Overwrite an existing policy.toml.")
@handle_errors
def init(project_dir, force):
    """Write a commented .bmad-loop/policy.toml and create the state database."""
    import os
    import tomllib

    from ..engine.project import Project, ensure_state_dir
    from ..engine.run.planning import check_checkout
    from ..policy import default_policy_text, load_policy, policy_from_dict, policy_path

    root = project_dir.resolve()
    path = policy_path(root)
    keep = path.exists() and not force
    if keep:
        policy = load_policy(root)
    else:
        text = default_policy_text()
        policy = policy_from_dict(tomllib.loads(text), source=str(path), env=os.environ)
    project = Project(root=root, policy=policy)
    check_checkout(project)  # a folder outside git would give a project no command can run
    # The database first: a policy, a database file or a folder it refuses leaves nothing written.
    project.db  # create and migrate
    state = ensure_state_dir(root)
    if keep:
        click.echo(f"kept existing {path} (use --force to overwrite)")
    else:
        path.write_text(text)
        click.echo(f"wrote {path}")
    click.echo(f"state database ready at {project.database_url}")
    click.echo(f"runtime files under {state} are git-ignored by {state / '.gitignore'}")


@cli.command()
@project_option
@json_option
@handle_errors
def validate(project_dir, as_json):
    """Preflight: policy, git repository, target branch, stories, footprints, agent command."""
    from ..engine.run.preflight import preflight

    report = preflight(project_dir.resolve())
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        for check in report["checks"]:
            mark = {"ok": "ok  ", "warn": "warn", "error": "FAIL"}[check["status"]]
            click.echo(f"{mark} {check['name']}: {check['detail']}")
    sys.exit(EXIT_OK if report["ok"] else EXIT_USAGE)


# ---------------------------------------------------------------------------- running
@cli.command()
@project_option
@selection_options
@handle_errors
def enqueue(project_dir, parallel, gates, epic, stories, max_stories):
    """Create a run and its plan; print the run id. Consumers (`worker`) do the work."""
    _, _, _, run_id, plan = _enqueue(project_dir, parallel, gates, epic, stories, max_stories)
    if run_id is None:
        click.echo("nothing to do: no actionable story matches the selection", err=True)
        return
    for warning in plan.warnings:  # journaled as run.warning too
        click.echo(f"warning: {warning}", err=True)
    click.echo(run_id)


@cli.command()
@project_option
@click.option("--queue", "queue", type=click.Choice(["stories", "integration", "all"]),
              default="all", show_default=True)
@click.option("-w", "--workers", type=int, default=None,
              help="Story consumer threads [default: the live runs' max_parallel, else "
                   "[scm] max_parallel].")
@clone_option
@host_option
@handle_errors
def worker(project_dir, queue, workers, clone_dir, host):
    """Run consumers until interrupted (Ctrl+C finishes the tasks in hand, then exits)."""
    import signal
    import threading

    from ..engine.run.consumers import ConsumerSet, story_workers

    _set_host(host)
    project = open_project(project_dir, clone_dir)
    if workers is None:
        workers = story_workers(project, queue)
    consumers = ConsumerSet(project, queue=queue, workers=workers,
                            announce=lambda line: click.echo(f"bmad-loop worker: {line}", err=True))
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *a: done.set())
    signal.signal(signal.SIGTERM, lambda *a: done.set())
    consumers.start()
    where = f"project={project.root}" if project.remote_url is None else \
        f"clone={project.root} remote={project.remote_url} host={project.host}"
    click.echo(f"bmad-loop worker: queue={queue} workers={workers} {where}", err=True)
    while not done.wait(1.0):
        pass
    click.echo("bmad-loop worker: stopping (waiting for tasks in hand)", err=True)
    consumers.stop(graceful=True)


@cli.command()
@project_option
@selection_options
@click.option("--enqueue-only", is_flag=True, help="Only queue the work for separate workers.")
@click.option("--ci", is_flag=True,
              help="Say this is a CI batch job. `run` behaves the same without it: progress is "
                   "plain lines (no colour) and nothing prompts either way.")
@report_options
@handle_errors
def run(project_dir, parallel, gates, epic, stories, max_stories, enqueue_only, ci, report_path,
        junit_path, report_html):
    """Enqueue a run and drive it in this process until it completes, pauses or stops.

    Exit codes: 0 completed, 1 failed, 2 bad input, 3 needs a human, 4 stopped, 130 second Ctrl+C.
    """
    # First: a Ctrl+C during start-up stops the run once it is driven.
    click.get_current_context().call_on_close(Interrupts.counting().release)
    from ..engine.crashpoints import delay_point
    from ..engine.run.planning import pause_summary

    project, policy, tasks, run_id, plan = _enqueue(project_dir, parallel, gates, epic, stories,
                                                    max_stories)
    if run_id is None:
        click.echo("nothing to do: no actionable story matches the selection")
        _write_reports(project, None, EXIT_OK, report_path, junit_path)
        return
    for warning in plan.warnings:  # journaled as run.warning too
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"run {run_id}: {len(plan.stories)} stories on {plan.target_branch} "
               f"(max_parallel={policy.scm.max_parallel}, strategy={policy.scm.merge_strategy})")
    click.echo(pause_summary(plan.stories, policy.gates.mode, policy.parallel.on_escalation))
    if enqueue_only:
        click.echo(run_id)
        return
    delay_point("run.enqueued")
    _drive_and_report(project, tasks, run_id, policy.scm.max_parallel, _progress_printer(ci),
                      ReportFiles(report_path, junit_path, report_html))


@cli.command()
@project_option
@run_ref_argument
@click.option("--enqueue-only", is_flag=True, help="Only queue the work for separate workers.")
@click.option("--reload-policy", is_flag=True,
              help="Take the current policy file for every key but the run's identity "
                   "(target branch, remote, isolation, branch_per, [database], [queue]).")
@report_options
@handle_errors
def resume(project_dir, run_ref, enqueue_only, reload_policy, report_path, junit_path, report_html):
    """Continue a paused, stopped, failed or crashed run (same plan, scope and target)."""
    click.get_current_context().call_on_close(Interrupts.counting().release)
    from ..engine.run.control import resume as do_resume
    from ..queue.tasks import Tasks

    project = open_project(project_dir, need_runs=True, run_ref=run_ref)
    tasks = Tasks(project)
    seen = _journal_end(project, run_ref)
    run = do_resume(project, tasks, run_ref, reload_policy=reload_policy)
    click.echo(f"run {run.id} resumed")
    _echo_new_warnings(project, run.id, seen.get(run.id, 0))
    if enqueue_only:
        return
    # Only what is new: the journal up to the resume was printed by the run that wrote it.
    _drive_and_report(project, tasks, run.id, run.max_parallel, _progress_printer(),
                      ReportFiles(report_path, junit_path, report_html), since_seq=seen.get(run.id, 0))


def _journal_end(project, run_ref) -> dict[str, int]:
    """{run id: its last journal seq} for the run `run_ref` names, before anything changes."""
    from sqlalchemy import func, select

    from ..db.models import Event
    from ..engine.run.control import find_run
    from ..errors import BmadLoopError

    with project.db.transaction() as s:
        try:
            run = find_run(s, project, run_ref)
        except BmadLoopError:  # resume itself says what is wrong with the reference
            return {}
        last = s.scalar(select(func.max(Event.seq)).where(Event.run_id == run.id))
        return {run.id: last or 0}


@dataclass(frozen=True)
class ReportFiles:
    """Where `--report`, `--junit` and `--report-html` write once the run settles (None: not)."""

    json: Path | None
    junit: Path | None
    html: Path | None


def _drive_and_report(project, tasks, run_id, workers, progress, reports: ReportFiles,
                      since_seq: int = 0):
    """Drive the run here until it settles, print its outcome, write the reports, exit with
    the run's exit code. Each Ctrl+C acted on is explained (`progress.interrupt_notice`)."""
    from ..engine.run.consumers import drive
    from .progress import interrupt_notice

    def notice(count: int) -> None:
        click.echo(interrupt_notice(project, run_id, count), color=False)
        sys.stdout.flush()

    progress.not_created = _stories_to_create(project, run_id)
    progress.evidence = lambda key: _evidence_lines(project, run_id, key)

    code = drive(project, tasks, run_id, workers=workers, progress=progress, since_seq=since_seq,
                 notice=notice)
    _print_outcome(project, run_id)
    _write_reports(project, run_id, code, reports.json, reports.junit)
    _write_html_report(project, run_id, reports.html)
    sys.exit(code)


def _evidence_lines(project, run_id: str, key: str) -> list[str]:
    """Where an escalated story's last output is kept and how to continue from it ([] when its
    verify did not fail: nothing is kept)."""
    from ..db.models import Story
    from ..engine.verification.record import continue_lines, kept_evidence

    ref = kept_evidence(project.git(), run_id, key)
    if ref is None:
        return []
    with project.db.read() as s:
        worktree = s.query(Story.worktree).filter(Story.run_id == run_id, Story.key == key).scalar()
    return continue_lines(run_id, key, ref, worktree)


def _stories_to_create(project, run_id) -> set[str]:
    from sqlalchemy import select

    from ..db.models import Story

    with project.db.transaction() as s:
        return set(s.scalars(select(Story.key).where(Story.run_id == run_id, Story.to_create)))


def _write_html_report(project, run_id, path) -> None:
    if path is None:
        return
    from ..db.models import Run
    from ..operator.report.html import write_run_report

    with project.db.transaction() as s:
        click.echo(f"html: {write_run_report(s, s.get(Run, run_id), project.state_dir, path)}")


def _print_outcome(project, run_id):
    from ..db.models import Run
    from ..engine.run.status import night_notes
    from ..engine.runrows import stories_of
    from .progress import resume_command
    from ..operator.style import key_width
    from ..states import RunState

    with project.db.transaction() as s:
        run = s.get(Run, run_id)
        stories = stories_of(s, run_id)
        resumable = run.state in (RunState.STOPPED, RunState.FAILED)
        click.echo(f"run {run.id} {run.state}" + (f": {run.reason}" if run.reason else "")
                   + (f"; `{resume_command(project, run.id)}` continues it" if resumable else ""))
        width = key_width(stories)
        for story in stories:
            extra = f" ({story.reason})" if story.reason else ""
            click.echo(f"  {story.seq:>3} {story.key:<{width}} {story.state:<11}{extra}".rstrip())
        for line in night_notes(s, run_id):  # what the run got past on its own
            click.echo(f"  {line}")


def _write_reports(project, run_id, code, report_path, junit_path):
    if not report_path and not junit_path:
        return
    from ..db.models import Run
    from ..engine.run.status import run_status
    from ..operator.report.ci_summary import nothing_to_do, write_json_report, write_junit

    if run_id is None:  # still both files: a CI step publishing them must find them
        status = nothing_to_do("no actionable story matches the selection")
    else:
        with project.db.transaction() as s:
            status = run_status(s, s.get(Run, run_id))
    if report_path:
        click.echo(f"report: {write_json_report(status, report_path, exit_code=code)}")
    if junit_path:
        click.echo(f"junit: {write_junit(status, junit_path)}")


@cli.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to build the demo repository [default: a new temporary folder].")
@click.option("--parallel", type=int, default=2, show_default=True)
@click.option("--stories", "count", type=int, default=5, show_default=True)
@json_option
@handle_errors
def demo(directory, parallel, count, as_json):
    """Build a small BMAD repository with a scripted agent, run the loop on it, show the result."""
    from .demo import run_demo

    result = run_demo(directory, parallel=parallel, count=count,
                      echo=None if as_json else click.echo)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    sys.exit(result["exit_code"])


@cli.command()
@project_option
@click.option("--dry-run", is_flag=True, help="Say what would be removed; change nothing.")
@click.option("--runs", "runs", is_flag=True,
              help="Also remove logs, evidence and worktrees of finished runs beyond [cleanup] keep_runs.")
@click.option("--purge", is_flag=True, help="With --runs: delete those runs' rows and journal too.")
@click.option("--forget-database", "forget_id", metavar="ID", default=None,
              help="Only forget the run records of the state database ID (one that is gone; "
                   "`unrecorded`: runs with no record and no rows here).")
@click.option("--force", is_flag=True, help="With --forget-database: also delete its runs' refs and worktrees.")
@clone_option
@host_option
@json_option
@handle_errors
def cleanup(project_dir, dry_run, runs, purge, forget_id, force, clone_dir, host, as_json):
    """Remove worktrees, branches and refs in bmad-loop's namespace that no live row of this
    state database owns; another database's runs are kept and listed."""
    from ..engine.run.cleanup import cleanup as do_cleanup

    if purge and not runs:
        raise ConfigError("--purge goes with --runs")
    if force and forget_id is None:
        raise ConfigError("--force goes with --forget-database ID")
    if forget_id is not None and (runs or purge):
        raise ConfigError("--forget-database does only that: leave out --runs and --purge")
    _set_host(host)
    project = open_project(project_dir, clone_dir)
    if forget_id is not None:
        return _forget_database(project, forget_id, force, dry_run, as_json)
    report = do_cleanup(project, dry_run=dry_run, runs=runs, purge=purge, has_rows=has_state(project),
                        progress=None if as_json else (lambda m: click.echo(("would " if dry_run else "") + m)))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(f"{'would remove' if dry_run else 'removed'}: {len(report.worktrees_removed)} worktrees, "
                   f"{len(report.branches_deleted)} branches, {len(report.refs_deleted)} refs, "
                   f"{len(report.remote_branches_deleted)} remote branches; "
                   f"kept {len(report.kept)}; rows marked {len(report.rows_marked)}"
                   + (f"; kept {len(report.foreign)} of other state databases' runs"
                      if report.foreign else ""))
        for _run_id, entry in sorted(report.kept_because.items()):
            click.echo(f"  kept {entry['count']}: {entry['why']}")


# ---------------------------------------------------------------------------- other databases' runs
def _forget_database(project: Project, forget_id: str, force: bool, dry_run: bool,
                   as_json: bool) -> None:
    """`cleanup --forget-database ID`: forget the run records of another state database."""
    from ..engine.run.cleanup import forget_database

    report = forget_database(project, forget_id.strip(), force=force, dry_run=dry_run,
                             has_rows=has_state(project),
                             say=None if as_json else (lambda m: click.echo(("would " if dry_run else "") + m)))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    for run_id in report.kept_own:
        click.echo(f"kept run {run_id}: this database holds its rows (its record is wrong)")
    click.echo(f"{'would forget' if dry_run else 'forgot'} database {forget_id}: "
               f"{len(report.records_removed)} records, {len(report.refs_deleted)} refs, "
               f"{len(report.worktrees_removed)} worktrees"
               + ("" if force else " (refs kept: add --force to delete them)"))


def _echo_new_warnings(project: Project, run_id: str, after_seq: int) -> None:
    """The `run.warning`s the resume journaled (another state database's stale run on the
    target), on stderr: with --enqueue-only nothing else would show them."""
    from ..engine.journal import events_after

    with project.db.read() as s:
        for event in events_after(s, run_id, after_seq, (EventKind.RUN_WARNING,), None):
            click.echo(f"warning: {(event.data or {}).get('message')}", err=True)
