"""The environment of the processes a story step starts: agents and verify commands.

Ours, minus git's redirection variables (`GIT_DIR`, `GIT_INDEX_FILE`, …) that would point a
child's git at the wrong repository, minus whatever reaches bmad-loop's own state (the state
database's and the queue's URL and password, in any variable), plus a per-story sandbox.
(bmad-loop's own git processes get theirs from `gitcmd`, which also pins the locale and turns
prompts off.)
"""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ..ports import port_env

__all__ = ["child_env", "sandbox_vars", "story_verify_env", "without_state_access"]

# The policy's own overrides for where the state lives ([database] url, [queue] url ...).
_STATE_PREFIXES = ("BMAD_LOOP_DATABASE_", "BMAD_LOOP_QUEUE_")
_SHORTEST_SECRET = 4  # a password shorter than this would match unrelated values


def child_env(policy) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return without_state_access(env, policy)


def without_state_access(env: dict, policy) -> dict:
    """`env` without any variable that holds the state database's or the queue's URL or
    password, nor bmad-loop's own overrides of them."""
    secrets = [u for u in (policy.database.url, policy.queue.url) if u]
    secrets += [p for p in map(_password, secrets) if p and len(p) >= _SHORTEST_SECRET]
    return {k: v for k, v in env.items()
            if not k.startswith(_STATE_PREFIXES) and not any(s in v for s in secrets)}


def _password(url: str) -> str | None:
    try:
        return make_url(url).password
    except (ArgumentError, ValueError):
        return None


def sandbox_vars(ctx) -> dict:
    """Per-story scratch state outside the worktree, so parallel agents never share temp files."""
    scratch = ctx.scratch
    (scratch / "state").mkdir(parents=True, exist_ok=True)
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    values = {"BMAD_LOOP_STATE_DIR": str(scratch / "state"), "TMPDIR": str(scratch / "tmp")}
    values.update(port_env(ctx.port_block))
    return values


def story_verify_env(ctx) -> dict:
    """What a story's verify commands run with: ours and its sandbox (the target guard, when
    unboxed, is added by `boxing.story_verify_setup`)."""
    env = child_env(ctx.policy)
    env.update(sandbox_vars(ctx))
    return env
