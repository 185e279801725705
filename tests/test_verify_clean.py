"""A verification repeated after a crash sees what the first try saw, never what the killed one left.

The verify commands here keep a stamp as a build tool keeps its cache: a stamp file in ignored
build output means "verified already", and the first try writes it before it is done. The first
try also rewrites a tracked file and hides the change behind an index flag. Each test holds that
first try at a file barrier, kills the run with SIGKILL, then resumes it: the repeat must fail
exactly as an uninterrupted run fails (also run here), instead of passing on the stamp.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from support import MERGE_NONE, StoryDef, query, wait_for_exit, wait_until

FILES = {"src/__init__.py": "", "build/.gitignore": "*\n!.gitignore\n"}

A = StoryDef("1-1-a", files=["src/a.py"])
B = StoryDef("1-2-b", files=["src/b.py"])
C = StoryDef("1-3-c", files=["src/c.py"])

# In a candidate worktree: pass at once on a stamp; else write it, rewrite b's file (hidden from
# git by assume-unchanged), wait at the barrier, and fail when b's file said "bad".
CANDIDATE_GATE = '''\
import os, subprocess, sys, time
bar = sys.argv[1]
if "/candidates/" not in os.getcwd():
    sys.exit(0)
name = os.path.basename(os.getcwd())
if os.path.exists("build/verified.stamp"):
    sys.exit(0)
open("build/verified.stamp", "w").close()
bad = os.path.exists("src/b.py") and "bad" in open("src/b.py").read()
if bad:
    open("src/b.py", "w").write("fixed by the verify\\n")
    subprocess.run(["git", "update-index", "--assume-unchanged", "src/b.py"], check=True)
open(os.path.join(bar, "verifying-" + name), "w").close()
while not os.path.exists(os.path.join(bar, "go")):
    time.sleep(0.02)
sys.exit(1 if bad else 0)
'''


def _policy(bar: Path, gate_text: str, extra: str = "") -> str:
    gate = bar / "gate.py"
    gate.write_text(gate_text)
    command = json.dumps(f"{sys.executable} {gate} {bar}")
    return (MERGE_NONE.format(n=3, strategy="merge") + "[review]\nenabled = false\n"
            + f"[verify]\ncommands = [{command}]\n" + extra)


def _kill_9_at_the_barrier_then_resume(repo, bar: Path, held) -> None:
    """`run` until `held()` says the verifications are at their barrier; SIGKILL it; open the
    barrier; `resume`, which must pause (exit 3) as the uninterrupted run does."""
    proc = repo.spawn("run")
    try:
        wait_until(held, what="verify commands at their barrier")
        repo.kill_spawned()
        assert proc.returncode == -9
        (bar / "go").write_text("")
        resumed = repo.spawn("resume")
        assert wait_for_exit(resumed, 120) == 3, repo.spawned_logs()
    finally:
        repo.kill_spawned()


def test_a_stacked_candidate_verified_again_after_kill_9_sees_none_of_the_killed_verify(
        make_repo, tmp_path):
    """Fails before the fix: the resumed lane verified b's candidate again in the worktree the
    killed verify left (its stamp there), so b landed where an uninterrupted run escalates."""
    sprint = [A, B, C]
    script = {A.key: {"dev": [{"write": {"src/a.py": "A = 1\n"}}]},
              B.key: {"dev": [{"write": {"src/b.py": "bad\n"}}]},
              C.key: {"dev": [{"write": {"src/c.py": "C = 1\n"}}]}}
    calm = tmp_path / "calm-bar"
    calm.mkdir()
    (calm / "go").write_text("")
    control = make_repo(sprint, script=script, files=FILES, name="calm",
                        policy=_policy(calm, CANDIDATE_GATE))
    assert control.cli("run").exit_code == 3  # b's candidate fails: b escalates, the run pauses
    assert control.story(B.key)["state"] == "escalated"

    bar = tmp_path / "bar"
    bar.mkdir()
    repo = make_repo(sprint, script=script, files=FILES, policy=_policy(bar, CANDIDATE_GATE))
    stacked = {f"{s.key}-1" for s in sprint}
    _kill_9_at_the_barrier_then_resume(
        repo, bar, lambda: {p.name[len("verifying-"):] for p in bar.glob("verifying-*")} >= stacked)
    assert sorted(e["story"] for e in repo.events("candidate.reverifying")) == [
        A.key, B.key, C.key]
    b = repo.story(B.key)
    assert b["state"] == "escalated" and "candidate verification failed" in b["reason"], b
    assert repo.git("ls-tree", "--name-only", "-r", "main", "src") == \
        control.git("ls-tree", "--name-only", "-r", "main", "src") == "src/__init__.py\nsrc/a.py"


# In the story's own worktree: note what it finds; pass at once on a stamp; else write it, leave
# a file, change and hide a tracked file, wait at the barrier, and fail on the agent's "bad".
STORY_GATE = '''\
import json, os, subprocess, sys, time
bar = sys.argv[1]
if "/candidates/" in os.getcwd():
    sys.exit(0)
with open(os.path.join(bar, "seen.jsonl"), "a") as log:
    log.write(json.dumps({"readme": open("README.md").read(), "a": open("src/a.py").read(),
                          "leftover": os.path.exists("leftover.txt"),
                          "stamp": os.path.exists("build/verified.stamp"),
                          "flags": [l for l in subprocess.run(["git", "ls-files", "-v"],
                                    capture_output=True, text=True).stdout.splitlines()
                                    if not l.startswith("H ")]}) + "\\n")
if os.path.exists("build/verified.stamp"):
    sys.exit(0)
open("build/verified.stamp", "w").close()
open("leftover.txt", "w").write("left by the killed verify\\n")
open("README.md", "a").write("formatted by the verify\\n")
subprocess.run(["git", "update-index", "--skip-worktree", "README.md"], check=True)
open(os.path.join(bar, "verifying"), "w").close()
while not os.path.exists(os.path.join(bar, "go")):
    time.sleep(0.02)
sys.exit(1 if "bad" in open("src/a.py").read() else 0)
'''

AGENT_OUTPUT = {A.key: {"dev": [{"write": {"src/a.py": "bad\n"},
                                 "append": {"README.md": "agent\n"}}]}}
ONE_TRY = "[limits]\nmax_dev_attempts = 1\n"


def test_a_story_verify_repeated_after_kill_9_starts_from_the_agents_output_exactly(
        make_repo, tmp_path, escalate_at_once):
    """Fails before the fix: the repeated verify found the killed one's stamp and passed, and
    the story's commit took the verify's leftovers; an uninterrupted run escalates."""
    calm = tmp_path / "calm-bar"
    calm.mkdir()
    (calm / "go").write_text("")
    control = make_repo([A], script=AGENT_OUTPUT, files=FILES, name="calm",
                        policy=_policy(calm, STORY_GATE, ONE_TRY))
    assert control.cli("run").exit_code == 3
    assert "verify failed after 1 dev attempts" in control.story(A.key)["reason"]

    bar = tmp_path / "bar"
    bar.mkdir()
    repo = make_repo([A], script=AGENT_OUTPUT, files=FILES, policy=_policy(bar, STORY_GATE, ONE_TRY))
    _kill_9_at_the_barrier_then_resume(repo, bar, lambda: (bar / "verifying").exists())
    story = repo.story(A.key)
    assert story["state"] == "escalated" and "verify failed after 1 dev attempts" in story["reason"]
    first, again = [json.loads(line) for line in (bar / "seen.jsonl").read_text().splitlines()]
    # The repeat saw exactly what the first try saw: the agent's output and nothing else.
    assert first == again == {"readme": "# test repo\nagent\n", "a": "bad\n", "leftover": False,
                              "stamp": False, "flags": []}
    restored = repo.events("verify.restored")
    assert len(restored) == 1
    # What the killed verify left is kept, not lost: its leftover is in the replaced snapshot.
    ref = restored[0]["data"]["ref"]
    assert repo.git("show", f"{ref}.replaced:leftover.txt") == "left by the killed verify"
    assert repo.git("show", f"{ref}:src/a.py") == "bad"
    # The agent's output is still in the worktree for the human, uncommitted.
    worktree = Path(story["worktree"])
    assert (worktree / "src/a.py").read_text() == "bad\n"
    assert query(repo, "SELECT count(*) FROM stories WHERE state = 'integrated'") == [(0,)]


# ------------------------------------------------------------------------------ the record itself
def _state(path: Path) -> dict:
    """Everything a verify could see of a worktree: HEAD, index flags, status with ignored
    files, and every file's content (symlinks as their target)."""
    from support import git

    files = {}
    for item in sorted(path.rglob("*")):
        rel = item.relative_to(path).as_posix()
        if ".git" in item.relative_to(path).parts or item.is_dir() and not item.is_symlink():
            continue
        files[rel] = f"-> {os.readlink(item)}" if item.is_symlink() else item.read_text()
    return {"head": git(path, "rev-parse", "HEAD"),
            "flags": [line for line in git(path, "ls-files", "-v").splitlines()
                      if not line.startswith("H ")],
            "status": sorted(git(path, "status", "--porcelain", "--ignored",
                                 "--untracked-files=all").splitlines()),
            "files": files}


