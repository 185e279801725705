"""The worktree pool: an integrated story's worktree is parked and the next new story takes it.

Real repositories, real runs through the CLI (in process, or as a child process where the test
must act while the run is held at a named delay point), real threads racing for the pool.
Reuse is observed from outside: git's own trace counts ``worktree add`` and ``worktree move``,
and a worktree's ``.git`` file names its admin entry, which keeps the name of the story that
first made it (a fresh ``worktree add`` names it after its own folder).
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
from pathlib import Path

import pytest

from bmad_loop.engine.runpaths import Layout
from bmad_loop.engine.workspace import pool as worktree_pool
from bmad_loop.engine.workspace.pool import (
    POOL_ENV,
    announce_park,
    drain_pool,
    park,
    parked,
    pool_dir,
    take,
)
from bmad_loop.git.worktrees import delete_branch, ensure_worktree, list_worktrees
from support import (ALPHA_BETA_GAMMA, DEADLINE_S, barrier_script, git_repo, go, wait_for_exit,
                     wait_for_files, wait_until, write)

THREE = ALPHA_BETA_GAMMA
RUN = '[scm]\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n[review]\nenabled = false\n'

# An agent that records what its worktree looks like before it works, then writes its files.
PROBE_AGENT = '''import json, os, subprocess, sys
from pathlib import Path
log, plan = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
key, wt = os.environ["BMAD_LOOP_STORY_KEY"], Path(os.environ["BMAD_LOOP_WORKTREE"])
def git(*args):
    return subprocess.run(["git", *args], cwd=wt, capture_output=True, text=True).stdout.strip()
seen = {"key": key,
        "admin": Path((wt / ".git").read_text().split(":", 1)[1].strip()).name,
        "build_output": (wt / "build" / "out.o").exists(),
        "branch": git("symbolic-ref", "--short", "HEAD"),
        "head": git("rev-parse", "HEAD"), "base": os.environ["BMAD_LOOP_BASE_SHA"],
        "status": sorted(git("status", "--porcelain", "--ignored", "--untracked-files=all").splitlines()),
        "reflog": len(git("reflog", "HEAD").splitlines())}
with open(log, "a") as handle:
    handle.write(json.dumps(seen) + "\\n")
for rel, text in plan.get(key, {}).items():
    (wt / rel).parent.mkdir(parents=True, exist_ok=True)
    (wt / rel).write_text(text)
'''


def _probe_repo(make_repo, tmp_path, name: str):
    """Three stories; the first also leaves ignored build output (build/ ignores everything)."""
    agent, plan, log = tmp_path / "probe.py", tmp_path / "plan.json", tmp_path / f"{name}.jsonl"
    agent.write_text(PROBE_AGENT)
    plan.write_text(json.dumps({s.key: {s.files[0]: f"NAME = '{s.key}'\n"} for s in THREE}
                               | {"1-1-alpha": {"src/alpha.py": "A\n", "build/out.o": "obj\n"}}))
    command = json.dumps([sys.executable, str(agent), str(log), str(plan)])
    repo = make_repo(THREE, name=name, files={"src/__init__.py": "", "build/.gitignore": "*\n!.gitignore\n"},
                     policy=RUN + f"[adapter]\ncommand = {command}\ntimeout_s = 60\n")
    return repo, log


def _traced(trace: Path, what: str) -> int:
    return sum(1 for line in trace.read_text().splitlines() if f"trace: built-in: git {what} " in line)


def test_a_three_story_run_reuses_one_worktree_cleans_it_and_leaves_none_behind(
        make_repo, tmp_path, monkeypatch):
    repo, log = _probe_repo(make_repo, tmp_path, "reuse")
    trace = tmp_path / "reuse.trace"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    result = repo.cli("run")
    monkeypatch.delenv("GIT_TRACE")
    assert result.exit_code == 0, result.output

    seen = {r["key"]: r for r in map(json.loads, log.read_text().splitlines())}
    # One checkout for the run: the 2nd and 3rd stories work in the worktree the 1st made.
    assert [seen[s.key]["admin"] for s in THREE] == ["1-1-alpha"] * 3
    # (A new worktree is registered by `worktree add --no-checkout`, then checked out:
    # `read-tree`.)
    assert _traced(trace, "read-tree -u --reset") == 1 and _traced(trace, "worktree add") == 1
    # Three parks and two takes moved it (`worktree move`), and the parks detached its HEAD
    # (`update-ref --no-deref`).
    assert _traced(trace, "worktree move") == 5
    assert _traced(trace, "update-ref --no-deref") == 3
    for story in THREE:
        got = seen[story.key]
        # What the agent sees is what a fresh worktree gives: its branch at its base, nothing
        # but the session folder beside the tracked files (the last story's ignored build
        # output is gone), and no HEAD history of another story.
        assert got["branch"] == f"bmad-loop/{repo.status()['run']['id']}/{story.key}"
        assert got["head"] == got["base"]
        assert got["build_output"] is False
        assert got["status"] == ["!! .bmad-loop-session/dev-1.md"], got["status"]
        assert got["reflog"] <= 2  # a fresh worktree has 2; the last story left 4 or more
    # Settled: nothing parked, nothing left.
    assert repo.worktrees() == [str(repo.root)]
    assert repo.bmad_branches() == []
    run_dir = repo.root / ".bmad-loop" / "worktrees" / repo.status()["run"]["id"]
    assert not (run_dir / ".pool").exists()


def test_the_target_gets_the_same_trees_with_and_without_the_pool(make_repo, tmp_path, monkeypatch):
    pooled, _ = _probe_repo(make_repo, tmp_path, "pooled")
    assert pooled.cli("run").exit_code == 0
    monkeypatch.setenv(POOL_ENV, "0")
    trace = tmp_path / "fresh.trace"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    fresh, fresh_log = _probe_repo(make_repo, tmp_path, "fresh")
    assert fresh.cli("run").exit_code == 0
    monkeypatch.delenv("GIT_TRACE")

    assert _traced(trace, "read-tree -u --reset") == 3 and _traced(trace, "worktree move") == 0
    assert [json.loads(r)["admin"] for r in fresh_log.read_text().splitlines()] == [
        s.key for s in THREE]
    assert [c["tree"] for c in pooled.first_parent_trees()] == [
        c["tree"] for c in fresh.first_parent_trees()]
    assert fresh.worktrees() == [str(fresh.root)]


SPOILERS = {
    "1-1-alpha": ("a tracked file changed after the commit",
                  lambda wt, admin, repo: write(wt / "README.md", "edited by hand\n")),
    "1-2-beta": ("locked", lambda wt, admin, repo: repo.git("worktree", "lock", str(wt))),
    "1-3-gamma": ("a planted per-worktree configuration",
                  lambda wt, admin, repo: write(admin / "config.worktree", "[core]\n\tfsmonitor = x\n")),
}


def test_a_dirty_locked_or_configured_worktree_is_removed_never_parked(make_repo, bar, tmp_path):
    """Each story's worktree is spoiled while the worker is held just after its commit
    (delay point worker.in_commit); the next story's agent is held at a barrier until the
    spoiled one is integrated and its worktree gone."""
    delays = tmp_path / "delays"
    delays.mkdir()
    repo = make_repo(THREE, script=barrier_script(THREE, bar), policy=RUN)
    trace = tmp_path / "spoiled.trace"
    proc = repo.spawn("run", env={"BMAD_LOOP_DELAY_AT": "worker.in_commit",
                                  "BMAD_LOOP_DELAY_DIR": str(delays), "GIT_TRACE": str(trace)})
    reached, release = delays / "worker.in_commit.reached", delays / "worker.in_commit.go"
    state = (repo.root / ".bmad-loop").resolve()
    for k, story in enumerate(THREE):
        wait_for_files(bar / f"in-{story.key}")
        run_id = repo.status()["run"]["id"]
        worktree = state / "worktrees" / run_id / story.key
        # Each story's worktree was made anew: the one before was not parked.
        assert (worktree / ".git").read_text().strip().endswith(f"/worktrees/{story.key}")
        assert not list(parked(Layout(state, run_id)))
        go(bar, story.key)
        wait_for_files(reached)
        reached.unlink()
        why, spoil = SPOILERS[story.key]
        admin = Path((worktree / ".git").read_text().split(":", 1)[1].strip())
        spoil(worktree, admin, repo)
        release.write_text("go")
        if k + 1 < len(THREE):
            wait_for_files(bar / f"in-{THREE[k + 1].key}")  # past the delay point and integrated
            release.unlink()
            assert not worktree.exists(), why
    assert wait_for_exit(proc, DEADLINE_S) == 0, repo.spawned_logs()
    assert set(repo.board_status(s.key) for s in THREE) == {"done"}
    assert repo.worktrees() == [str(repo.root)]
    assert _traced(trace, "read-tree -u --reset") == 3 and _traced(trace, "worktree move") == 0


# ------------------------------------------------------------------------------ the pool itself
def _parked_worktrees(tmp_path, count: int):
    """A repository with `count` story worktrees of run r1, each parked; (git, layout, base)."""
    git = git_repo(tmp_path / "repo", {"a.txt": "a\n", "src/b.txt": "b\n"})
    base = git.rev("HEAD")
    layout = Layout((tmp_path / "repo" / ".bmad-loop").resolve(), "r1")
    for n in range(count):
        path, branch = layout.story_worktree(f"1-{n}-old"), layout.story_branch(f"1-{n}-old")
        ensure_worktree(git, path, branch, base, branch_head=None)
        assert park(git, path, branch, layout, size=count) is not None
        delete_branch(git, branch)
    return git, layout, base


def _admin_of(path: Path) -> str:
    return Path((path / ".git").read_text().split(":", 1)[1].strip()).name


def test_workers_taking_at_once_never_get_the_same_worktree(tmp_path):
    """Four workers released together by a barrier race for two parked worktrees while the
    lane parks a third: every worktree ends up in exactly one place."""
    git, layout, base = _parked_worktrees(tmp_path, 2)
    extra_path, extra_branch = layout.story_worktree("1-8-late"), layout.story_branch("1-8-late")
    ensure_worktree(git, extra_path, extra_branch, base, branch_head=None)
    keys = [f"2-{n}-new" for n in range(4)]
    start = threading.Barrier(len(keys) + 1)
    got: dict[str, bool] = {}
    parked_as: list = []

    def worker(key):
        start.wait()
        got[key] = take(git, layout, layout.story_worktree(key), layout.story_branch(key), base)

    def lane():
        start.wait()
        parked_as.append(park(git, extra_path, extra_branch, layout, size=4))

    threads = [threading.Thread(target=worker, args=(k,)) for k in keys] + [threading.Thread(target=lane)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    assert parked_as[0] is not None
    winners = [k for k in keys if got[k]]
    assert 2 <= len(winners) <= 3
    admins = [_admin_of(layout.story_worktree(k)) for k in winners]
    assert len(set(admins)) == len(admins)  # never the same worktree twice
    for key in winners:
        path = layout.story_worktree(key)
        assert git.current_branch(cwd=path) == layout.story_branch(key)
        assert git.rev("HEAD", cwd=path) == base
    for key in set(keys) - set(winners):  # said no: nothing at its path, no branch made
        assert not layout.story_worktree(key).exists()
        assert git.rev(f"refs/heads/{layout.story_branch(key)}") is None
    # Three worktrees in all: each either taken or still parked.
    left = parked(layout)
    assert len(winners) + len(left) == 3
    assert sorted(admins + [_admin_of(p) for p in left]) == ["1-0-old", "1-1-old", "1-8-late"]
    assert drain_pool(git, layout) == [str(p) for p in left]
    assert len(list_worktrees(git)) == 1 + len(winners)


def _taker(git, layout, base, key: str):
    """A thread that takes a parked worktree for `key` once started; (thread, entering, got)."""
    entering, got = threading.Event(), {}

    def run():
        entering.set()
        got["taken"] = take(git, layout, layout.story_worktree(key), layout.story_branch(key), base)

    return threading.Thread(target=run), entering, got


def test_a_take_waits_for_a_park_announced_before_it(tmp_path, monkeypatch):
    """A worker wakes the lane before it parks (announcing the park): a story dispatched into
    the freed slot meanwhile gets that worktree instead of checking out a new one."""
    monkeypatch.setattr(worktree_pool, "PARK_WAIT_S", DEADLINE_S)  # only the park ends the wait
    git, layout, base = _parked_worktrees(tmp_path, 0)
    done_path, done_branch = layout.story_worktree("1-1-done"), layout.story_branch("1-1-done")
    ensure_worktree(git, done_path, done_branch, base, branch_head=None)
    parking = announce_park()
    thread, entering, got = _taker(git, layout, base, "2-1-next")
    thread.start()
    entering.wait(DEADLINE_S)  # the take is under way with the pool still empty
    assert park(git, done_path, done_branch, layout, size=2) is not None
    parking()
    thread.join(DEADLINE_S)
    assert got == {"taken": True}
    assert _admin_of(layout.story_worktree("2-1-next")) == "1-1-done"  # the parked one


def test_an_announced_park_that_parks_nothing_lets_the_take_go(tmp_path, monkeypatch):
    monkeypatch.setattr(worktree_pool, "PARK_WAIT_S", DEADLINE_S)
    git, layout, base = _parked_worktrees(tmp_path, 0)
    parking = announce_park()
    thread, entering, got = _taker(git, layout, base, "2-1-next")
    thread.start()
    entering.wait(DEADLINE_S)
    parking()  # e.g. the worktree was not clean: removed, not parked
    parking()  # ending it twice counts once
    thread.join(DEADLINE_S)
    assert not thread.is_alive() and got == {"taken": False}  # told at once, not timed out
    assert not layout.story_worktree("2-1-next").exists()
    assert worktree_pool._announced == 0


def test_a_take_that_finds_only_an_unfit_worktree_still_waits_for_an_announced_park(
        tmp_path, monkeypatch):
    """The pool holds a worktree that is no longer fit (locked) and a park is on its way
    (announced): the take removes the unfit one and then waits for the park, instead of saying
    no and leaving its story to check out a whole tree beside it. (The same loop serves a take
    that loses the race for a park that woke several.)"""
    monkeypatch.setattr(worktree_pool, "PARK_WAIT_S", DEADLINE_S)
    git, layout, base = _parked_worktrees(tmp_path, 1)
    (unfit,) = parked(layout)
    git.run("worktree", "lock", unfit)
    done_path, done_branch = layout.story_worktree("1-7-done"), layout.story_branch("1-7-done")
    ensure_worktree(git, done_path, done_branch, base, branch_head=None)
    parking = announce_park()
    thread, entering, got = _taker(git, layout, base, "2-1-next")
    thread.start()
    entering.wait(DEADLINE_S)
    wait_until(lambda: not unfit.exists(), what="the unfit worktree removed by the take")
    assert park(git, done_path, done_branch, layout, size=2) is not None
    parking()
    thread.join(DEADLINE_S)
    assert got == {"taken": True}
    assert _admin_of(layout.story_worktree("2-1-next")) == "1-7-done"


def test_the_drain_waits_for_a_park_under_way_and_removes_it_too(tmp_path, monkeypatch):
    """A run that settles while a worker's announced park is still being made: the drain waits
    for it (held at a seam once it is waiting), so nothing is left parked past the run."""
    monkeypatch.setattr(worktree_pool, "PARK_WAIT_S", DEADLINE_S)
    git, layout, base = _parked_worktrees(tmp_path, 1)
    late_path, late_branch = layout.story_worktree("1-7-late"), layout.story_branch("1-7-late")
    ensure_worktree(git, late_path, late_branch, base, branch_head=None)
    parking = announce_park()
    draining, removed = threading.Event(), []
    waiting = worktree_pool._await_announced

    def seam(wait_s):
        draining.set()
        waiting(wait_s)

    monkeypatch.setattr(worktree_pool, "_await_announced", seam)
    drain = threading.Thread(target=lambda: removed.extend(drain_pool(git, layout)))
    drain.start()
    assert draining.wait(DEADLINE_S)
    assert park(git, late_path, late_branch, layout, size=2) is not None  # after the drain began
    parking()
    drain.join(DEADLINE_S)
    assert not drain.is_alive()
    assert sorted(Path(p).name for p in removed) == ["1", "2"]
    assert not pool_dir(layout).exists() and len(list_worktrees(git)) == 1


def test_a_full_pool_parks_nothing_more(tmp_path):
    git, layout, base = _parked_worktrees(tmp_path, 1)
    path, branch = layout.story_worktree("1-5-more"), layout.story_branch("1-5-more")
    ensure_worktree(git, path, branch, base, branch_head=None)
    assert park(git, path, branch, layout, size=1) is None
    assert path.is_dir() and len(parked(layout)) == 1


def test_a_parked_worktree_that_became_unfit_is_removed_and_the_take_says_no(tmp_path):
    git, layout, base = _parked_worktrees(tmp_path, 1)
    (slot,) = parked(layout)
    git.run("worktree", "lock", slot)
    target = layout.story_worktree("2-1-next")
    assert take(git, layout, target, layout.story_branch("2-1-next"), base) is False
    assert not target.exists() and not slot.exists()
    assert len(list_worktrees(git)) == 1


@pytest.mark.parametrize("state", ["running", "completed"])
def test_cleanup_removes_a_parked_worktree_a_crash_left_unless_its_run_is_live(make_repo, state):
    repo = make_repo(THREE[:1], policy=RUN)
    assert repo.cli("run").exit_code == 0
    run_id = repo.status()["run"]["id"]
    # A crash between park and take: a detached worktree in the run's pool.
    from bmad_loop.git.runner import Git

    git = Git(repo.root)
    layout = Layout((repo.root / ".bmad-loop").resolve(), run_id)
    path, branch = layout.story_worktree("1-9-crashed"), layout.story_branch("1-9-crashed")
    ensure_worktree(git, path, branch, git.rev("HEAD"), branch_head=None)
    slot = park(git, path, branch, layout, size=1)
    delete_branch(git, branch)
    with sqlite3.connect(repo.root / ".bmad-loop" / "state.db") as conn:
        conn.execute("UPDATE runs SET state = ? WHERE id = ?", (state, run_id))

    dry = json.loads(repo.cli("cleanup", "--dry-run", "--json").output)
    assert slot.is_dir() and str(slot) in repo.worktrees()
    report = json.loads(repo.cli("cleanup", "--json").output)
    if state == "running":  # a worker of the live run may take it
        assert str(slot) in dry["kept"] and str(slot) in report["kept"]
        assert str(slot) not in report["worktrees_removed"]
        assert slot.is_dir()
    else:
        assert dry["worktrees_removed"] == [str(slot)]
        assert report["worktrees_removed"] == [str(slot)]
        assert repo.worktrees() == [str(repo.root)]
        assert not pool_dir(layout).exists()


def test_a_take_cut_short_at_the_story_path_is_made_again_by_prepare(make_repo):
    """A crash after the move of a take (or before its checkout) leaves a detached worktree
    at the story's path and no branch: the next prepare removes it and adds a fresh one."""
    from types import SimpleNamespace

    from bmad_loop.engine.workspace import make_workspace
    from bmad_loop.engine.project import Project
    from bmad_loop.policy import load_policy
    from bmad_loop.git.worktrees import move_worktree

    repo = make_repo(THREE[:1], policy=RUN)
    project = Project(root=repo.root, policy=load_policy(repo.root))
    git = project.git()
    layout = Layout(project.state_dir.resolve(), "r1")
    old, old_branch = layout.story_worktree("1-0-old"), layout.story_branch("1-0-old")
    base = git.rev("HEAD")
    ensure_worktree(git, old, old_branch, base, branch_head=None)
    slot = park(git, old, old_branch, layout, size=1)
    delete_branch(git, old_branch)
    story = SimpleNamespace(key="1-1-alpha")
    path, branch = layout.story_worktree(story.key), layout.story_branch(story.key)
    move_worktree(git, slot, path)  # the take stopped here
    workspace = make_workspace(project.policy, git, layout, project.target(git, "main"),
                               root=repo.root)

    prepared = workspace.prepare(story, branch, base)

    assert prepared.worktree == path and _admin_of(path) == story.key  # made by worktree add
    assert git.current_branch(cwd=path) == branch and git.rev("HEAD", cwd=path) == base
    assert parked(layout) == [] and len(list_worktrees(git)) == 2
    project.close()


