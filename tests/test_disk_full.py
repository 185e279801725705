"""ENOSPC for real: the repository on a small tmpfs that fills up mid-run. The run pauses naming
what could not be written; once space is freed, `resume` completes with the same history as an
uninterrupted run. (The state database sits on another disk here: a database that cannot be
written cannot record a pause — see docs/reliability.md.)"""

from __future__ import annotations

import os
import subprocess

import pytest

from support import MERGE_NONE, StoryDef, barrier_script, build_repo, go, inside, wait_until
from support import fill_disk as fill

STORIES = [StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])]
POLICY = MERGE_NONE.format(n=1, strategy="merge") + "[review]\nenabled = false\n"


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MB tmpfs, mounted for this test (root only: CI runs as root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs in CI: {proc.stderr}")
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)




def test_a_full_disk_pauses_the_run_naming_the_path_and_resume_completes_the_same_history(
        small_disk, tmp_path, bar):
    db = tmp_path / "state" / "state.db"
    db.parent.mkdir()
    policy = POLICY + f'[database]\nurl = "sqlite:///{db}"\n[queue]\nurl = "{db.parent / "queue.db"}"\n'
    repo = build_repo(small_disk, STORIES, script=barrier_script(STORIES, bar), policy=policy)
    try:
        proc = repo.spawn("run")
        wait_until(lambda: STORIES[0].key in inside(bar), what="a inside")
        go(bar, STORIES[0].key)
        wait_until(lambda: STORIES[1].key in inside(bar), what="b inside, its file written")
        filler = fill(small_disk)
        go(bar, STORIES[1].key)  # b's worker now has to write: prompt, commit, ...

        assert proc.wait(timeout=120) == 3, repo.spawned_logs() + str(repo.status()["run"]) + str([(e["kind"], e["data"]) for e in repo.journal()][-8:])
        run = repo.status()["run"]
        assert run["state"] == "paused"
        assert "disk fault" in run["reason"] and "No space left on device" in run["reason"]
        paused = [e for e in repo.journal() if e["kind"] == "run.paused"]
        assert paused[-1]["data"]["fault"]["kind"] == "disk"
        assert repo.story(STORIES[1].key)["state"] == "pending"  # not charged, not escalated

        filler.unlink()
        result = repo.cli("resume")
        assert result.exit_code == 0, result.output
        assert [s["state"] for s in repo.status()["stories"]] == ["integrated", "integrated"]
        assert [s["attempt"] for s in repo.status()["stories"]] == [1, 1]
    finally:
        repo.kill_spawned()

    # Same history as an uninterrupted run of the same sprint on a roomy disk.
    reference = build_repo(tmp_path, STORIES, script=barrier_script(STORIES, bar), policy=POLICY,
                           name="reference")
    for story in STORIES:
        go(bar, story.key)
    assert reference.cli("run").exit_code == 0
    trees = lambda r: r.git("log", "--first-parent", "--format=%T", "main").split()  # noqa: E731
    assert trees(repo) == trees(reference)
