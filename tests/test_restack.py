"""Restacking a story its worker left behind: a crash, then the story under it fails.

A stacked story's worker that dies is recovered to `queued` (recovery.py). If the story it was
stacked on then fails to integrate, the lane restacks it; its next prepare must not find a
branch made on work that never landed, or it would go on from there. Two ways a dead worker
leaves one: before its row names the worktree and branch (killed inside prepare), and after
(killed in its session, with commits of its own). The rows are set as the crash and the
failure leave them; the repository, its worktrees and the lane's restack are real.
"""

from __future__ import annotations

import json

from sqlalchemy import update

from bmad_loop.db.models import Story
from bmad_loop.engine.runpaths import Layout
from bmad_loop.engine.project import Project
from bmad_loop.engine.lane.stacking import own_paths, restack_stale
from bmad_loop.engine.runrows import stories_of
from bmad_loop.policy import load_policy
from bmad_loop.git.worktrees import ensure_worktree
from support import ALPHA_BETA, MERGE_NONE, query, write_each

ALPHA, BETA = ALPHA_BETA
POLICY = MERGE_NONE.format(n=2, strategy="merge")


def _restack_after_a_crash(repo, *, row_names_them: bool, own_commit: bool):
    """beta stacked on alpha, its worktree and branch made on that base by a worker that died;
    alpha escalated. Returns (run id, worktree, branch, beta's own head or None) after the
    restack."""
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = query(repo, "SELECT id FROM runs")[0][0]
    project = Project(root=repo.root, policy=load_policy(repo.root))
    try:
        git = project.git(project.policy)
        layout = Layout(project.state_dir, run_id)
        stacked = repo.git("commit-tree", "-p", "main", "-m", "alpha's work, never landed",
                           "main^{tree}")
        worktree, branch = layout.story_worktree(BETA.key), layout.story_branch(BETA.key)
        ensure_worktree(git, worktree, branch, stacked)  # what the dead worker made
        head = None
        if own_commit:  # its session had committed work of its own
            (worktree / "src").mkdir(exist_ok=True)
            (worktree / "src" / "beta.py").write_text("B = 2\n")
            repo.git("-C", str(worktree), "add", "-A")
            repo.git("-C", str(worktree), "commit", "-q", "-m", "beta's own work")
            head = repo.git("-C", str(worktree), "rev-parse", "HEAD")
        named = {"worktree": str(worktree), "branch": branch, "phase": "dev"} if row_names_them \
            else {"phase": "prepare"}
        with project.db.transaction() as s:  # the rows as the crash and the failure left them
            s.execute(update(Story).where(Story.run_id == run_id, Story.key == ALPHA.key)
                      .values(state="escalated", reason="for the test", head_sha=stacked))
            s.execute(update(Story).where(Story.run_id == run_id, Story.key == BETA.key)
                      .values(state="queued", base_sha=stacked, **named,
                              stacked_on=[{"key": ALPHA.key, "head": stacked}]))
        with project.db.read() as s:
            stories = stories_of(s, run_id)
        assert restack_stale(project.db, git, run_id, stories, own_paths(layout, project.policy.scm))
    finally:
        project.close()
    return run_id, worktree, branch, head


def _beta_fresh(repo, run_id) -> dict:
    row = query(repo, "SELECT state, phase, base_sha, branch, worktree, stacked_on FROM stories "
                      "WHERE key = ?", BETA.key)[0]
    assert row[:5] == ("pending", None, None, None, None) and json.loads(row[5] or "null") is None
    restacked = [e for e in repo.journal(run_id) if e["kind"] == "story.restacked"]
    assert [e["story"] for e in restacked] == [BETA.key]
    return restacked[0]["data"]


def test_a_restack_removes_what_a_worker_killed_inside_prepare_made_before_its_row_named_it(
        make_repo):
    repo = make_repo(ALPHA_BETA, script=write_each(ALPHA_BETA), policy=POLICY)
    run_id, worktree, branch, _ = _restack_after_a_crash(repo, row_names_them=False, own_commit=False)
    assert not worktree.exists() and str(worktree) not in repo.worktrees()
    assert repo.git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False) == ""
    assert _beta_fresh(repo, run_id)["kept"] is None  # no work of its own to keep


def test_a_restack_of_a_recovered_story_keeps_its_own_work_and_removes_its_branch(make_repo):
    repo = make_repo(ALPHA_BETA, script=write_each(ALPHA_BETA), policy=POLICY)
    run_id, worktree, branch, head = _restack_after_a_crash(repo, row_names_them=True,
                                                            own_commit=True)
    assert not worktree.exists() and str(worktree) not in repo.worktrees()
    assert repo.git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False) == ""
    kept = _beta_fresh(repo, run_id)["kept"]
    assert kept and repo.git("rev-parse", kept) == head  # nothing is dropped
    assert repo.git("show", f"{kept}:src/beta.py") == "B = 2"
