"""Operator commands: status (and --watch), journal (and --follow), attach, history, report,
sql, tui. Registered on `cli` when `bmad_loop.cli` imports this module.

Each command parses options, calls one function of `bmad_loop.operator`, prints.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import click

from ..errors import EXIT_USAGE, ConfigError
from .app import (
    cli,
    handle_errors,
    has_state,
    json_option,
    open_project,
    open_project_to_read,
    project_option,
    run_ref_argument,
)

__all__ = ["status", "journal", "attach", "history", "report", "sql", "tui"]


def _open_reader(project_dir, run_ref=None):
    """The project and a read-only `Reader` on its rows (which must exist already)."""
    from ..operator.readonly import Reader

    project = open_project_to_read(project_dir, need_runs=True, run_ref=run_ref)
    return project, Reader(project)


def _interruptible(body):
    """Run `body(stop_event)`; Ctrl+C sets the event instead of raising mid-print."""
    stop = threading.Event()
    try:
        body(stop)
    except KeyboardInterrupt:
        stop.set()


# ---------------------------------------------------------------------------- status
@cli.command()
@project_option
@run_ref_argument
@json_option
@click.option("--watch", is_flag=True,
              help="Live board, re-rendered every --interval seconds until the run settles.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between frames of --watch.")
@handle_errors
def status(project_dir, run_ref, as_json, watch, interval):
    """The run (newest by default), its stories and candidates."""
    from ..engine.run.control import find_run
    from ..engine.run.status import run_status

    project = open_project_to_read(project_dir, need_runs=True, run_ref=run_ref)
    if watch:
        if as_json:
            raise ConfigError("--watch draws the live board; use --json without --watch")
        return _watch(project, run_ref, interval)
    with project.db.transaction() as s:
        run = find_run(s, project, run_ref)
        data = run_status(s, run, target_now=_target_now(project, run.target_branch))
    _add_evidence(project, data)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    from ..operator.status_view import render_status

    click.echo(render_status(data))


def _add_evidence(project, data: dict) -> None:
    """Each escalated story whose verify failed: the ref that keeps the agent's last output and
    the commands that continue from it (`evidence_ref`, `continue`; None when there is none)."""
    from ..engine.verification.record import continue_commands, kept_evidence
    from ..states import StoryState

    run_id = data["run"]["id"]
    for story in data["stories"]:
        ref = None
        if story["state"] == StoryState.ESCALATED:
            try:
                ref = kept_evidence(project.git(), run_id, story["key"])
            except Exception:  # a status must show even when git cannot answer
                ref = None
        story["evidence_ref"] = ref
        story["continue"] = continue_commands(run_id, story["key"], ref, story.get("worktree")) \
            if ref else None


def _target_now(project, branch: str) -> str | None:
    """The target as git has it here (remote mode: as last fetched), whatever the rows say."""
    try:
        return project.target(project.git(), branch).sha(fetch=False)
    except Exception:  # a status must show even when git cannot answer
        return None


def _watch(project, run_ref, interval):
    from ..operator.status_view import BoardWatch

    board = BoardWatch(project, run_ref)
    try:
        _interruptible(lambda stop: board.show(interval, stop))
    finally:
        board.close()


# ---------------------------------------------------------------------------- journal
@cli.command()
@project_option
@run_ref_argument
@click.option("--kind", "kinds", multiple=True, help="Only events of this kind (repeatable).")
@click.option("--story", default=None, help="Only events of this story.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new events until the run settles (or Ctrl+C).")
@json_option
@handle_errors
def journal(project_dir, run_ref, kinds, story, follow, as_json):
    """The run's journal, in order (one JSON object per line with --json)."""
    from ..engine.run.control import find_run
    from ..engine.runrows import stories_of
    from ..operator.follow import follow_journal, format_event, story_ref

    project, reader = _open_reader(project_dir, run_ref)
    with reader.session() as s:
        run_id = find_run(s, project, run_ref).id
        if story is not None:  # `5-1` as in attach and retry; unknown or ambiguous: exit 2
            story = story_ref(stories_of(s, run_id), story, run_id)

    def emit(line):
        click.echo(json.dumps(line, sort_keys=True) if as_json else format_event(line))
        sys.stdout.flush()

    try:
        _interruptible(lambda stop: follow_journal(reader, run_id, emit, kinds=kinds, story=story,
                                                   follow=follow, stop=stop))
    finally:
        reader.close()


