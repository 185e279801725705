"""bmad-loop's own git never runs code an agent planted in the repository, and notices the plant.

Four vectors, each planted for real (tests/agents/planting_agent.py): hooks in the common hooks
folder, `core.hooksPath` in .git/config, `core.fsmonitor` naming a script, and a filter driver in
.git/config with a .gitattributes that uses it. Their code appends to a marker file whenever it
runs. A plain `git` proves each plant is live; bmad-loop's own git steps (commits, ref updates,
worktrees, status, checkout sync) leave the marker absent for the first three. Filters stay on
by design (Git LFS must keep storing pointers), so for them — and for all four — the defence is
detection: a real run whose agent plants the vector ends with the story escalated before any
more git runs for it, `git.config_changed` naming the file, and the run paused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bmad_loop.git.trees.compose import commit_worktree, dirty_paths
from bmad_loop.git.targets.local import LocalTarget
from bmad_loop.engine.workspace.guard import guard_env
from bmad_loop.git.runner import Git, clean_env
from bmad_loop.git.config_guard import (
    CONFIG_CHANGED_PREFIX,
    ConfigWatch,
    changed_files,
    changes,
    fingerprint,
    project_hooks_dir,
)
from bmad_loop.git.worktrees import ensure_worktree, remove_worktree
from support import TESTS, StoryDef, git_repo, write

# What bmad-loop does about an unboxed agent (boxed: tests/test_sandbox_escape.py).
pytestmark = pytest.mark.usefixtures("unboxed")

PLANTER = TESTS / "agents" / "planting_agent.py"
VECTORS = ["hook", "hooks-path", "fsmonitor", "filter"]
ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])


def plant(repo_dir: Path, vector: str, marker: Path, worktree: Path | None = None) -> None:
    """What the agent does, run the same way (its own process, in the worktree)."""
    env = clean_env({"BMAD_LOOP_WORKTREE": str(worktree or repo_dir),
                     "BMAD_LOOP_STORY_KEY": "x", "BMAD_LOOP_PHASE": "dev"})
    subprocess.run([sys.executable, str(PLANTER), vector, str(marker), "planted.txt"],
                   cwd=worktree or repo_dir, env=env, check=True)


def plain_git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = clean_env({"GIT_AUTHOR_NAME": "p", "GIT_AUTHOR_EMAIL": "p@x", "GIT_COMMITTER_NAME": "p",
                     "GIT_COMMITTER_EMAIL": "p@x"})
    env.pop("GIT_OPTIONAL_LOCKS", None)
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.fixture
def repo(tmp_path) -> Git:
    return git_repo(tmp_path / "repo", {"README": "hello\n", "src/a.txt": "a\n"})


@pytest.mark.parametrize("vector", ["hook", "hooks-path", "fsmonitor"])
def test_planted_hooks_and_fsmonitor_never_run_inside_bmad_loops_own_git(repo, tmp_path, vector):
    marker = tmp_path / "marker"
    plant(repo.repo_dir, vector, marker)
    # Live: a person's git runs it.
    write(repo.repo_dir / "src/a.txt", "person\n")
    assert plain_git(repo.repo_dir, "status", "--porcelain").returncode == 0
    assert plain_git(repo.repo_dir, "commit", "-qam", "person").returncode == 0
    assert marker.exists(), "the plant is not live: the test proves nothing"
    marker.unlink()
    plain_git(repo.repo_dir, "reset", "-q", "--hard", "HEAD~1")
    marker.unlink(missing_ok=True)

    # bmad-loop's own steps: a story worktree, a commit in it, status, a CAS advance of main
    # with the checkout following, and the worktree's removal.
    base = repo.rev("main")
    wt = tmp_path / "wt"
    ensure_worktree(repo, wt, "story", base)
    write(wt / "src/b.txt", "story\n")
    assert dirty_paths(repo, wt) == {"src/b.txt"}
    head, _ = commit_worktree(repo, wt, "story", base)
    assert dirty_paths(repo, repo.repo_dir) == {"planted.txt"}
    target = LocalTarget(repo, "main")
    with target.checkout_held() as checkout:
        assert target.advance(head, base)
        target.sync_checkout(checkout, base, head)
    repo.run("update-index", "--refresh", check=False)
    repo.run("branch", "-q", "other", head)
    repo.run("branch", "-q", "-D", "other")
    remove_worktree(repo, wt)
    assert (repo.repo_dir / "src/b.txt").read_text() == "story\n"
    assert not marker.exists(), marker.read_text()


def test_filters_stay_on_in_bmad_loops_own_git(repo, tmp_path):
    """The project's own filter (say Git LFS) keeps working: bmad-loop stores what it cleans."""
    repo.run("config", "filter.upper.clean", "tr a-z A-Z")
    repo.run("config", "filter.upper.smudge", "cat")
    write(repo.repo_dir / ".gitattributes", "*.up filter=upper\n")
    write(repo.repo_dir / "x.up", "shout\n")
    head, _ = commit_worktree(repo, repo.repo_dir, "x", repo.rev("HEAD"))
    assert repo.out("cat-file", "blob", f"{head}:x.up") == "SHOUT"


@pytest.mark.parametrize("vector", VECTORS)
def test_a_fingerprint_taken_before_the_plant_names_what_changed(repo, tmp_path, vector):
    wt = tmp_path / "wt"
    ensure_worktree(repo, wt, "story", repo.rev("main"))
    before = fingerprint(repo, wt)
    assert changes(before, fingerprint(repo, wt)) == []  # stable
    marker = tmp_path / "marker"
    plant(repo.repo_dir, vector, marker, worktree=wt)
    found = changes(before, fingerprint(repo, wt))
    files = changed_files(found)
    common = repo.common_dir()
    if vector == "hook":
        assert str(common / "hooks" / "post-commit") in files
    else:
        assert str(common / "config") in files, found
        key = {"hooks-path": "core.hookspath", "fsmonitor": "core.fsmonitor",
               "filter": "filter.planted.clean"}[vector]
        assert f"{common / 'config'}: {key}" in found
    assert not marker.exists()  # fingerprinting runs none of it


