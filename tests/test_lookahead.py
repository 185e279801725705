"""Lookahead at max_parallel 1: the next story is prepared while the last one lands.

The lane is held between alpha's verified candidate and its advance by a delay point (a file
barrier). Meanwhile beta is queued on alpha's candidate, claimed, and its worktree and branch
are made there, but nothing of its session starts until alpha has landed; when alpha does not
land (someone else moved the target), beta goes back to pending and nothing of it is left.
Every wait polls the database, git or a file with a deadline.
"""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import update

from bmad_loop.db.models import Story
from bmad_loop.engine.layout import Layout
from bmad_loop.engine.project import Project
from bmad_loop.engine.restack import own_paths, restack_stale
from bmad_loop.engine.runs import stories_of
from bmad_loop.policy import load_policy
from bmad_loop.worktrees import ensure_worktree
from support import (
    ALPHA_BETA,
    MERGE_NONE,
    query,
    stop_processes,
    wait_for_exit,
    wait_until,
    write_each,
)

ALPHA, BETA = ALPHA_BETA
POLICY = MERGE_NONE.format(n=1, strategy="merge")
HOLD = "lane.before_advance"


def _spawn_held(repo, tmp_path):
    delays = tmp_path / "delays"
    delays.mkdir()
    proc = repo.spawn("run", env={"BMAD_LOOP_DELAY_AT": HOLD, "BMAD_LOOP_DELAY_DIR": str(delays)})
    wait_until((delays / f"{HOLD}.reached").exists, what="the lane holding alpha before its advance")
    return proc, delays


def _beta_branch_at(repo, sha: str) -> str | None:
    """beta's branch once its worker made it (the row does not name it yet), at `sha`."""
    refs = repo.git("for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/").splitlines()
    for line in refs:
        name, _, at = line.partition(" ")
        if name.endswith("/" + BETA.key) and at == sha:
            return name
    return None


def _row(repo, key: str) -> dict:
    names = ("state", "phase", "base_sha", "stacked_on", "branch", "worktree", "integrated_sha")
    values = query(repo, f"SELECT {', '.join(names)} FROM stories WHERE key = ?", key)[0]
    row = dict(zip(names, values))
    row["stacked_on"] = json.loads(row["stacked_on"]) if row["stacked_on"] else None
    return row


def _candidate_sha(repo) -> str:
    return query(repo, "SELECT candidate_sha FROM candidates c JOIN stories s ON s.id = c.story_id "
                       "WHERE s.key = ? ORDER BY c.attempt DESC", ALPHA.key)[0][0]


def _at_the_gate(repo) -> tuple[str, str]:
    """Wait until beta is claimed with its branch made on alpha's candidate; (candidate, ref)."""
    candidate = wait_until(lambda: query(repo, "SELECT 1 FROM candidates") and _candidate_sha(repo),
                           what="alpha's candidate")
    ref = wait_until(lambda: _beta_branch_at(repo, candidate), what="beta's branch on the candidate")
    wait_until(lambda: _row(repo, BETA.key)["state"] == "working", what="beta claimed")
    return candidate, ref


def _kinds(repo, key: str) -> list[str]:
    return [e["kind"] for e in repo.journal() if e["story"] == key]