# ---------------------------------------------------------------------------- attach
@cli.command()
@project_option
@run_ref_argument
@click.argument("story", required=False)
@click.option("--no-follow", is_flag=True, help="Print the session log as it is and exit.")
@click.option("--all", "all_logs", is_flag=True,
              help="Print every session and verify log of the story, in order, and exit.")
@click.option("--no-wait", is_flag=True,
              help="A story not started yet is an error (exit 2) instead of waited for.")
@handle_errors
def attach(project_dir, run_ref, story, no_follow, all_logs, no_wait):
    """Follow a story's agent session log (dev, then review, then fix …) as it grows.

    Without STORY: the story in flight; with several in flight it lists them and exits 2.
    RUN defaults to the newest run; a lone argument that matches no run is taken as STORY.
    With --all: the story's whole history, each log under a header (phase, attempt, start).
    A story not started yet is waited for ("waiting for STORY (pending)"), like `tail -F`.
    """
    from ..engine.run.control import find_run
    from ..operator.follow import (
        follow_log,
        live_tmux_session,
        not_started,
        pick_story,
        wait_for_start,
    )

    project, reader = _open_reader(project_dir)
    try:
        with reader.session() as s:
            try:
                run_id = find_run(s, project, run_ref).id
            except ConfigError:
                if run_ref is None or story is not None:
                    raise
                # `attach STORY`: a lone argument that names no run names a story of the newest.
                run_id, story = find_run(s, project, None).id, run_ref
        key = pick_story(reader, run_id, story)
        if all_logs:
            return _print_all_logs(project, reader, run_id, key)
        waiting = None if no_follow else not_started(reader, run_id, key)
        if waiting is not None and no_wait:
            raise ConfigError(f"run {run_id}: {waiting} (--no-wait)")
        if waiting is not None:
            started = []
            _interruptible(lambda stop: started.append(wait_for_start(
                reader, run_id, key, lambda line: click.echo(line, err=True), stop=stop)))
            if started != [True]:
                return
        session = None if no_follow else live_tmux_session(reader, run_id, key)
        if session is not None:
            return _attach_tmux(session)

        def write(text):
            click.echo(text, nl=False)
            sys.stdout.flush()

        _interruptible(lambda stop: follow_log(reader, run_id, key, write, follow=not no_follow,
                                               from_first=waiting is not None, stop=stop))
    finally:
        reader.close()


def _print_all_logs(project, reader, run_id: str, key: str) -> None:
    from ..engine.runpaths import Layout
    from ..operator.story_logs import print_story_logs, story_logs

    log_dir = Layout(project.state_dir, run_id).log(key, "dev", 1).parent
    with reader.session() as s:
        logs = story_logs(s, run_id, key, log_dir)
    print_story_logs(logs, lambda text: click.echo(text, nl=False), key)


def _attach_tmux(session: str) -> None:
    """Attach this terminal to the live tmux session; without a terminal (scripts, CI) print
    the session's name and the attach command."""
    import os

    from ..agents.tmux_session import TMUX

    if not sys.stdin.isatty():
        click.echo(f"tmux session {session} (attach with: {' '.join(TMUX)} attach -t {session})")
        return
    os.execvp("tmux", [*TMUX, "attach", "-t", session])


# ---------------------------------------------------------------------------- history, sql
@cli.command()
@project_option
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True,
              help="The newest N runs.")