def test_a_restore_puts_back_exactly_what_was_recorded_whatever_the_verify_did(tmp_path):
    """The agent's output (a changed, a deleted and a new file, a symlink, an edit behind an
    index flag, a file marked intent-to-add) is recorded; a hostile verify then commits, deletes, rewrites behind flags,
    plants ignored and untracked files and a nested repository; the restore gives back exactly
    the recorded worktree (the agent's index marks taken off, as its commit would), and keeps
    what it replaced."""
    from bmad_loop.engine.verification.record import keep, restore
    from support import git, git_repo, write

    g = git_repo(tmp_path / "repo", {"a.txt": "a\n", "b.txt": "b\n", "gone.txt": "g\n",
                                     ".gitignore": "build/\n"})
    wt = tmp_path / "repo"
    write(wt / "a.txt", "agent\n")
    (wt / "gone.txt").unlink()
    write(wt / "new.txt", "new\n")
    os.symlink("a.txt", wt / "link")
    write(wt / "b.txt", "hidden by the agent\n")
    git(wt, "update-index", "--skip-worktree", "b.txt")
    write(wt / "seed.env", "SECRET=1\n")
    write(wt / "intent.txt", "marked intent-to-add\n")
    git(wt, "add", "-N", "intent.txt")  # `stash create` refuses this
    ref, scratch = "refs/bmad-loop/verify/r1/1-1-a", tmp_path / "scratch"
    sha = keep(g, wt, ref, scratch, seeds=["seed.env"])
    assert "seed.env" not in git(wt, "ls-tree", "-r", "--name-only", sha).split()  # never recorded
    recorded = _state(wt)

    # The hostile verify.
    git(wt, "-c", "user.name=v", "-c", "user.email=v@x", "commit", "-qam", "verify commits")
    write(wt / "a.txt", "rewritten by the verify\n")
    git(wt, "update-index", "--assume-unchanged", "a.txt")
    (wt / "new.txt").unlink()
    write(wt / "build/verified.stamp", "")
    write(wt / "stray.txt", "left\n")
    write(wt / "nested/f", "x\n")
    git(wt / "nested", "init", "-q")
    git(wt / "nested", "add", "f")
    git(wt / "nested", "-c", "user.name=v", "-c", "user.email=v@x", "commit", "-qm", "n")

    replaced = restore(g, wt, sha, scratch, aside=f"{ref}.replaced", seeds=["seed.env"])
    after = _state(wt)
    recorded["files"].pop("seed.env")
    recorded["status"].remove("?? seed.env")
    # Index marks are not part of the output: intent-to-add comes back as a plain new file.
    recorded["status"] = sorted(["?? intent.txt" if line == " A intent.txt" else line
                                 for line in recorded["status"]])
    assert after["files"].pop("seed.env", None) is None  # seeds are copied again by the worker
    assert after == {**recorded, "flags": []}
    assert g.rev(f"{ref}.replaced") == replaced
    assert git(wt, "show", f"{replaced}:stray.txt") == "left"


