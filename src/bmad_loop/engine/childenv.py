"""The environment of the processes a story step starts: agents and verify commands.

Ours, minus git's redirection variables (`GIT_DIR`, `GIT_INDEX_FILE`, …) that would point a
child's git at the wrong repository, plus a per-story sandbox. (bmad-loop's own git processes
get theirs from `gitcmd`, which also pins the locale and turns prompts off.)
"""

from __future__ import annotations

import os

from .ports import port_env

__all__ = ["child_env", "sandbox_vars", "story_verify_env"]


def child_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}


def sandbox_vars(ctx) -> dict:
    """Per-story scratch state outside the worktree, so parallel agents never share temp files."""
    scratch = ctx.scratch
    (scratch / "state").mkdir(parents=True, exist_ok=True)
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    values = {"BMAD_LOOP_STATE_DIR": str(scratch / "state"), "TMPDIR": str(scratch / "tmp")}
    values.update(port_env(ctx.port_block))
    return values


def story_verify_env(ctx, worktree) -> dict:
    """What a story's verify commands run with: ours, its sandbox, and the armed target guard."""
    env = child_env()
    env.update(sandbox_vars(ctx))
    env.update(ctx.workspace.guard_env(worktree, ctx.guard_hooks, ctx.scratch / "guard.log"))
    return env
