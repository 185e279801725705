"""Remote mode: consumers in clones of their own, a shared bare remote, the target moved by a
compare-and-swap push. Real processes, real git, the embedded SQLite state shared through the
policy folder (`--project`); tests/test_multihost.py does the same on Redis + PostgreSQL."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import StoryDef, git, wait_until

STORIES = [StoryDef(f"1-{i}-s{i}", files=[f"src/s{i}.py"]) for i in range(1, 4)]
SCRIPT = {s.key: {"dev": [{"write": {f"src/s{i}.py": f"NAME = '{s.key}'\n"}}]}
          for i, s in enumerate(STORIES, start=1)}
POLICY = '[scm]\nmax_parallel = {n}\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n'
SETTLED = ("completed", "failed", "paused", "stopped")


def remote_trees(bare: Path, branch: str = "main") -> list[str]:
    shas = git(bare, "rev-list", "--first-parent", "--reverse", branch).splitlines()
    return [git(bare, "rev-parse", f"{sha}^{{tree}}") for sha in shas]


def make_remote_project(make_repo, stories, script, policy, name="repo"):
    """A checkout whose `origin` is a fresh bare repository; the policy names that remote."""
    repo = make_repo(stories, script=script, policy=policy,
                     name=name)
    bare = repo.root.parent / f"{name}-remote.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo.root), str(bare)], check=True)
    repo.git("remote", "add", "origin", str(bare))
    text = (repo.root / ".bmad-loop" / "policy.toml").read_text()
    (repo.root / ".bmad-loop" / "policy.toml").write_text(
        text.replace("[scm]\n", '[scm]\nremote = "origin"\n', 1))
    return repo, bare


@pytest.fixture
def reference_trees(make_repo):
    def build(stories, script, policy):
        ref = make_repo(stories, script=script, policy=policy.format(n=1), name="reference")
        result = ref.cli("run")
        assert result.exit_code == 0, result.output
        return [c["tree"] for c in ref.first_parent_trees()]
    return build


def _logs(repo) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                     for p in sorted(repo.root.parent.glob(f"{repo.root.name}-*.log")))


def test_a_lane_clone_and_a_worker_clone_finish_a_run_on_the_remote(make_repo, reference_trees, tmp_path):
    expected = reference_trees(STORIES, SCRIPT, POLICY)
    repo, bare = make_remote_project(make_repo, STORIES, SCRIPT, POLICY.format(n=2))
    local_main = repo.git("rev-parse", "main")
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip().splitlines()[-1]
    lane = repo.spawn("worker", "--queue", "integration", "--clone", str(tmp_path / "lane-clone"),
                      "--host", "lane-host", log_name="lane")
    worker = repo.spawn("worker", "--queue", "stories", "-w", "2", "--clone",
                        str(tmp_path / "worker-clone"), "--host", "worker-host", log_name="worker")
    settled = wait_until(lambda: repo.status(run_id)["run"]["state"] in SETTLED and repo.status(run_id),
                         timeout=120, what="the run settled")
    for proc in (lane, worker):
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=30) for proc in (lane, worker)] == [0, 0], _logs(repo)
    assert settled["run"]["state"] == "completed", (settled["stories"], _logs(repo))

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
