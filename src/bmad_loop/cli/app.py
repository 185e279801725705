"""The `bmad-loop` click group and what every command shares: the --project and --json
options, one-line errors with their exit code, and opening the project.

The commands live in `run_commands` and `operator_commands`, which import this module and
register themselves on `cli`; `bmad_loop.cli` imports all three.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from .. import __version__
from ..errors import BmadLoopError, ConfigError

__all__ = ["cli", "main", "project_option", "json_option", "run_ref_argument", "handle_errors",
           "open_project"]


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
                        help="The repository (or any folder holding .bmad-loop/policy.toml).")(fn)


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
            click.echo(f"bmad-loop: {exc}", err=True)
            sys.exit(exc.exit_code)
    return wrapper


def open_project(project_dir: Path, clone: Path | None = None):
    """The project at --project; in remote mode (`clone` given) our own clone of [scm] remote
    at `clone`, with the policy (and shared state) still from --project."""
    from ..engine.project import Project

    if not project_dir.is_dir():
        raise ConfigError(f"--project: {project_dir} is not a folder")
    if clone is None:
        return Project.open(project_dir)
    return _open_clone(project_dir, clone)


def _open_clone(project_dir: Path, clone: Path):
    from ..engine.project import Project
    from ..policy import load_policy
    from ..remote import ensure_clone, resolve_remote_url

    policy = load_policy(project_dir)
    if not policy.scm.remote.strip():
        raise ConfigError(f"--clone {clone}: [scm] remote is empty (local mode); set it in "
                          f"{policy.source} or BMAD_LOOP_SCM_REMOTE")
    checkout = project_dir if (project_dir / ".git").exists() else None
    url = resolve_remote_url(policy.scm.remote, checkout)
    return Project.open(ensure_clone(url, clone), policy=policy, home=project_dir)
