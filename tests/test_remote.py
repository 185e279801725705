"""Remote mode: consumers in clones of their own, a shared bare remote, the target moved by a
compare-and-swap push. Real processes, real git, the embedded SQLite state shared through the
policy folder (`--project`); tests/test_multihost.py does the same on Redis + PostgreSQL."""

from __future__ import annotations

import collections
import json
import signal

import pytest

from support import StoryDef, git, make_remote_project, remote_trees, settled_status, write_each

STORIES = [StoryDef(f"1-{i}-s{i}", files=[f"src/s{i}.py"]) for i in range(1, 4)]
SCRIPT = write_each(STORIES)
POLICY = '[scm]\nmax_parallel = {n}\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n'


@pytest.fixture
def reference_trees(make_repo):
    def build(stories, script, policy):
        ref = make_repo(stories, script=script, policy=policy.format(n=1), name="reference")
        result = ref.cli("run")
        assert result.exit_code == 0, result.output
        return [c["tree"] for c in ref.first_parent_trees()]
    return build


def run_on_two_clones(repo, tmp_path):
    """Enqueue, then a lane clone and a worker clone (separate processes) until the run
    settles; both stop cleanly on SIGTERM and the run completed. Returns (run id, status)."""
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip().splitlines()[-1]
    lane = repo.spawn("worker", "--queue", "integration", "--clone", str(tmp_path / "lane-clone"),
                      "--host", "lane-host", log_name="lane")
    worker = repo.spawn("worker", "--queue", "stories", "-w", "2", "--clone",
                        str(tmp_path / "worker-clone"), "--host", "worker-host", log_name="worker")
    settled = settled_status(repo, run_id, timeout=120)
    for proc in (lane, worker):
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=30) for proc in (lane, worker)] == [0, 0], repo.spawned_logs()
    assert settled["run"]["state"] == "completed", (settled["stories"], repo.spawned_logs())
    return run_id, settled


def test_a_lane_clone_and_a_worker_clone_finish_a_run_on_the_remote(make_repo, reference_trees, tmp_path):
    expected = reference_trees(STORIES, SCRIPT, POLICY)
    repo, bare = make_remote_project(make_repo, STORIES, SCRIPT, POLICY.format(n=2))
    local_main = repo.git("rev-parse", "main")
    run_id, settled = run_on_two_clones(repo, tmp_path)

    # The remote's target has the sequential history; the human's checkout was not touched.
    assert remote_trees(bare) == expected
    assert repo.git("rev-parse", "main") == local_main
    stories = settled["stories"]
    assert {s["host"] for s in stories} == {"worker-host"}
    assert all(s["worktree"].startswith(str(tmp_path / "worker-clone")) for s in stories)
    kinds = [e["kind"] for e in repo.journal(run_id)]
    assert kinds.count("story.pushed") == 3 and kinds.count("target.advanced") == 3
    # Story branches were deleted on the remote once they landed (delete_branch = true).
    assert git(bare, "for-each-ref", "refs/heads/bmad-loop") == ""
    dev_calls = collections.Counter(c["key"] for c in repo.calls() if c["phase"] == "dev")
    assert dev_calls == {s.key: 1 for s in STORIES}


# A [verify] command that, the first time it runs in a candidate worktree (the lane's, between
# composition and the push), commits a file no story touches onto the bare remote's main, as a
# human pushing by hand would. The marker file keeps the outside commit's sha.
OUTSIDER = '''\
import pathlib, subprocess, sys
bare, marker, work = sys.argv[1:4]
if "/.bmad-loop/candidates/" not in str(pathlib.Path.cwd()) or pathlib.Path(marker).exists():
    sys.exit(0)
pathlib.Path(marker).write_text("")  # first: never twice, even if what follows fails
def git(*args, cwd=work):
    return subprocess.run(["git", "-c", "user.name=outsider", "-c", "user.email=out@localhost",
                           *args], cwd=cwd, check=True, capture_output=True, text=True).stdout
git("clone", "-q", bare, work, cwd=None)
pathlib.Path(work, "OUTSIDE.md").write_text("pushed by hand\\n")
git("add", "OUTSIDE.md")
git("commit", "-q", "-m", "outside commit")
git("push", "-q", "origin", "HEAD:refs/heads/main")
pathlib.Path(marker).write_text(git("rev-parse", "HEAD").strip())
'''


