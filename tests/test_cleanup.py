"""`bmad-loop cleanup`: orphans in bmad-loop's namespaces go, everything else stays.

The rules tested are the ones in engine/run/cleanup.py's docstring: only worktrees under
`.bmad-loop/worktrees/` and `.bmad-loop/candidates/`, branches under `bmad-loop/` and refs under
`refs/bmad-loop/candidates/` are candidates for removal; a live row owns its things; a parked
(escalated) story keeps its worktree, branch and preserved candidate while its run can resume,
and afterwards only with `keep_failed = true`; an integrated story owns nothing. Real
repositories, real runs, worktrees made by hand with git.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from bmad_loop.engine.run.control import stop
from bmad_loop.engine.project import Project
from bmad_loop.queue.tasks import Tasks
from support import StoryDef

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
BETA = StoryDef("1-2-beta", files=["src/beta.py"])
GOOD = {"write": {"src/alpha.py": "good\n"}}
BAD = {"write": {"src/alpha.py": "bad\n"}}


# ------------------------------------------------------------------------------ helpers
def branches(repo) -> list[str]:
    return sorted(repo.git("for-each-ref", "--format=%(refname)", "refs/heads").splitlines())


def all_refs(repo) -> list[str]:
    return sorted(repo.git("for-each-ref", "--format=%(refname) %(objectname)").splitlines())


def cleanup_json(repo, *args: str) -> dict:
    result = repo.cli("cleanup", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def finished_run_rows(repo, run_id: str = "old-run") -> None:
    """A finished run of this project in its state database: its debris is this database's
    to remove (a run with no rows here belongs to another database and is kept)."""
    from sqlalchemy import insert

    from bmad_loop.db.models import Run, utcnow

    project = Project.open(repo.root)
    with project.db.transaction() as s:
        s.execute(insert(Run.__table__).values(
            id=run_id, project=project.key, target_branch="main", target_sha="0" * 40,
            state="completed", merge_strategy="merge", isolation="worktree", selection={},
            policy={}, board_path="", gates_passed=[], created_at=utcnow()))
    project.close()


def make_debris(repo) -> dict:
    """What a crashed earlier run of this database leaves behind, plus the user's own things
    beside it."""
    root = repo.root
    finished_run_rows(repo)
    repo.git("worktree", "add", "-q", ".bmad-loop/worktrees/old-run/x", "-b", "bmad-loop/old-run/x")
    repo.git("worktree", "add", "-q", "--detach", ".bmad-loop/candidates/old-run/x-1")
    repo.git("update-ref", "refs/bmad-loop/candidates/old-run/x/1", "HEAD")
    repo.git("branch", "bmad-loop/old-run/y")  # a branch whose worktree is long gone
    stray = root / ".bmad-loop" / "worktrees" / "old-run" / "half-made"
    stray.mkdir(parents=True)
    (stray / "leftover.txt").write_text("a kill during worktree add\n")
    # The user's own: a worktree elsewhere, branches outside the namespace.
    user_wt = root.parent / "user-worktree"
    repo.git("worktree", "add", "-q", str(user_wt), "-b", "feature/y")
    (user_wt / "wip.txt").write_text("uncommitted work\n")
    repo.git("branch", "feature/x")
    repo.git("branch", "bmad-loop-notes")  # shares the prefix, not the namespace
    return {"user_wt": user_wt, "stray": stray}


def set_run_state(repo, run_id: str, state: str) -> None:
    """No command ends a run that still has a parked story (a lane error does): write the row."""
    with sqlite3.connect(repo.root / ".bmad-loop" / "state.db") as conn:
        conn.execute("UPDATE runs SET state = ? WHERE id = ?", (state, run_id))


# ------------------------------------------------------------------------------ orphans
def test_cleanup_removes_orphans_in_its_namespace_and_never_touches_the_users_things(make_repo):
    repo = make_repo([ALPHA])
    things = make_debris(repo)

    report = cleanup_json(repo)

    state = (repo.root / ".bmad-loop").resolve()
    assert sorted(report["worktrees_removed"]) == sorted([
        str(state / "worktrees" / "old-run" / "x"), str(state / "candidates" / "old-run" / "x-1"),
        str(things["stray"].resolve())])
    assert sorted(report["branches_deleted"]) == ["bmad-loop/old-run/x", "bmad-loop/old-run/y"]
    assert report["refs_deleted"] == ["refs/bmad-loop/candidates/old-run/x/1"]
    assert report["dry_run"] is False and report["pruned_metadata"] is True
    assert repo.bmad_branches() == []
    assert not things["stray"].exists()
    assert not (state / "worktrees" / "old-run" / "x").exists()
    # The user's worktree, its uncommitted file and the user's branches are untouched.
    assert repo.worktrees() == [str(repo.root), str(things["user_wt"])]
    assert (things["user_wt"] / "wip.txt").read_text() == "uncommitted work\n"
    assert branches(repo) == ["refs/heads/bmad-loop-notes", "refs/heads/feature/x",
                              "refs/heads/feature/y", "refs/heads/main"]


def test_cleanup_dry_run_reports_everything_it_would_do_and_changes_nothing(make_repo):
    repo = make_repo([ALPHA])
    things = make_debris(repo)
    refs_before, worktrees_before = all_refs(repo), repo.worktrees()

    result = repo.cli("cleanup", "--dry-run")

    assert result.exit_code == 0, result.output
    assert "would remove worktree" in result.output
    assert "would delete branch bmad-loop/old-run/x" in result.output
    assert "would delete ref refs/bmad-loop/candidates/old-run/x/1" in result.output
    assert "would remove: 3 worktrees, 2 branches, 1 refs" in result.output
    assert all_refs(repo) == refs_before and repo.worktrees() == worktrees_before
    assert things["stray"].is_dir()

    report = cleanup_json(repo, "--dry-run")
    assert report["dry_run"] is True and report["pruned_metadata"] is False
    assert len(report["worktrees_removed"]) == 3 and len(report["branches_deleted"]) == 2
    assert all_refs(repo) == refs_before and repo.worktrees() == worktrees_before


def test_cleanup_json_has_every_report_field_and_an_empty_repository_has_nothing_to_do(make_repo):
    repo = make_repo([ALPHA])
    report = cleanup_json(repo)
    assert report == {"dry_run": False, "worktrees_removed": [], "branches_deleted": [],
                      "refs_deleted": [], "remote_branches_deleted": [], "rows_marked": [], "kept": [],
                      "kept_because": {}, "runs_pruned": [], "foreign": [], "warnings": [],
                      "pruned_metadata": True}


def test_run_start_cleans_up_orphans_of_earlier_crashes(make_repo):
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [GOOD]}})
    things = make_debris(repo)
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert repo.bmad_branches() == []
    assert repo.worktrees() == [str(repo.root), str(things["user_wt"])]
    assert "refs/heads/feature/x" in branches(repo)


def test_purge_without_runs_is_a_usage_error(make_repo):
    repo = make_repo([ALPHA])
    result = repo.cli("cleanup", "--purge")
    assert result.exit_code == 2
    assert "--purge goes with --runs" in result.output


# ------------------------------------------------------------------------------ ownership rules
CANDIDATE_FAILS = ('[verify]\ncommands = ["case \\"$(pwd -P)\\" in */.bmad-loop/candidates/*) '
                   'echo CANDIDATE BROKEN; exit 1;; esac"]\n')


@pytest.mark.parametrize("keep_failed", [True, False])
def test_an_escalated_story_keeps_branch_worktree_and_candidate_while_resumable_then_per_keep_failed(
        make_repo, keep_failed, escalate_at_once):
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [GOOD]}},
                     policy=CANDIDATE_FAILS + f"[scm]\nkeep_failed = {str(keep_failed).lower()}\n")
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    status = repo.status()
    run_id, story = status["run"]["id"], status["stories"][0]
    cand = status["candidates"][0]
    assert story["state"] == "escalated" and cand["state"] == "verify-failed"
    assert cand["ref"] and cand["worktree"]
    kept = {story["worktree"], cand["worktree"]}

    # While the run can resume, everything stays, whatever keep_failed says.
    report = cleanup_json(repo)
    assert report["worktrees_removed"] == [] and report["branches_deleted"] == []
    assert report["refs_deleted"] == []
    assert set(repo.worktrees()) == {str(repo.root)} | kept
    assert f"refs/heads/{story['branch']}" in repo.bmad_branches()
    assert cand["ref"] in repo.bmad_branches()

    # Once the run ended, keep_failed decides.
    set_run_state(repo, run_id, "abandoned")  # a failed run may still resume: it keeps all
    report = cleanup_json(repo)
    if keep_failed:
        assert report["worktrees_removed"] == [] and report["branches_deleted"] == []
        assert set(repo.worktrees()) == {str(repo.root)} | kept
        assert sorted(repo.bmad_branches()) == sorted([f"refs/heads/{story['branch']}", cand["ref"]])
    else:
        assert sorted(report["worktrees_removed"]) == sorted(
            str(Path(p).resolve()) for p in kept)
        assert report["branches_deleted"] == [story["branch"]]
        assert report["refs_deleted"] == [cand["ref"]]
        assert repo.worktrees() == [str(repo.root)]
        assert repo.bmad_branches() == []
    assert repo.git("rev-parse", "main") == status["run"]["start_sha"]


def test_an_integrated_story_owns_nothing_but_its_branch_stays_with_delete_branch_false(make_repo):
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [GOOD]}},
                     policy="[scm]\ndelete_branch = false\n")
    assert repo.cli("run").exit_code == 0
    story = repo.status()["stories"][0]
    assert repo.bmad_branches() == [f"refs/heads/{story['branch']}"]
    assert repo.worktrees() == [str(repo.root)]
    report = cleanup_json(repo)
    assert report["branches_deleted"] == [] and report["kept"] == [story["branch"]]
    assert repo.bmad_branches() == [f"refs/heads/{story['branch']}"]


def test_a_stopped_runs_pending_story_keeps_its_worktree_and_branch(make_repo, tmp_path):
    """A stopped run can resume: its unfinished story owns its worktree and branch."""
    inside, release = tmp_path / "inside", tmp_path / "release"
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [
        dict(GOOD, touch=[str(inside)], wait_for=str(release))]}})

    def stop_then_release():
        try:
            deadline = time.monotonic() + 60
            while not inside.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            project = Project.open(repo.root)
            stop(project, Tasks(project), None)
        finally:
            release.write_text("go")

    helper = threading.Thread(target=stop_then_release, daemon=True)
    helper.start()
    assert repo.cli("run").exit_code == 4
    helper.join(timeout=60)
    story = repo.status()["stories"][0]
    assert story["state"] == "pending" and Path(story["worktree"]).is_dir()
    report = cleanup_json(repo)
    assert report["worktrees_removed"] == [] and report["branches_deleted"] == []
    assert Path(story["worktree"]).is_dir()
    assert f"refs/heads/{story['branch']}" in repo.bmad_branches()


# ------------------------------------------------------------------------------ vanished worktrees
def test_a_story_whose_worktree_was_deleted_by_hand_is_marked_and_resume_recreates_it(make_repo):
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [BAD]}},
                     policy='[limits]\nmax_dev_attempts = 1\n'
                            '[verify]\ncommands = ["grep -q good src/alpha.py"]\n')
    assert repo.cli("run").exit_code == 3
    status = repo.status()
    run_id, story = status["run"]["id"], status["stories"][0]
    worktree = Path(story["worktree"])
    shutil.rmtree(worktree)

    report = cleanup_json(repo)

    assert report["rows_marked"] == [str(worktree)]
    missing = [e for e in repo.journal(run_id) if e["kind"] == "story.worktree_missing"]
    assert [(e["story"], e["data"]["worktree"]) for e in missing] == [(ALPHA.key, str(worktree))]
    assert repo.status(run_id)["stories"][0]["worktree"] is None
    assert str(worktree) not in repo.worktrees()  # stale metadata pruned
    assert f"refs/heads/{story['branch']}" in repo.bmad_branches()  # the branch is kept

    repo.write_script({ALPHA.key: {"dev": [GOOD]}})
    result = repo.cli("resume", run_id)
    assert result.exit_code == 0, result.output
    again = repo.status(run_id)["stories"][0]
    assert again["state"] == "integrated"
    last_dev = [c for c in repo.calls() if c["phase"] == "dev"][-1]
    assert last_dev["cwd"] == str(worktree)  # recreated at its place, from its branch
    assert repo.git("show", "main:src/alpha.py") == "good"


# ------------------------------------------------------------------------------ retention
def test_cleanup_runs_keeps_the_newest_runs_removes_older_files_and_purge_removes_their_rows(make_repo):
    repo = make_repo([ALPHA, BETA], policy='[gates]\nmode = "none"\n[cleanup]\nkeep_runs = 1\n',
                     script={ALPHA.key: {"dev": [GOOD]},
                             BETA.key: {"dev": [{"write": {"src/beta.py": "beta\n"}}]}})
    assert repo.cli("run", "--story", ALPHA.key).exit_code == 0
    older = repo.status()["run"]["id"]
    assert repo.cli("run", "--story", BETA.key).exit_code == 0
    newer = repo.status()["run"]["id"]
    assert older != newer
    logs = repo.root / ".bmad-loop" / "logs"
    assert (logs / older).is_dir() and (logs / newer).is_dir()

    # Work a run kept aside under its own namespace (a restacked story's head) is its to lose.
    head = repo.git("rev-parse", "main")
    kept_old = f"refs/bmad-loop/{older}/restacked/{ALPHA.key}/1"
    kept_new = f"refs/bmad-loop/{newer}/restacked/{BETA.key}/1"
    repo.git("update-ref", kept_old, head)
    repo.git("update-ref", kept_new, head)

    dry = cleanup_json(repo, "--runs", "--dry-run")
    assert dry["runs_pruned"] == [older] and (logs / older).is_dir()
    assert kept_old in dry["refs_deleted"] and repo.git("rev-parse", kept_old) == head

    report = cleanup_json(repo, "--runs")
    assert report["runs_pruned"] == [older]
    assert not (logs / older).exists() and (logs / newer).is_dir()
    assert kept_old in report["refs_deleted"] and kept_new not in report["refs_deleted"]
    assert repo.git("for-each-ref", f"refs/bmad-loop/{older}") == ""
    assert repo.git("rev-parse", kept_new) == head
    # Rows and journal of the pruned run stay.
    assert repo.status(older)["run"]["state"] == "completed"
    assert any(e["kind"] == "run.completed" for e in repo.journal(older))

    report = cleanup_json(repo, "--runs", "--purge")
    assert report["runs_pruned"] == [older]
    result = repo.cli("status", older, "--json")
    assert result.exit_code == 2 and f"no run matches '{older}'" in result.output
    assert repo.status(newer)["run"]["state"] == "completed"
    assert (logs / newer).is_dir()
    with sqlite3.connect(repo.root / ".bmad-loop" / "state.db") as conn:
        for table in ("events", "attempts", "candidates", "stories", "runs"):
            column = "id" if table == "runs" else "run_id"
            count = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {column} = ?", (older,)).fetchone()[0]
            assert count == 0, table


def test_cleanup_on_a_project_without_state_creates_none_and_keeps_unrecorded_refs(tmp_path):
    """No state database yet: no row owns anything, and `cleanup` (dry run or not) does not
    create one to find that out. A branch in bmad-loop's namespace with no run record and no
    rows is nobody's known work (made before run records, or by another database): it is kept
    and listed; `--forget-database unrecorded --force` removes it, still creating nothing."""
    import subprocess

    from support import cli_argv, git, git_repo

    root = tmp_path / "project"
    git_repo(root, {"README.md": "x\n"})
    git(root, "branch", "bmad-loop/20260101-000000-dead/1-1-a")
    dry = subprocess.run(cli_argv("cleanup", "--project", str(root), "--dry-run"),
                         capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert "0 branches" in dry.stdout and "kept 1 of other state databases' runs" in dry.stdout
    assert "run 20260101-000000-dead is not this database's (no record" in dry.stdout
    assert not (root / ".bmad-loop").exists()
    real = subprocess.run(cli_argv("cleanup", "--project", str(root)), capture_output=True, text=True)
    assert real.returncode == 0, real.stderr
    assert git(root, "branch", "--list", "bmad-loop/*") != ""
    forget = subprocess.run(cli_argv("cleanup", "--project", str(root), "--forget-database",
                                     "unrecorded", "--force"), capture_output=True, text=True)
    assert forget.returncode == 0, forget.stderr
    assert git(root, "branch", "--list", "bmad-loop/*") == ""
    assert not (root / ".bmad-loop").exists()


def test_only_a_run_that_started_a_process_is_searched_for_leftovers_of_dead_owners(make_repo):
    """Consumer start skips the process search for a run that never started one: it has no
    attempt and no candidate row. Once its agent ran, the run counts as having started one."""
    from bmad_loop.engine.recovery import ever_spawned

    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [GOOD]}})
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip()
    project = Project.open(repo.root)
    try:
        with project.db.read() as s:
            assert ever_spawned(s, run_id) is False
        assert repo.cli("resume", run_id).exit_code == 0
        with project.db.read() as s:
            assert ever_spawned(s, run_id) is True
    finally:
        project.close()
