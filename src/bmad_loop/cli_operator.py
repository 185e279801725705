"""Operator commands of the `bmad-loop` CLI: status (and --watch), journal (and --follow),
attach, history, sql, tui. Registered on the `cli` group when cli.py imports this module.

Each command parses options, calls one function of `bmad_loop.operator`, prints.
"""

from __future__ import annotations

import json
import sys
import threading

import click

from .cli import _open, cli, handle_errors, json_option, project_option
from .errors import EXIT_USAGE, ConfigError

__all__ = ["status", "journal", "attach", "history", "sql", "tui"]


def _has_state(project) -> bool:
    """Has this project a state database yet? (Read commands must not create one.)"""
    return bool(project.policy.database.url) or (project.home_state_dir / "state.db").exists()


def _require_state(project) -> None:
    if not _has_state(project):
        raise ConfigError(f"{project.root}: no runs yet")


def _run_ref_argument(fn):
    return click.argument("run_ref", metavar="RUN", required=False)(fn)


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
@_run_ref_argument
@json_option
@click.option("--watch", is_flag=True,
              help="Live board, re-rendered every --interval seconds until the run settles.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between frames of --watch.")
@handle_errors
def status(project_dir, run_ref, as_json, watch, interval):
    """The run (newest by default), its stories and candidates."""
    from .engine.control import find_run
    from .engine.status import run_status

    project = _open(project_dir)
    _require_state(project)
    if watch:
        if as_json:
            raise ConfigError("--watch draws the live board; use --json without --watch")
        return _watch(project, run_ref, interval)
    with project.db.transaction() as s:
        data = run_status(s, find_run(s, project, run_ref))
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    from .render import render_status

    click.echo(render_status(data))


def _watch(project, run_ref, interval):
    from rich.console import Console
    from rich.live import Live

    from .db.models import Run, utcnow
    from .engine.control import find_run
    from .engine.driver import SETTLED
    from .engine.rows import run_policy
    from .engine.status import run_status
    from .operator.board_view import render_board
    from .operator.reader import Reader

    reader = Reader(project)
    with reader.session() as s:
        run = find_run(s, project, run_ref)
        run_id = run.id
        policy = run_policy(run)
    stale_after = float(policy.leases.ttl_s)
    blocks = policy.parallel.on_escalation == "pause"
    console = Console()

    def body(stop):
        previous = None
        with Live(console=console, refresh_per_second=4, auto_refresh=False,
                  redirect_stdout=False, redirect_stderr=False) as live:
            while True:
                with reader.session() as s:
                    row = s.get(Run, run_id)
                    data = run_status(s, row)
                    settled = row.state in SETTLED
                frame = render_board(data, previous, utcnow(), stale_after_s=stale_after,
                                     escalation_blocks=blocks)
                live.update(frame.renderable, refresh=True)
                previous = frame
                if settled or stop.wait(interval):
                    return

    try:
        _interruptible(body)
    finally:
        reader.close()


# ---------------------------------------------------------------------------- journal
@cli.command()
@project_option
@_run_ref_argument
@click.option("--kind", "kinds", multiple=True, help="Only events of this kind (repeatable).")
@click.option("--story", default=None, help="Only events of this story.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new events until the run settles (or Ctrl+C).")
@json_option
@handle_errors
def journal(project_dir, run_ref, kinds, story, follow, as_json):
    """The run's journal, in order (one JSON object per line with --json)."""
    from .engine.control import find_run
    from .operator.follow import follow_journal, format_event
    from .operator.reader import Reader

    project = _open(project_dir)
    _require_state(project)
    reader = Reader(project)
    with reader.session() as s:
        run_id = find_run(s, project, run_ref).id

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
@_run_ref_argument
@click.argument("story", required=False)
@click.option("--no-follow", is_flag=True, help="Print the session log as it is and exit.")
@handle_errors
def attach(project_dir, run_ref, story, no_follow):
    """Follow a story's agent session log (dev, then review, then fix …) as it grows.

    Without STORY: the story in flight; with several in flight it lists them and exits 2.
    RUN defaults to the newest run; a lone argument that matches no run is taken as STORY.
    """
    from .engine.control import find_run
    from .operator.follow import follow_log, pick_story
    from .operator.reader import Reader

    project = _open(project_dir)
    _require_state(project)
    reader = Reader(project)
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
        if _attach_tmux_if_live(reader, run_id, key, no_follow):
            return

        def write(text):
            click.echo(text, nl=False)
            sys.stdout.flush()

        _interruptible(lambda stop: follow_log(reader, run_id, key, write,
                                               follow=not no_follow, stop=stop))
    finally:
        reader.close()


def _attach_tmux_if_live(reader, run_id, key, no_follow) -> bool:
    """With `[adapter] tmux = true` the session name is a tmux session: attach to it live.

    Without a terminal (scripts, CI) it prints the session's name and the attach command."""
    import os
    import shutil
    import subprocess

    from .db.models import Story

    with reader.session() as s:
        row = s.query(Story).filter(Story.run_id == run_id, Story.key == key).one()
        session = row.session
    if no_follow or not session or "/" in session or not shutil.which("tmux"):
        return False
    from .tmux_session import TMUX

    if subprocess.run([*TMUX, "has-session", "-t", session], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
        return False  # the session ended: fall back to its log
    if not sys.stdin.isatty():
        click.echo(f"tmux session {session} (attach with: {' '.join(TMUX)} attach -t {session})")
        return True
    os.execvp("tmux", [*TMUX, "attach", "-t", session])


# ---------------------------------------------------------------------------- history, sql
@cli.command()
@project_option
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True,
              help="The newest N runs.")
@json_option
@handle_errors
def history(project_dir, limit, as_json):
    """The project's runs, newest first: story counts per state, duration, outcome."""
    from .operator.history import format_history, run_history
    from .operator.reader import Reader

    project = _open(project_dir)
    entries = []
    if _has_state(project):
        reader = Reader(project)
        try:
            with reader.session() as s:
                entries = run_history(s, project.key, limit=limit)
        finally:
            reader.close()
    click.echo(json.dumps(entries, indent=2) if as_json else format_history(entries))


@cli.command()
@project_option
@click.argument("statement")
@json_option
@handle_errors
def sql(project_dir, statement, as_json):
    """Run one read-only SQL statement over the state database (tables and views in
    docs/schema.md). Writes (INSERT, UPDATE, DELETE, DDL, ATTACH, PRAGMA writes) are refused."""
    from .operator.sqlquery import format_table, run_query

    project = _open(project_dir)
    project.db  # created and migrated (views included), like every command
    result = run_query(project.database_url, statement)
    if as_json:
        click.echo(json.dumps(result.records(), indent=2, default=str))
    else:
        click.echo(format_table(result))


# ---------------------------------------------------------------------------- tui
@cli.command()
@project_option
@_run_ref_argument
@handle_errors
def tui(project_dir, run_ref):
    """A terminal UI: runs, stories, the lane, the journal; keys to stop, resume, clean up.

    An observer and launcher, never the engine: runs it resumes keep running when it exits.
    Needs the `tui` extra (pip install 'bmad-loop[tui]').
    """
    try:
        from .operator.tui import BoardApp
    except ImportError as exc:
        click.echo(f"bmad-loop: tui needs textual: pip install 'bmad-loop[tui]' ({exc})", err=True)
        sys.exit(EXIT_USAGE)
    project = _open(project_dir)
    _require_state(project)
    BoardApp(project, run_ref=run_ref).run()