def test_the_next_story_is_prepared_on_the_landing_candidate_and_starts_only_once_it_landed(
        make_repo, tmp_path):
    repo = make_repo(ALPHA_BETA, script=write_each(ALPHA_BETA), policy=POLICY)
    before = repo.git("rev-parse", "main")
    proc, delays = _spawn_held(repo, tmp_path)
    try:
        candidate, ref = _at_the_gate(repo)
        # Alpha has not landed; beta waits with its worktree made, and nothing of it started.
        assert repo.git("rev-parse", "main") == before
        assert _row(repo, ALPHA.key)["state"] == "integrating"
        beta = _row(repo, BETA.key)
        assert beta["phase"] == "prepare" and beta["base_sha"] == candidate
        assert beta["stacked_on"] == [{"key": ALPHA.key, "head": _head(repo, ALPHA.key)}]
        assert "story.prepared" not in _kinds(repo, BETA.key)
        assert not query(repo, "SELECT 1 FROM attempts a JOIN stories s ON s.id = a.story_id "
                               "WHERE s.key = ?", BETA.key)
        assert {c["key"] for c in repo.calls()} == {ALPHA.key}
        queued = [e for e in repo.journal() if e["kind"] == "story.queued" and e["story"] == BETA.key]
        assert queued[0]["data"]["waits_for"] == [ALPHA.key]
        assert queued[0]["data"]["base_sha"] == candidate
        (delays / f"{HOLD}.go").write_text("go")
        assert wait_for_exit(proc) == 0, repo.spawned_logs()
    finally:
        stop_processes(proc)

    alpha, beta = _row(repo, ALPHA.key), _row(repo, BETA.key)
    assert alpha["integrated_sha"] == candidate == beta["base_sha"]
    assert beta["stacked_on"] is None  # on the target once it landed, as the sequential loop
    assert beta["branch"] == ref.removeprefix("refs/heads/")
    beta_dev = [c for c in repo.calls() if c["key"] == BETA.key and c["phase"] == "dev"]
    assert [c["env"]["BMAD_LOOP_BASE_SHA"] for c in beta_dev] == [candidate]
    journal = [(e["kind"], e["story"]) for e in repo.journal()]
    assert journal.index(("story.integrated", ALPHA.key)) < journal.index(("story.prepared", BETA.key)) \
        < journal.index(("attempt.started", BETA.key))
    assert repo.git("show", "main:src/beta.py") == f"NAME = '{BETA.key}'"


def test_a_landing_that_does_not_come_sends_the_waiting_story_back_with_nothing_left(
        make_repo, tmp_path):
    repo = make_repo(ALPHA_BETA, script=write_each(ALPHA_BETA), policy=POLICY)
    proc, delays = _spawn_held(repo, tmp_path)
    try:
        candidate, ref = _at_the_gate(repo)
        worktree = Path(wait_until(lambda: _worktree_of(repo, ref), what="beta's worktree"))
        # Someone else commits on the target (a real second git process): alpha's CAS fails.
        repo.git("commit", "-q", "--allow-empty", "-m", "a commit from beside the run")
        (delays / f"{HOLD}.go").write_text("go")
        assert wait_for_exit(proc) == 3, repo.spawned_logs()
    finally:
        stop_processes(proc)

    run = repo.status()["run"]
    assert run["state"] == "paused" and "target moved by someone else" in run["reason"]
    beta = _row(repo, BETA.key)
    assert (beta["state"], beta["phase"], beta["base_sha"], beta["stacked_on"]) == (
        "pending", None, None, None)
    unqueued = [e for e in repo.journal() if e["kind"] == "story.unqueued" and e["story"] == BETA.key]
    assert len(unqueued) == 1 and unqueued[0]["data"]["was"] == "working"
    # Nothing of beta started, and nothing made on the candidate that did not land is left.
    assert {c["key"] for c in repo.calls()} == {ALPHA.key}
    assert repo.git("rev-parse", "--verify", "--quiet", ref, check=False) == ""
    assert not worktree.exists() and str(worktree) not in repo.worktrees()

    result = repo.cli("resume", repo.status()["run"]["id"])
    assert result.exit_code == 0, result.output
    alpha, beta = _row(repo, ALPHA.key), _row(repo, BETA.key)
    assert (alpha["state"], beta["state"]) == ("integrated", "integrated")
    assert beta["base_sha"] == alpha["integrated_sha"] != candidate