def test_the_baseline_of_a_session_cut_short_is_kept_for_the_next_one(repo, tmp_path):
    state = tmp_path / "state" / "baseline.json"
    ConfigWatch(repo, repo.repo_dir, state).begin()
    plant(repo.repo_dir, "fsmonitor", tmp_path / "marker")  # then bmad-loop is killed
    again = ConfigWatch(repo, repo.repo_dir, state)
    again.begin()  # the next session of the story starts from the old baseline
    assert changed_files(again.end()) == [str(repo.common_dir() / "config")]
    assert not state.exists()


def test_an_upstream_set_by_push_u_is_not_a_change(repo, tmp_path):
    before = fingerprint(repo)
    repo.run("config", "branch.main.remote", "origin")
    repo.run("config", "branch.main.merge", "refs/heads/main")
    assert changes(before, fingerprint(repo)) == []


# ------------------------------------------------------------------------------ run_hooks
PROJECT_PRE_COMMIT = '#!/bin/sh\necho "project pre-commit v{v}" >> "{marker}"\nexit 0\n'


def test_run_hooks_runs_the_named_hook_pinned_and_nothing_else(repo, tmp_path):
    marker = tmp_path / "marker"
    hook = repo.common_dir() / "hooks" / "pre-commit"
    write(hook, PROJECT_PRE_COMMIT.format(v=1, marker=marker)).chmod(0o755)
    write(repo.common_dir() / "hooks" / "post-commit",
          f'#!/bin/sh\necho "planted post-commit" >> "{marker}"\n').chmod(0o755)
    g = Git(repo.repo_dir, run_hooks=("pre-commit",))
    g.run("commit", "-q", "--allow-empty", "-m", "one", env=g.identity_env())
    assert marker.read_text() == "project pre-commit v1\n"  # the named hook, and only it
    pinned = Path(g.hooks_path())
    assert sorted(p.name for p in pinned.iterdir() if not p.name.startswith(".")) == ["pre-commit"]

    write(hook, PROJECT_PRE_COMMIT.format(v=2, marker=marker)).chmod(0o755)  # an agent's edit
    refused = g.run("commit", "-q", "--allow-empty", "-m", "two", env=g.identity_env(), check=False)
    assert refused.returncode != 0 and "changed since bmad-loop pinned it" in refused.stderr
    assert marker.read_text() == "project pre-commit v1\n"

    g.repin_hooks()  # a human accepted it (run start, resume)
    g.run("commit", "-q", "--allow-empty", "-m", "three", env=g.identity_env())
    assert marker.read_text().splitlines() == ["project pre-commit v1", "project pre-commit v2"]


def test_the_guard_hands_agents_the_projects_configured_hooks_folder(repo, tmp_path):
    husky = tmp_path / "husky"
    repo.run("config", "core.hooksPath", str(husky))
    assert project_hooks_dir(repo) == husky
    env = guard_env(repo, repo.repo_dir, "main", tmp_path / "guard-hooks", tmp_path / "guard.log")
    assert env["BMAD_LOOP_ORIG_HOOKS"] == str(husky)
    repo.run("config", "core.hooksPath", ".husky")  # relative: to the worktree's root
    assert project_hooks_dir(repo) == repo.repo_dir / ".husky"
    repo.run("config", "--unset", "core.hooksPath")
    assert project_hooks_dir(repo) == repo.common_dir() / "hooks"


# ------------------------------------------------------------------------------ real runs
@pytest.mark.parametrize("vector", VECTORS)
def test_an_agent_planting_code_escalates_its_story_pauses_the_run_and_nothing_runs_it(
        make_repo, tmp_path, vector):
    marker = tmp_path / "marker"
    policy = ("[gates]\nmode = \"none\"\n[adapter]\n"
              f"command = {json.dumps([sys.executable, str(PLANTER), vector, str(marker)])}\n"
              "timeout_s = 60\n")
    repo = make_repo([ALPHA], policy=policy)
    main_before = repo.git("rev-parse", "main")

    result = repo.cli("run")

    assert result.exit_code == 3, result.output
    status = repo.status()
    story = status["stories"][0]
    assert story["state"] == "escalated"
    assert story["reason"].startswith(CONFIG_CHANGED_PREFIX)
    assert status["run"]["state"] == "paused"
    assert status["run"]["reason"].startswith(CONFIG_CHANGED_PREFIX)
    events = [e for e in repo.journal() if e["kind"] == "git.config_changed"]
    assert [e["story"] for e in events] == [ALPHA.key]
    common = Path(repo.git("rev-parse", "--path-format=absolute", "--git-common-dir")).resolve()
    files = [str(Path(f).resolve()) for f in events[0]["data"]["files"]]
    expected = common / ("hooks/post-commit" if vector == "hook" else "config")
    assert str(expected) in files, events[0]["data"]
    assert repo.git("rev-parse", "main") == main_before
    # Nothing bmad-loop ran after the session touched the planted code, not even the commit.
    assert not marker.exists(), marker.read_text()
    kinds = [e["kind"] for e in repo.journal()]
    assert "story.ready" not in kinds and kinds.index("git.config_changed") < kinds.index(
        "story.escalated")
