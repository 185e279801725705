"""What `cleanup --forget-database` and `resume` print about other state databases' runs
(engine/run/cleanup.py, engine/run/ownership.py)."""

from __future__ import annotations

import json

import click

from .app import has_state

__all__ = ["forget_command", "echo_new_warnings"]


def forget_command(project, forget_id, force, dry_run, as_json):
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


def echo_new_warnings(project, run_id: str, after_seq: int) -> None:
    """The `run.warning`s the resume journaled (another state database's stale run on the
    target), on stderr: with --enqueue-only nothing else would show them."""
    from ..engine.journal import events_after

    with project.db.read() as s:
        for event in events_after(s, run_id, after_seq, ("run.warning",), None):
            click.echo(f"warning: {(event.data or {}).get('message')}", err=True)