@click.option("--html", "html_dir", type=click.Path(path_type=Path), default=None,
              help="Write index.html here (a folder; or a FILE.html) and each run's report beside it.")
@json_option
@handle_errors
def history(project_dir, limit, html_dir, as_json):
    """The project's runs, newest first: story counts per state, duration, outcome."""
    from ..operator.history import format_history, run_history
    from ..operator.readonly import Reader

    project = open_project_to_read(project_dir, need_runs=False)
    if html_dir is not None and html_dir.is_file() and html_dir.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"--html {html_dir}: a file that is not .html; give a folder or a FILE.html")
    entries = []
    if has_state(project):
        reader = Reader(project)
        try:
            with reader.session() as s:
                entries = run_history(s, project.key, limit=limit)
                if html_dir is not None:
                    _history_html(s, project, entries, html_dir)
        finally:
            reader.close()
    elif html_dir is not None:
        _history_html(None, project, entries, html_dir)
    click.echo(json.dumps(entries, indent=2) if as_json else format_history(entries))


def _history_html(session, project, entries, target) -> None:
    from sqlalchemy import select

    from ..db.models import Run
    from ..operator.report.html import write_history_reports

    ids = [e["id"] for e in entries]
    runs = list(session.scalars(select(Run).where(Run.id.in_(ids)))) if ids else []
    index = write_history_reports(session, runs, entries, project.state_dir, target)
    click.echo(f"html: {index} ({len(runs)} run report(s) beside it)", err=True)


# ---------------------------------------------------------------------------- report
@cli.command()
@project_option
@run_ref_argument
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the run's report here: one self-contained HTML page.")
@json_option
@handle_errors
def report(project_dir, run_ref, html_path, as_json):
    """A run's report (the newest by default): its timeline, where the time and the money went,
    every escalation and failure with its log, the target's commits. Works for finished,
    paused, stopped and crashed runs."""
    from ..engine.run.control import find_run
    from ..operator.report.data import gather_report
    from ..operator.report.html import write_run_report
    from ..operator.report.text import format_report

    project, reader = _open_reader(project_dir, run_ref)
    try:
        with reader.session() as s:
            run = find_run(s, project, run_ref)
            if html_path is not None:
                path = write_run_report(s, run, project.state_dir, html_path)
                click.echo(f"html: {path}", err=as_json)
            if as_json or html_path is None:
                data = gather_report(s, run, project.state_dir)
                click.echo(json.dumps(data, indent=2) if as_json else format_report(data))
    finally:
        reader.close()


@cli.command()
@project_option
@click.argument("statement")
@json_option
@handle_errors
def sql(project_dir, statement, as_json):
    """Run one read-only SQL statement over the state database (tables and views in
    docs/schema.md). Writes (INSERT, UPDATE, DELETE, DDL, ATTACH, PRAGMA writes) are refused."""
    from ..operator.readonly import format_table, run_query

    project = open_project_to_read(project_dir, need_runs=True)
    project.db  # migrated (views included), like every command
    result = run_query(project.database_url, statement)
    if as_json:
        click.echo(json.dumps(result.records(), indent=2, default=str))
    else:
        click.echo(format_table(result))


# ---------------------------------------------------------------------------- tui
@cli.command()
@project_option
@run_ref_argument
@handle_errors
def tui(project_dir, run_ref):
    """A terminal UI: runs, stories, the lane, the journal; keys to stop, resume, clean up.

    An observer and launcher, never the engine: runs it resumes keep running when it exits.
    Needs the `tui` extra (pip install 'bmad-loop[tui]').
    """
    try:
        from ..operator.tui import BoardApp
    except ImportError as exc:
        click.echo(f"bmad-loop: tui needs textual: pip install 'bmad-loop[tui]' ({exc})", err=True)
        sys.exit(EXIT_USAGE)
    project = open_project(project_dir, need_runs=True, run_ref=run_ref)
    BoardApp(project, run_ref=run_ref).run()
