"""What a process bmad-loop starts for a story or the lane gets: its environment, its ports,
and its box.

**The environment.** Ours, minus git's redirection variables (`GIT_DIR`, `GIT_INDEX_FILE`, …)
that would point a child's git at the wrong repository, minus whatever reaches bmad-loop's own
state (the state database's and the queue's URL and password, in any variable), plus a
per-story sandbox. (bmad-loop's own git processes get theirs from `bmad_loop.git`, which also pins
the locale and turns prompts off.)

**Port blocks.** `[resources] ports = "LOW-HIGH"` is split evenly into one block per worker
slot plus one for the lane's candidate verification, so parallel dev servers never collide.
Block i covers LOW + i*size … LOW + (i+1)*size - 1 with size = (HIGH - LOW + 1) // (N + 1); the
lane always has block N. A range too small to give every block a port is bad input.

**The box.** Where a story's agents and verify commands, and the lane's, get their box
(bmad_loop.sandbox), and what bmad-loop puts right in the worktree after a boxed session. A
boxed process writes its tree, its scratch and its log; the guard hooks are not armed, since no
ref is writable at all: an attempt to move the target fails in git and changes nothing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ...errors import ConfigError, GitError
from ...git.runner import Git
from ...policy import Policy
from ...sandbox import Box, BoxRequest, decide, make_box, quarantine_has_objects
from ...sandbox.box import clear_quarantine
from ...sandbox.programs import outside_code

if TYPE_CHECKING:
    from ...db.database import Database
    from ..runpaths import Layout
    from ..workspace.base import Workspace

__all__ = ["PortBlock", "child_env", "sandbox_vars", "story_verify_env", "without_state_access",
           "block_size", "worker_block", "lane_block", "lane_slot_block", "port_env",
           "check_port_range", "BoxSite", "agent_box", "verify_box", "story_verify_setup",
           "settle_after_box"]

log = logging.getLogger(__name__)

# The policy's own overrides for where the state lives ([database] url, [queue] url ...).
_STATE_PREFIXES = ("BMAD_LOOP_DATABASE_", "BMAD_LOOP_QUEUE_")
_SHORTEST_SECRET = 4  # a password shorter than this would match unrelated values


def child_env(policy: Policy) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return without_state_access(env, policy)


def without_state_access(env: dict[str, str], policy: Policy) -> dict[str, str]:
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


class StorySite(Protocol):
    """What the story's environment and boxes are made from (a worker's `StoryContext`)."""

    @property
    def policy(self) -> Policy: ...

    @property
    def git(self) -> Git: ...

    @property
    def db(self) -> Database: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def workspace(self) -> Workspace: ...

    @property
    def port_block(self) -> PortBlock | None: ...

    @property
    def guard_hooks(self) -> Path: ...

    @property
    def scratch(self) -> Path: ...


def sandbox_vars(ctx: StorySite) -> dict[str, str]:
    """Per-story scratch state outside the worktree, so parallel agents never share temp files."""
    scratch = ctx.scratch
    (scratch / "state").mkdir(parents=True, exist_ok=True)
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    values = {"BMAD_LOOP_STATE_DIR": str(scratch / "state"), "TMPDIR": str(scratch / "tmp")}
    values.update(port_env(ctx.port_block))
    return values


def story_verify_env(ctx: StorySite) -> dict[str, str]:
    """What a story's verify commands run with: ours and its sandbox (the target guard, when
    unboxed, is added by `story_verify_setup`)."""
    env = child_env(ctx.policy)
    env.update(sandbox_vars(ctx))
    return env


class PortBlock(TypedDict):
    """One block of `[resources] ports`: `count` ports from `base`; `index` is its slot."""

    base: int
    count: int
    index: int


def _range(policy: Policy) -> tuple[int, int] | None:
    return policy.resources.port_range if policy.resources.ports else None


def block_size(policy: Policy) -> int:
    bounds = _range(policy)
    if bounds is None:
        return 0
    low, high = bounds
    return (high - low + 1) // (policy.scm.max_parallel + 1)


def check_port_range(policy: Policy) -> None:
    if _range(policy) is not None and block_size(policy) < 1:
        raise ConfigError(
            f"{policy.source}: [resources] ports = \"{policy.resources.ports}\" is too small for "
            f"{policy.scm.max_parallel} worker(s) and the lane: each block would be empty")
    # The lane's block is shared out among the candidates it verifies at once (speculation.py).
    depth = policy.verify.depth(policy.scm.max_parallel)
    if _range(policy) is not None and block_size(policy) < depth:
        raise ConfigError(
            f"{policy.source}: [resources] ports = \"{policy.resources.ports}\" is too small for "
            f"{depth} candidates verified at once ([verify] parallel): the lane's block of "
            f"{block_size(policy)} port(s) cannot give each one")


def worker_block(policy: Policy, index: int | None) -> PortBlock | None:
    if index is None or _range(policy) is None:
        return None
    size = block_size(policy)
    low, _ = _range(policy) or (0, 0)  # a range: checked above
    return {"base": low + index * size, "count": size, "index": index}


def lane_block(policy: Policy) -> PortBlock | None:
    return worker_block(policy, policy.scm.max_parallel)


def lane_slot_block(policy: Policy, slot: int, depth: int) -> PortBlock | None:
    """The lane's port block shared out among the `depth` verifications it runs at once
    (speculative candidates, a target check): slot `slot`'s share."""
    block = lane_block(policy)
    if not block:
        return None
    size = max(1, block["count"] // depth)
    slot %= depth  # a given-up verification may still be ending while its successor starts
    return {"base": block["base"] + slot * size, "count": size, "index": block["index"]}


def port_env(block: PortBlock | None) -> dict[str, str]:
    if not block:
        return {}
    return {"BMAD_LOOP_PORT_BASE": str(block["base"]), "BMAD_LOOP_PORT_COUNT": str(block["count"])}


@dataclass(frozen=True)
class BoxSite:
    """Where one boxed process works: its tree, its scratch folder, and the log its output
    goes to (outside the box)."""

    tree: Path
    scratch: Path
    log_path: Path


def agent_box(ctx: StorySite, worktree: Path, log_path: Path,
              env: Mapping[str, str]) -> Box | None:
    """The box of one agent session of the story (None: unboxed)."""
    decision = decide(ctx.policy.adapter.sandbox, "[adapter] sandbox")
    site = BoxSite(worktree, ctx.scratch, log_path)
    return make_box(decision, _request(ctx.git, ctx.layout.state_dir, ctx.db.lock_dir, site,
                                       ctx.policy, env))


def verify_box(policy: Policy, git: Git, state_dir: Path, site: BoxSite, env: Mapping[str, str],
               home_state: Path | None = None) -> Box | None:
    """The box of a verify command run in `site.tree` (story or candidate worktree);
    `home_state`: the project's own state folder, when the repository is a clone elsewhere
    (remote mode)."""
    decision = decide(policy.verify.sandbox, "[verify] sandbox")
    return make_box(decision, _request(git, state_dir, home_state, site, policy, env))


def story_verify_setup(ctx: StorySite, worktree: Path,
                       log_path: Path) -> tuple[dict[str, str], Box | None]:
    """The environment and box of a story's verify commands; unboxed, the target guard is
    armed in that environment instead."""
    env = story_verify_env(ctx)
    box = verify_box(ctx.policy, ctx.git, ctx.layout.state_dir,
                     BoxSite(worktree, ctx.scratch, log_path), env, ctx.db.lock_dir)
    if box is None:
        env.update(ctx.workspace.guard_env(worktree, ctx.guard_hooks, ctx.scratch / "guard.log"))
    return env, box


def _request(git: Git, state_dir: Path, home_state: Path | None, site: BoxSite, policy: Policy,
             env: Mapping[str, str]) -> BoxRequest:
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


def settle_after_box(git: Git, worktree: Path, branch: str | None, scratch: Path) -> None:
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
