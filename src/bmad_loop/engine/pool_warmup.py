"""The run's first worktrees, checked out while the run starts.

A new story in a pooled run takes a parked worktree (worktree_pool.py), but at the start of a
run the pool is empty: the first min(N, stories) workers each check out a whole tree, side by
side, only once the run's set-up is done (the start-up clean-up, the consumers' start, the
lane's first pass, each worker's claim: ~150 ms here, nearly all of it Python on one core).
`start_warming` makes those checkouts during the set-up instead, in one thread each: a detached
checkout of the target's tip, built under ``.pool/warming-<n>`` (a take only ever looks at the
numbered folders) and then moved into a free slot, as a park would. Each is announced as a
park (`announce_park`), so a take that finds the pool empty waits for it rather than checking
out one more beside it, and the run's drain waits for it too. The take then switches it to the
story's branch and base (``checkout -b``), which rewrites only the files that differ.

Only where the pool serves (worktree isolation, one branch per story, the lane in this
repository, a pool size above 0; and no pinned ``post-checkout`` hook, which must run on each
story's own checkout) and only as many as the run has new stories to start (a
story that has a branch already keeps its own worktree), less what is parked already. A
checkout that fails is logged and removed: the story's worker makes its worktree as before.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import func, select

from ..db.models import Run, Story
from ..errors import GitError
from ..gitcmd import repo_lock
from ..states import RunState, StoryState
from ..worktrees import admin_dir, ensure_detached_worktree, move_worktree, remove_worktree
from .context import make_workspace
from .layout import Layout
from .runs import run_policy
from .worktree_pool import announce_park, free_slot, mark_fresh, parked, pool_dir, pool_size

__all__ = ["start_warming", "WARMING_PREFIX"]

log = logging.getLogger(__name__)

WARMING_PREFIX = "warming-"


def start_warming(project, run_id: str) -> list[threading.Thread]:
    """Start checking out the worktrees the run's first stories will take; the threads doing it
    (none when the pool does not serve this run, or it has what it needs)."""
    try:
        plan = _plan(project, run_id)
    except Exception:  # a speed-up only: the workers check out their own worktrees
        log.warning("could not plan the worktrees of run %s's start", run_id, exc_info=True)
        return []
    if plan is None:
        return []
    git, layout, sha, count, size = plan
    threads = []
    for n in range(1, count + 1):
        finished = announce_park()  # before any consumer starts: its take waits for this one
        thread = threading.Thread(target=_warm_one, args=(git, layout, sha, n, size, finished),
                                  name=f"bmad-loop-warm-{n}", daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def _plan(project, run_id: str):
    """(git, layout, target sha, how many, pool size), or None when there is nothing to warm."""
    with project.db.read() as s:
        run = s.get(Run, run_id)
        if run is None or run.state != RunState.RUNNING:
            return None
        policy, target_branch = run_policy(run), run.target_branch
        fresh = s.scalar(select(func.count()).select_from(Story).where(
            Story.run_id == run_id, Story.state.in_((StoryState.PENDING, StoryState.QUEUED)),
            Story.branch.is_(None)))
    git = project.git(policy)
    if "post-checkout" in git.run_hooks:
        return None  # the hook runs on each story's own checkout, which a warm take skips
    layout = Layout(project.state_dir, run_id)
    workspace = make_workspace(policy, git, layout, project.target(git, target_branch),
                               root=project.root)
    if not workspace.pools_worktrees:
        return None  # in place, one run branch, or a remote target (story hosts make their own)
    size = pool_size(policy.scm.max_parallel)
    count = min(size, fresh or 0) - len(parked(layout))
    if count < 1:
        return None
    sha = git.rev(f"refs/heads/{target_branch}")  # read from git's files when plain
    return (git, layout, sha, count, size) if sha else None


def _warm_one(git, layout, sha: str, n: int, size: int, finished) -> None:
    building = pool_dir(layout) / f"{WARMING_PREFIX}{n}"
    try:
        ensure_detached_worktree(git, building, sha)
        with repo_lock(git):
            slot = free_slot(layout, size)
            if slot is not None:
                move_worktree(git, building, slot)
                admin = admin_dir(git, slot)
                if admin is not None:
                    mark_fresh(admin, layout)
                return
        remove_worktree(git, building)  # the pool filled meanwhile
    except (GitError, OSError) as exc:
        log.warning("could not check out %s for the run's first stories (%s)", building, exc)
        try:
            remove_worktree(git, building)
        except (GitError, OSError):
            pass  # `bmad-loop cleanup` removes what is left in a settled run's pool
    finally:
        finished()