def test_a_target_moved_on_the_remote_between_composition_and_the_push_is_recomposed_never_forced(
        make_repo, tmp_path):
    import shlex
    import sys

    stories = STORIES[:2]
    script = {s.key: SCRIPT[s.key] for s in stories}
    outsider, marker = tmp_path / "outsider.py", tmp_path / "outsider.sha"
    outsider.write_text(OUTSIDER)
    bare_path = tmp_path / "repo-remote.git"  # where make_remote_project puts the bare remote
    verify = " ".join(shlex.quote(str(a)) for a in
                      (sys.executable, outsider, bare_path, marker, tmp_path / "outsider-clone"))
    policy = POLICY.format(n=2).replace("[scm]\n", "[scm]\non_foreign_move = \"accept\"\n") + f"[verify]\ncommands = [{json.dumps(verify)}]\n"
    repo, bare = make_remote_project(make_repo, stories, script, policy)
    assert bare == bare_path
    local_main = repo.git("rev-parse", "main")
    run_id, settled = run_on_two_clones(repo, tmp_path)

    # The outside commit was pushed once, and nothing forced it away.
    outside = marker.read_text().strip()
    assert len(outside) == 40, "the verify command never ran in a candidate worktree"
    git(bare, "merge-base", "--is-ancestor", outside, "main")
    # The lane saw its push refused, journalled the candidate stale and recomposed on the moved target.
    journal = repo.journal(run_id)
    stale = [e for e in journal if e["kind"] == "candidate.stale"]
    assert len(stale) == 1, stale
    data = stale[0]["data"]
    assert data["composed_on"] != data["target_now"] and data["target_now"] == outside
    advanced = [e["data"] for e in journal if e["kind"] == "target.advanced"]
    assert len(advanced) == 2 and outside in (a["old"] for a in advanced)
    files = git(bare, "ls-tree", "-r", "--name-only", "main").splitlines()
    assert {"OUTSIDE.md", "src/s1.py", "src/s2.py"} <= set(files)
    assert repo.git("rev-parse", "main") == local_main
    dev_calls = collections.Counter(c["key"] for c in repo.calls() if c["phase"] == "dev")
    assert dev_calls == {s.key: 1 for s in stories}  # a recomposition does not re-run the agent


def test_a_teammates_push_to_the_remote_target_pauses_the_run_by_default_and_nothing_is_forced(
        make_repo, tmp_path):
    """The same outside push as above, under the default `on_foreign_move = "pause"`: the lane's
    leased push is refused, the move is journaled with the commit, and the run pauses."""
    import shlex
    import sys

    stories = STORIES[:2]
    script = {s.key: SCRIPT[s.key] for s in stories}
    outsider, marker = tmp_path / "outsider.py", tmp_path / "outsider.sha"
    outsider.write_text(OUTSIDER)
    bare_path = tmp_path / "repo-remote.git"
    verify = " ".join(shlex.quote(str(a)) for a in
                      (sys.executable, outsider, bare_path, marker, tmp_path / "outsider-clone"))
    policy = POLICY.format(n=2) + f"[verify]\ncommands = [{json.dumps(verify)}]\n"
    repo, bare = make_remote_project(make_repo, stories, script, policy)
    run_id = repo.cli("enqueue").output.strip().splitlines()[-1]
    lane = repo.spawn("worker", "--queue", "integration", "--clone", str(tmp_path / "lane-clone"),
                      "--host", "lane-host", log_name="lane")
    worker = repo.spawn("worker", "--queue", "stories", "-w", "2", "--clone",
                        str(tmp_path / "worker-clone"), "--host", "worker-host", log_name="worker")
    try:
        settled = settled_status(repo, run_id, timeout=120)
    finally:
        for proc in (lane, worker):
            proc.send_signal(signal.SIGTERM)
        for proc in (lane, worker):
            proc.wait(timeout=30)
    outside = marker.read_text().strip()
    assert settled["run"]["state"] == "paused", (settled["run"], repo.spawned_logs())
    assert outside[:12] in settled["run"]["reason"]
    moved = [e["data"] for e in repo.journal(run_id) if e["kind"] == "target.moved"]
    assert moved and moved[0]["new"] == outside and moved[0]["commits"] == [outside]
    assert git(bare, "rev-parse", "main") == outside  # nothing of the story was pushed over it
