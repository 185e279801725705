"""What bmad-loop's own git processes run with: their environment and the git executable.

The environment is the caller's without the variables that would point git somewhere else (a
repository, an index, a work tree, configuration), plus fixed settings (no prompts, no optional
locks, the C locale). The executable is the trusted git of this process (looked up once).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from ..errors import GitError
from ..sandbox.programs import trusted_program, untrusted_reason

__all__ = ["clean_env", "git_program"]

# Inherited GIT_* variables we keep: they only say how to reach remotes or how to trace.
_KEEP_GIT_VARS = frozenset({
    "GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_ASKPASS", "GIT_PROXY_COMMAND",
    "GIT_SSL_NO_VERIFY", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH", "GIT_HTTP_USER_AGENT",
    "GIT_CURL_VERBOSE", "GIT_EXEC_PATH",
    "GIT_CONFIG_NOSYSTEM",  # can only make git read less configuration
})


def git_program(path: str | None = None) -> str:
    """The git executable bmad-loop runs: the trusted one (`sandbox.programs`), looked up once
    per process on its PATH, never a git planted later in a folder the box writes; `path` is
    not searched (kept for callers). GitError when PATH has no git, or none it can trust."""
    found = trusted_program("git")
    if not found:
        planted = shutil.which("git")
        raise GitError(f"cannot run git: {untrusted_reason(planted) if planted else 'not on PATH'}")
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
