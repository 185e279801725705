"""The commands that steer a run that exists: `stop`, `abandon`, `approve`, `reject`, `retry`,
`reconcile`. Each opens the project, calls one service of engine/run/control.py and prints."""

from __future__ import annotations

import json
import sys

import click

from .app import (
    cli,
    handle_errors,
    json_option,
    open_project,
    open_project_to_read,
    project_option,
    run_ref_argument,
)

__all__ = ["abandon", "stop", "approve", "reject", "retry", "reconcile"]


@cli.command()
@project_option
@click.argument("run_ref", metavar="RUN")
@click.option("--reason", default=None, help="Why, for the journal and `status`.")
@json_option
@handle_errors
def abandon(project_dir, run_ref, reason, as_json):
    """End a paused, stopped or failed run for good (state `abandoned`); its branches and
    evidence stay per `[scm] keep_failed` until `cleanup`."""
    from ..engine.run.control import abandon as do_abandon

    project = open_project(project_dir, need_runs=True, run_ref=run_ref)
    run = do_abandon(project, run_ref, reason)
    if as_json:
        click.echo(json.dumps({"run": run.id, "state": run.state, "reason": run.reason}))
    else:
        click.echo(f"run {run.id} {run.state}")


@cli.command()
@project_option
@run_ref_argument
@click.option("--now", is_flag=True, help="Kill agent sessions now (attempts are not counted).")
@handle_errors
def stop(project_dir, run_ref, now):
    """Stop a run: no new dispatch; running stories stop at a safe boundary (or now)."""
    from ..engine.run.control import stop as do_stop
    from ..queue.tasks import Tasks

    project = open_project(project_dir, need_runs=True, run_ref=run_ref)
    run = do_stop(project, Tasks(project), run_ref, now=now)
    click.echo(f"run {run.id} {run.state}")


@cli.command()
@project_option
@click.argument("run_ref", metavar="RUN")
@click.argument("story")
@handle_errors
def approve(project_dir, run_ref, story):
    """Approve a story's spec (gates.mode = per-story-spec-approval)."""
    from ..engine.run.control import approve as do_approve
    from ..queue.tasks import Tasks

    project = open_project(project_dir, need_runs=True, run_ref=run_ref)
    row = do_approve(project, Tasks(project), run_ref, story)
    click.echo(f"approved {row.key}; `bmad-loop resume {run_ref}` continues a paused run")


@cli.command()
@project_option
@click.argument("refs", metavar="[RUN] STORY", nargs=-1, required=True)
@click.option("--from", "start", required=True, type=click.Choice(["dev", "review", "integrate"]),
              help="dev: a fresh dev attempt; review: verify and review the branch as it is; "
                   "integrate: compose, verify and integrate its finished commit again.")
@handle_errors
def retry(project_dir, refs, start):
    """Send one story back to an earlier step (a person's explicit redo)."""
    from ..engine.run.control import retry as do_retry
    from ..queue.tasks import Tasks

    if len(refs) > 2:
        raise click.UsageError("expected [RUN] STORY")
    run_ref, story = (None, refs[0]) if len(refs) == 1 else refs
    project = open_project(project_dir, need_runs=True, run_ref=run_ref)
    run, row = do_retry(project, Tasks(project), run_ref, story, start)
    from ..states import RUN_LIVE

    then = "" if run.state in RUN_LIVE else f"; `bmad-loop resume {run.id}` continues the run"
    click.echo(f"{row.key}: retry from {start} ({row.state}){then}")


@cli.command()
@project_option
@click.argument("run_ref", metavar="RUN")
@click.argument("story")
@click.option("--reason", required=True, help="Why the candidate is refused (kept on the story).")
@handle_errors
def reject(project_dir, run_ref, story, reason):
    """Refuse a held candidate (merge_class = operator): the story becomes escalated."""
    from ..engine.run.control import reject as do_reject
    from ..queue.tasks import Tasks

    project = open_project(project_dir, need_runs=True, run_ref=run_ref)
    row = do_reject(project, Tasks(project), run_ref, story, reason)
    click.echo(f"rejected {row.key}: {reason}")


@cli.command()
@project_option
@run_ref_argument
@json_option
@handle_errors
def reconcile(project_dir, run_ref, as_json):
    """One verdict per story (integrated, held, parked, open); changes nothing.

    Exit 4 when any story is open, else 3 when any is held or parked, else 0.
    """
    from ..engine.run.control import reconcile as do_reconcile

    report, code = do_reconcile(open_project_to_read(project_dir, run_ref=run_ref), run_ref)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(f"run {report['run']} {report['state']}")
        from ..operator.style import key_width

        width = key_width(report["stories"])
        for row in report["stories"]:
            extra = f" ({row['reason']})" if row["reason"] else ""
            click.echo(f"  {row['seq']:>3} {row['key']:<{width}} {row['verdict']:<10} {row['state']}{extra}")
    sys.exit(code)
