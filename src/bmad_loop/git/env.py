"""What bmad-loop's own git processes run with: their environment and the git executable.

The environment is the caller's without the variables that would point git somewhere else (a
repository, an index, a work tree, configuration), plus fixed settings (no prompts, no optional
locks, the C locale). The executable is the git the search path finds, looked up once per
search path instead of by every process start.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from ..caches import CACHES

__all__ = ["clean_env", "git_program"]

# Inherited GIT_* variables we keep: they only say how to reach remotes or how to trace.
_KEEP_GIT_VARS = frozenset({
    "GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_ASKPASS", "GIT_PROXY_COMMAND",
    "GIT_SSL_NO_VERIFY", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH", "GIT_HTTP_USER_AGENT",
    "GIT_CURL_VERBOSE", "GIT_EXEC_PATH",
    "GIT_CONFIG_NOSYSTEM",  # can only make git read less configuration
})


_PROGRAMS: dict[str | None, str] = {}  # PATH -> the git it finds there ("git" when none)
CACHES.register("git.programs", _PROGRAMS.clear, bound="one per PATH seen",
               holds="PATH -> the git it finds there")


def git_program(path: str | None) -> str:
    """The git executable the search path `path` finds, looked up once per search path. Spares
    every git step the search itself (an exec tried in each folder of PATH before git's)."""
    found = _PROGRAMS.get(path)
    if found is None:
        found = shutil.which("git", path=path) or ""
        if not os.path.isabs(found):  # none, or in a relative folder of PATH: let exec search
            found = "git"
        if len(_PROGRAMS) > 16:
            _PROGRAMS.clear()
        _PROGRAMS[path] = found
    return found


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ without git redirections, plus our fixed settings, plus `extra` (which wins)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GIT_") or k in _KEEP_GIT_VARS or k.startswith("GIT_TRACE")
    }
    env["LC_ALL"] = "C"
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_OPTIONAL_LOCKS"] = "0"
    if extra:
        env.update({str(k): str(v) for k, v in extra.items()})
    return env