def test_a_ready_story_waits_without_its_worktree_and_gets_it_back_if_integration_escalates(
        make_repo, bar):
    """Ready means the work is all on the branch: the worktree goes to the pool at once (a story
    dispatched into the freed slot takes it). Should the story's integration escalate, the lane
    makes it a worktree again on its branch, for the human."""
    from support import MERGE_NONE, StoryDef, inside, wait_until

    a, b = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])
    script = barrier_script([a, b], bar)
    # b passes its own verify and fails in its candidate: an escalation at integration.
    verify = '[verify]\ncommands = [\'case "$PWD" in */candidates/*) ! test -f src/b.py;; esac\']\n'
    repo = make_repo([a, b], script=script, policy=MERGE_NONE.format(n=2, strategy="merge") + verify)
    proc = repo.spawn("run")
    wait_until(lambda: {a.key, b.key} <= set(inside(bar)), what="both inside dev")
    go(bar, b.key)  # b finishes first and waits, ready, behind a (still in dev)
    wait_until(lambda: repo.story(b.key)["state"] == "ready", what="b ready")
    ready = repo.story(b.key)
    wait_until(lambda: not Path(ready["worktree"]).exists(), what="b's worktree released")
    assert len(list((Path(ready["worktree"]).parent / ".pool").iterdir())) == 1
    go(bar, a.key)
    assert proc.wait(timeout=120) == 3, repo.spawned_logs()
    b_row = repo.story(b.key)
    assert b_row["state"] == "escalated" and "candidate verification failed" in b_row["reason"]
    back = Path(b_row["worktree"])
    assert (back / "src" / "b.py").read_text() == "NAME = '1-2-b'\n"
    assert git_out(back, "symbolic-ref", "--short", "HEAD") == b_row["branch"]
    assert git_out(back, "rev-parse", "HEAD") == b_row["head_sha"]


def git_out(cwd: Path, *args: str) -> str:
    from support import git

    return git(cwd, *args)
