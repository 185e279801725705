"""The run's first worktrees, checked out while the run starts (engine/pool_warmup.py).

Real repositories and runs; git's own trace counts the checkouts, and a worktree's ``.git``
file names its admin entry, which keeps the name of the folder that first made it (the start's
checkouts are made as ``.pool/warming-<n>``). The races with takes and the drain are held at
barriers (events and a seam), never timed.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from bmad_loop.engine import worktree_pool
from bmad_loop.engine.layout import Layout
from bmad_loop.engine.pool_warmup import start_warming
from bmad_loop.engine.project import Project
from bmad_loop.engine.worktree_pool import (announce_park, drain_pool, free_slot, park, parked,
                                             pool_dir, take)
from bmad_loop.policy import load_policy
from bmad_loop.worktrees import (admin_dir, ensure_detached_worktree, list_worktrees,
                                 move_worktree)
from support import ALPHA_BETA_GAMMA, DEADLINE_S, MERGE_NONE, git
from test_worktree_pool import PROBE_AGENT, _admin_of, _parked_worktrees, _traced, run_traced

THREE = ALPHA_BETA_GAMMA
PARALLEL = MERGE_NONE.format(n=2, strategy="merge") + '[review]\nenabled = false\n'


def _probe(make_repo, tmp_path, policy: str):
    agent, log = tmp_path / "probe.py", tmp_path / "seen.jsonl"
    agent.write_text(PROBE_AGENT)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({s.key: {s.files[0]: f"NAME = '{s.key}'\n"} for s in THREE}))
    command = json.dumps([sys.executable, str(agent), str(log), str(plan)])
    repo = make_repo(THREE, files={"src/__init__.py": ""},
                     policy=policy + f"[adapter]\ncommand = {command}\ntimeout_s = 60\n")
    return repo, log


def test_the_first_stories_work_in_worktrees_checked_out_as_the_run_started(
        make_repo, tmp_path, monkeypatch):
    """Two slots: two checkouts for the whole run, both made at its start; the third story
    takes one of them back from the pool. Each agent sees a fresh worktree on its branch."""
    repo, log = _probe(make_repo, tmp_path, PARALLEL)
    trace = tmp_path / "run.trace"
    seen = run_traced(repo, log, trace, monkeypatch)
    assert {seen[s.key]["admin"] for s in THREE[:2]} == {"warming-1", "warming-2"}
    assert seen[THREE[2].key]["admin"] in {"warming-1", "warming-2"}
    assert _traced(trace, "read-tree -u --reset") == 2 and _traced(trace, "worktree add") == 0
    for story in THREE:
        got = seen[story.key]
        assert got["branch"] == f"bmad-loop/{repo.status()['run']['id']}/{story.key}"
        assert got["head"] == got["base"]
        assert got["status"] == ["!! .bmad-loop-session/dev-1.md"], got["status"]
    assert repo.worktrees() == [str(repo.root)] and repo.bmad_branches() == []
    run_dir = repo.root / ".bmad-loop" / "worktrees" / repo.status()["run"]["id"]
    assert not (run_dir / ".pool").exists()


def _enqueued(make_repo, policy: str, env: dict | None = None):
    repo = make_repo(THREE, policy=policy)
    assert repo.cli("enqueue").exit_code == 0
    project = Project(root=repo.root, policy=load_policy(repo.root))
    run_id = repo.status()["run"]["id"]
    return repo, project, run_id, Layout(project.state_dir.resolve(), run_id)


def test_start_warming_parks_detached_clean_checkouts_of_the_target(make_repo):
    repo, project, run_id, layout = _enqueued(make_repo, PARALLEL)
    threads = start_warming(project, run_id)
    for thread in threads:
        thread.join(DEADLINE_S)

    assert len(threads) == 2  # max_parallel, fewer than the three new stories
    slots = parked(layout)
    assert [p.name for p in slots] == ["1", "2"]
    tip = git(repo.root, "rev-parse", "refs/heads/main")
    for slot in slots:
        assert git(slot, "rev-parse", "HEAD") == tip
        assert git(slot, "status", "--porcelain", "--untracked-files=all") == ""
        assert (slot / "src" / "__init__.py").exists() or (slot / "README.md").exists()
    listed = git(repo.root, "worktree", "list", "--porcelain")
    assert "locked" not in listed and listed.count("detached") == 2
    # Asked again (a resume in the same state): the pool has what the run needs.
    assert start_warming(project, run_id) == []
    assert sorted(drain_pool(project.git(), layout)) == sorted(str(p) for p in slots)
    assert len(list_worktrees(project.git())) == 1
    project.close()


@pytest.mark.parametrize("policy, env", [
    ('[scm]\nisolation = "none"\n', {}),
    ('[scm]\nbranch_per = "run"\n', {}),
    ('[scm]\nrun_hooks = ["post-checkout"]\n', {}),
    ('[scm]\nmax_parallel = 2\n', {worktree_pool.POOL_ENV: "0"}),
], ids=["in-place", "one-run-branch", "post-checkout-hook", "pool-off"])
def test_nothing_is_checked_out_ahead_where_the_pool_does_not_serve(make_repo, monkeypatch,
                                                                     policy, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    repo, project, run_id, layout = _enqueued(make_repo, policy)
    assert start_warming(project, run_id) == []
    assert not pool_dir(layout).exists() and len(list_worktrees(project.git())) == 1
    project.close()


def test_a_take_that_finds_only_an_unfit_worktree_still_waits_for_an_announced_one(
        tmp_path, monkeypatch):
    """The pool holds a worktree that is no longer fit (locked) and one more is on its way
    (announced): the take removes the unfit one and then waits for the other, instead of
    saying no and leaving its story to check out a whole tree beside it."""
    monkeypatch.setattr(worktree_pool, "PARK_WAIT_S", DEADLINE_S)
    git_, layout, base = _parked_worktrees(tmp_path, 1)
    (unfit,) = parked(layout)
    git(unfit, "worktree", "lock", str(unfit))
    coming = announce_park()
    done, got = threading.Event(), {}

    def taker():
        got["taken"] = take(git_, layout, layout.story_worktree("2-1-next"),
                            layout.story_branch("2-1-next"), base)
        done.set()

    thread = threading.Thread(target=taker)
    thread.start()
    # The unfit one goes first (the take holds the lock while it removes it) ...
    while unfit.exists() and not done.is_set():
        done.wait(0.01)
    assert not done.is_set(), got  # ... and the take is still waiting
    made = layout.story_worktree("1-7-late")
    ensure_detached_worktree(git_, made, base)
    with worktree_pool.repo_lock(git_):
        move_worktree(git_, made, free_slot(layout, 2))
    coming()
    thread.join(DEADLINE_S)
    assert got == {"taken": True}
    assert _admin_of(layout.story_worktree("2-1-next")) == "1-7-late"


def test_the_drain_waits_for_a_checkout_under_way_and_removes_it(tmp_path, monkeypatch):
    """A run that settles while a start-of-run checkout is still being made: the drain waits
    for it, and removes it with the rest, so nothing is left parked past the run."""
    monkeypatch.setattr(worktree_pool, "PARK_WAIT_S", DEADLINE_S)
    git_, layout, base = _parked_worktrees(tmp_path, 1)
    coming = announce_park()
    draining, removed = threading.Event(), []
    original = worktree_pool._await_announced

    def seam(wait_s):
        draining.set()
        original(wait_s)

    monkeypatch.setattr(worktree_pool, "_await_announced", seam)
    thread = threading.Thread(target=lambda: removed.extend(drain_pool(git_, layout)))
    thread.start()
    assert draining.wait(DEADLINE_S)
    # The checkout lands after the drain began: one in a slot, one never moved to its slot.
    late, stray = pool_dir(layout) / "warming-1", pool_dir(layout) / "warming-2"
    ensure_detached_worktree(git_, late, base)
    with worktree_pool.repo_lock(git_):
        move_worktree(git_, late, free_slot(layout, 3))
    ensure_detached_worktree(git_, stray, base)
    coming()
    thread.join(DEADLINE_S)
    assert not thread.is_alive()
    assert sorted(Path(p).name for p in removed) == ["1", "2", "warming-2"]
    assert not pool_dir(layout).exists() and len(list_worktrees(git_)) == 1


def test_a_fresh_take_on_another_base_checks_that_base_out(tmp_path):
    """A start-of-run checkout is at the target's tip; a story whose base differs (the target
    moved, a stacked start) gets its own base's files, through git's checkout."""
    from bmad_loop.engine.worktree_pool import mark_fresh

    git_, layout, base = _parked_worktrees(tmp_path, 0)
    (tmp_path / "repo" / "a.txt").write_text("changed\n")
    git(tmp_path / "repo", "commit", "-qam", "moved")
    moved = git(tmp_path / "repo", "rev-parse", "HEAD")
    made = pool_dir(layout) / "warming-1"
    ensure_detached_worktree(git_, made, base)
    with worktree_pool.repo_lock(git_):
        slot = free_slot(layout, 1)
        move_worktree(git_, made, slot)
    mark_fresh(admin_dir(git_, slot), layout)
    path, branch = layout.story_worktree("1-1-next"), layout.story_branch("1-1-next")

    assert take(git_, layout, path, branch, moved)
    assert git(path, "rev-parse", "HEAD") == moved and (path / "a.txt").read_text() == "changed\n"
    assert git(path, "symbolic-ref", "--short", "HEAD") == branch
    assert git(path, "status", "--porcelain") == ""
    assert park(git_, path, branch, layout, size=1) is not None  # parks as any other
