"""Where a story's agents and verify commands get their box (bmad_loop.sandbox), and what
bmad-loop puts right in the worktree after a boxed session.

A boxed process writes its tree, its scratch and its log; the guard hooks are not armed, since
no ref is writable at all: an attempt to move the target fails in git and changes nothing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import GitError
from ...sandbox import Box, BoxRequest, decide, make_box, quarantine_has_objects
from ...sandbox.box import clear_quarantine
from ...sandbox.programs import outside_code
from .childenv import story_verify_env

__all__ = ["BoxSite", "agent_box", "verify_box", "story_verify_setup", "settle_after_box"]

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class BoxSite:
    """Where one boxed process works: its tree, its scratch folder, and the log its output
    goes to (outside the box)."""

    tree: Path
    scratch: Path
    log_path: Path


def agent_box(ctx, worktree: Path, log_path: Path, env: dict) -> Box | None:
    """The box of one agent session of the story (None: unboxed)."""
    decision = decide(ctx.policy.adapter.sandbox, "[adapter] sandbox")
    site = BoxSite(worktree, ctx.scratch, log_path)
    return make_box(decision, _request(ctx.git, ctx.layout.state_dir, ctx.db.lock_dir, site,
                                       ctx.policy, env))


def verify_box(policy, git, state_dir: Path, site: BoxSite, env: dict,
               home_state: Path | None = None) -> Box | None:
    """The box of a verify command run in `site.tree` (story or candidate worktree);
    `home_state`: the project's own state folder, when the repository is a clone elsewhere
    (remote mode)."""
    decision = decide(policy.verify.sandbox, "[verify] sandbox")
    return make_box(decision, _request(git, state_dir, home_state, site, policy, env))


def story_verify_setup(ctx, worktree: Path, log_path: Path) -> tuple[dict, Box | None]:
    """The environment and box of a story's verify commands; unboxed, the target guard is
    armed in that environment instead."""
    env = story_verify_env(ctx)
    box = verify_box(ctx.policy, ctx.git, ctx.layout.state_dir,
                     BoxSite(worktree, ctx.scratch, log_path), env, ctx.db.lock_dir)
    if box is None:
        env.update(ctx.workspace.guard_env(worktree, ctx.guard_hooks, ctx.scratch / "guard.log"))
    return env, box


def _request(git, state_dir, home_state, site: BoxSite, policy, env) -> BoxRequest:
    # The log stays outside the box (hidden with the state folder): the output reaches it
    # through the pipe bmad-loop reads, capped, and nothing else.
    site.scratch.mkdir(parents=True, exist_ok=True)
    root, tree = Path(git.repo_dir).resolve(), Path(site.tree).resolve()
    box_env = {k: env.get(k, os.environ.get(k, ""))
               for k in ("HOME", "TMPDIR", "XDG_CONFIG_HOME", "PATH")}
    return BoxRequest(
        project_root=root, state_dir=Path(state_dir).resolve(), git_dir=git.common_dir(),
        tree=tree, scratch=site.scratch.resolve(),
        checkout_tree=tree == root,  # isolation "none" (a candidate worktree never is)
        outside_code=tuple(outside_code(box_env)),
        extra_writable=tuple(policy.adapter.sandbox_writable),
        env=box_env,
        home_project=Path(home_state).resolve().parent if home_state else None,
    )


def settle_after_box(git, worktree: Path, branch: str | None, scratch: Path) -> None:
    """After a boxed session in a linked worktree: HEAD back on the story branch (the agent
    may have detached it or pointed it elsewhere: its admin entry is writable), and the index
    read again from HEAD when the agent's git wrote objects (the index may name objects that
    only its quarantine holds). The files are left as the agent left them; the quarantine goes.
    In the project's own checkout (isolation "none") the box left HEAD and the index read-only:
    only the quarantine goes."""
    if Path(worktree).resolve() == Path(git.repo_dir).resolve():
        clear_quarantine(scratch)
        return
    try:
        moved = False
        if branch:
            head = git.run("symbolic-ref", "-q", "HEAD", cwd=worktree, check=False).stdout.strip()
            if head != f"refs/heads/{branch}":
                git.run("symbolic-ref", "HEAD", f"refs/heads/{branch}", cwd=worktree)
                moved = True
        if moved or quarantine_has_objects(scratch):
            git.run("reset", "-q", cwd=worktree)
    except GitError as exc:  # the commit that follows fails and says so
        log.warning("could not settle %s after a boxed session: %s", worktree, exc)
    clear_quarantine(scratch)
