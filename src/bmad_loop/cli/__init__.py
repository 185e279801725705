"""The `bmad-loop` command line. Each command parses options, calls one service, prints.

`app` holds the click group and what the commands share; importing `run_commands`,
`control_commands` and `operator_commands` registers their commands on it (they import `app`, never the reverse).
"""

from __future__ import annotations

from .app import cli, main
from . import run_commands, control_commands, operator_commands  # noqa: E402,F401,I001  (register the commands)

__all__ = ["main", "cli"]