def test_a_landing_recomposed_on_a_moved_target_is_not_the_base_the_waiting_story_was_made_on(
        make_repo, tmp_path):
    """With `on_foreign_move = "accept"` the lane composes alpha again on the moved target and
    lands that: beta, made on the first candidate, must not go on from it."""
    repo = make_repo(ALPHA_BETA, script=write_each(ALPHA_BETA),
                     policy=POLICY.replace("[scm]\n", '[scm]\non_foreign_move = "accept"\n'))
    proc, delays = _spawn_held(repo, tmp_path)
    try:
        first, ref = _at_the_gate(repo)
        repo.git("commit", "-q", "--allow-empty", "-m", "a commit from beside the run")
        (delays / f"{HOLD}.go").write_text("go")
        assert wait_for_exit(proc) == 0, repo.spawned_logs()
    finally:
        stop_processes(proc)

    alpha, beta = _row(repo, ALPHA.key), _row(repo, BETA.key)
    assert alpha["integrated_sha"] != first
    assert beta["base_sha"] == alpha["integrated_sha"]
    assert repo.git("log", "-1", "--format=%s", f"{beta['base_sha']}^") == "a commit from beside the run"
    restacked = [e for e in repo.journal() if e["kind"] == "story.restacked"]
    assert [e["story"] for e in restacked] == [BETA.key]
    assert f"not as the candidate {first[:12]}" in restacked[0]["data"]["reason"]
    beta_dev = [c for c in repo.calls() if c["key"] == BETA.key and c["phase"] == "dev"]
    assert [c["env"]["BMAD_LOOP_BASE_SHA"] for c in beta_dev] == [alpha["integrated_sha"]]


def test_a_restack_removes_the_worktree_and_branch_a_dead_worker_made_before_its_row_named_them(
        make_repo):
    """A worker that died between making a stacked story's worktree and writing its row left
    both behind; when the story under it then fails, the restack must remove them by name, or
    the story's next prepare would go on from a branch made on work that never landed."""
    repo = make_repo(ALPHA_BETA, script=write_each(ALPHA_BETA), policy=POLICY)
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = query(repo, "SELECT id FROM runs")[0][0]
    project = Project(root=repo.root, policy=load_policy(repo.root))
    try:
        git = project.git(project.policy)
        layout = Layout(project.state_dir, run_id)
        unlanded = repo.git("commit-tree", "-p", "main", "-m", "a candidate that will not land",
                            "main^{tree}")
        worktree, branch = layout.story_worktree(BETA.key), layout.story_branch(BETA.key)
        ensure_worktree(git, worktree, branch, unlanded)  # what the dead worker made
        with project.db.transaction() as s:  # the rows as the crash and the failure left them
            s.execute(update(Story).where(Story.run_id == run_id, Story.key == ALPHA.key)
                      .values(state="escalated", reason="for the test", head_sha=unlanded))
            s.execute(update(Story).where(Story.run_id == run_id, Story.key == BETA.key)
                      .values(state="queued", phase="prepare", base_sha=unlanded,
                              stacked_on=[{"key": ALPHA.key, "head": unlanded}]))
        with project.db.read() as s:
            stories = stories_of(s, run_id)
        assert restack_stale(project.db, git, run_id, stories, own_paths(layout, project.policy.scm))
    finally:
        project.close()
    assert not worktree.exists() and str(worktree) not in repo.worktrees()
    assert repo.git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False) == ""
    beta = _row(repo, BETA.key)
    assert (beta["state"], beta["base_sha"], beta["stacked_on"]) == ("pending", None, None)
    restacked = [e for e in repo.journal(run_id) if e["kind"] == "story.restacked"]
    assert [e["data"]["kept"] for e in restacked] == [None]  # no work of its own to keep


def _head(repo, key: str) -> str:
    return query(repo, "SELECT head_sha FROM stories WHERE key = ?", key)[0][0]


def _worktree_of(repo, ref: str) -> str | None:
    listing = repo.git("worktree", "list", "--porcelain").split("\n\n")
    for entry in listing:
        lines = dict(line.partition(" ")[::2] for line in entry.splitlines())
        if lines.get("branch") == ref:
            return lines["worktree"]
    return None