def test_a_record_starts_from_the_worktree_index_and_leaves_it_as_it_was(tmp_path):
    """The record reads the worktree's index for its stat data only: a conflicted merge the agent
    left (unmerged entries) is recorded as the files stand, not refused; the worktree's index
    still holds the conflict afterwards (never written); and an edit that keeps the file's size
    and modification time is recorded all the same (its change time moved)."""
    from bmad_loop.engine.verification.record import keep
    from support import git, git_repo, write

    g = git_repo(tmp_path / "repo", {"a.txt": "base\n", "same.txt": "1234\n"})
    wt = tmp_path / "repo"
    git(wt, "checkout", "-q", "-b", "other")
    write(wt / "a.txt", "other side\n")
    git(wt, "commit", "-qam", "other")
    git(wt, "checkout", "-q", "main")
    write(wt / "a.txt", "main side\n")
    git(wt, "commit", "-qam", "main")
    git(wt, "merge", "other", check=False)  # conflicts: a.txt unmerged in the index
    unmerged = git(wt, "ls-files", "-u")
    assert unmerged.count("a.txt") == 3
    stat = os.stat(wt / "same.txt")
    write(wt / "same.txt", "5678\n")  # same size; the old modification time put back
    os.utime(wt / "same.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns))

    sha = keep(g, wt, "refs/bmad-loop/verify/r1/1-1-a", tmp_path / "scratch")

    assert git(wt, "show", f"{sha}:a.txt") == (wt / "a.txt").read_text().strip()
    assert "<<<<<<<" in git(wt, "show", f"{sha}:a.txt")
    assert git(wt, "show", f"{sha}:same.txt") == "5678"
    assert git(wt, "ls-files", "-u") == unmerged
    assert not (wt / ".git" / "index.lock").exists()
