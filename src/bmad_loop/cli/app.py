"""The `bmad-loop` click group and what every command shares: the --project and --json
options, one-line errors with their exit code, and opening the project.

The commands live in `run_commands`, `control_commands` and `operator_commands`, which import
this module and register themselves on `cli`; `bmad_loop.cli` imports them all.
"""

from __future__ import annotations

import errno
import functools
import sys
from pathlib import Path

import click

from .. import __version__
from ..errors import EXIT_FAILED, BmadLoopError, ConfigError, NotFound

__all__ = ["cli", "main", "project_option", "json_option", "run_ref_argument", "handle_errors",
           "open_project", "open_project_to_read", "has_state"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bmad-loop")
def cli():
    """Drive coding agents through the stories of a BMAD sprint, several at once,
    without ever corrupting the target branch."""


def main():
    cli(prog_name="bmad-loop")


def project_option(fn):
    return click.option("--project", "project_dir", default=".", envvar="BMAD_LOOP_PROJECT",
                        show_default=True, type=click.Path(file_okay=False, path_type=Path),
                        callback=_project_root,
                        help="Any folder of the project: the nearest folder above it holding "
                             ".bmad-loop/policy.toml, else the top of its git repository.")(fn)


def _project_root(ctx, param, value: Path) -> Path:
    """From a subfolder, the project it belongs to (`policy.load.find_project_root`); a folder that does not
    exist stays as given, for `open_project` to name."""
    from ..policy.load import find_project_root

    return find_project_root(value) if value.is_dir() else value


def json_option(fn):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)


def run_ref_argument(fn):
    """An optional RUN (id, unique prefix or suffix); the newest run when left out."""
    return click.argument("run_ref", metavar="RUN", required=False)(fn)


def handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BmadLoopError as exc:
            _fail(str(exc), exc.exit_code)
        except Exception as exc:
            line = _environment_error(exc)
            if line is None:
                raise
            _fail(line, EXIT_FAILED)
    return wrapper


def _fail(message: str, code: int):
    click.echo(f"bmad-loop: {' '.join(message.splitlines())}", err=True)
    sys.exit(code)


# A fault of the machine rather than of bmad-loop: said in one line naming the file, not as a
# traceback. (Bad input is refused before anything runs, exit 2; these can strike mid-way.)
_ENVIRONMENT_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


def _environment_error(exc: Exception) -> str | None:
    if isinstance(exc, OSError) and exc.errno in _ENVIRONMENT_ERRNOS and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    from sqlalchemy.exc import DatabaseError, OperationalError

    # Locked, read-only, damaged, disk full; not IntegrityError and its kin, which are bugs.
    if type(exc) is DatabaseError or isinstance(exc, OperationalError):
        reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
        return f"the state database: {reason}"
    return None


def has_state(project) -> bool:
    """Has this project a state database yet? (Read commands must not create one.)"""
    return bool(project.policy.database.url) or (project.home_state_dir / "state.db").exists()


def open_project(project_dir: Path, clone: Path | None = None, *, need_runs: bool = False,
                 run_ref: str | None = None):
    """The project at --project; in remote mode (`clone` given) our own clone of [scm] remote
    at `clone`, with the policy (and shared state) still from --project.

    Opening creates nothing. `need_runs`: the command reads or changes recorded runs, so a
    project without a state database is refused as "no runs" (NotFound naming `run_ref` when
    one was given) instead of getting an empty database made for it.
    """
    from ..engine.project import Project

    if not project_dir.is_dir():
        raise ConfigError(f"--project: {project_dir} is not a folder")
    project = Project.open(project_dir) if clone is None else _open_clone(project_dir, clone)
    return _with_runs(project, need_runs, run_ref)


def _with_runs(project, need_runs: bool, run_ref: str | None):
    if need_runs and not has_state(project):
        raise NotFound(f"no run matches '{run_ref}'" if run_ref else f"{project.root}: no runs yet")
    return project


def open_project_to_read(project_dir: Path, *, need_runs: bool = True, run_ref: str | None = None):
    """`open_project` for commands that only read rows (status, journal, attach, history, sql,
    reconcile). A policy.toml that does not load (a typo made mid-run, for `resume
    --reload-policy`) does not block them: the database is BMAD_LOOP_DATABASE_URL, else the
    default SQLite file, and one warning names the policy's error."""
    import os

    from ..engine.project import Project
    from ..policy import load_policy, policy_from_dict

    if not project_dir.is_dir():
        raise ConfigError(f"--project: {project_dir} is not a folder")
    try:
        load_policy(project_dir)
    except ConfigError as exc:
        url = os.environ.get(_DATABASE_URL_ENV, "").strip()
        policy = policy_from_dict({"database": {"url": url}} if url else {}, source="<defaults>")
        where = _DATABASE_URL_ENV if url else "the default .bmad-loop/state.db"
        click.echo(f"bmad-loop: warning: {' '.join(str(exc).splitlines())}; reading the state "
                   f"database from {where}", err=True)
        return _with_runs(Project.open(project_dir, policy=policy), need_runs, run_ref)
    return open_project(project_dir, need_runs=need_runs, run_ref=run_ref)


_DATABASE_URL_ENV = "BMAD_LOOP_DATABASE_URL"


def _open_clone(project_dir: Path, clone: Path):
    from ..engine.project import Project
    from ..policy import load_policy
    from ..git.clone import ensure_clone, resolve_remote_url

    policy = load_policy(project_dir)
    if not policy.scm.remote.strip():
        raise ConfigError(f"--clone {clone}: [scm] remote is empty (local mode); set it in "
                          f"{policy.source} or BMAD_LOOP_SCM_REMOTE")
    checkout = project_dir if (project_dir / ".git").exists() else None
    url = resolve_remote_url(policy.scm.remote, checkout)
    return Project.open(ensure_clone(url, clone), policy=policy, home=project_dir)
