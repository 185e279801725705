"""git's lock files met by bmad-loop's own git, reproduced for real.

Stale locks: a child process runs a real mutating step through `Git.run`, with a real hook
(pinned through `run_hooks`) that stops inside git while git holds the lock — a pre-commit hook
of `commit -a` holds `index.lock`, a reference-transaction hook in the "prepared" state holds
the ref locks (`HEAD.lock`, `refs/heads/<b>.lock`, `packed-refs.lock` for a packed ref's
deletion). The hook touches a file; the test then SIGKILLs the child's whole process group
(bmad-loop, git and the hook), which leaves the lock and the step's write-ahead record behind,
exactly as a killed consumer does. The same step run again removes the lock (`on_stale_lock`)
and succeeds.

Foreign locks: a plain `git` (not bmad-loop's) holds the lock, stopped in the repository's own
hook; bmad-loop's step waits for it, and is told when it is released, or gives up after
`lock_wait_s` with a `TransientError` naming the file, which it never removes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from bmad_loop.git import locks as gitlocks
from bmad_loop.git.trees.compose import cas_advance, compose
from bmad_loop.errors import GitError, TransientError
from bmad_loop.git.runner import Git, clean_env
from bmad_loop.transient import transient_fault
from support import git_repo, wait_for_files, wait_until, write

SLEEPING_HOOK = """#!/bin/sh
cat >/dev/null
if [ "$1" = "prepared" ] || [ "{hook}" = "pre-commit" ]; then
  touch "{marker}"
  sleep 120
fi
exit 0
"""


@pytest.fixture
def repo(tmp_path) -> Git:
    g = git_repo(tmp_path / "repo", {"README": "hello\n", "a.txt": "a\n"})
    g.run("commit", "--allow-empty", "-q", "-m", "second", env=g.identity_env())
    g.run("branch", "packed", "HEAD~1")
    g.run("pack-refs", "--all")
    return g


def plain_git(cwd: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    """git as a person runs it: the repository's hooks and all."""
    env = clean_env({"GIT_AUTHOR_NAME": "p", "GIT_AUTHOR_EMAIL": "p@x", "GIT_COMMITTER_NAME": "p",
                     "GIT_COMMITTER_EMAIL": "p@x"})
    env.pop("GIT_OPTIONAL_LOCKS", None)
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, **kw)


def install_hook(repo: Git, name: str, marker: Path) -> None:
    hook = repo.common_dir() / "hooks" / name
    write(hook, SLEEPING_HOOK.format(hook=name, marker=marker))
    hook.chmod(0o755)


def remove_hook(repo: Git, name: str) -> None:
    (repo.common_dir() / "hooks" / name).unlink()


# Each stale lock kind: the hook that stops git while it holds the lock, the step, the lock.
KINDS = {
    "index.lock": ("pre-commit", lambda g: ["commit", "-a", "-q", "-m", "edit"], "index.lock"),
    "HEAD.lock": ("reference-transaction",
                  lambda g: ["update-ref", "--no-deref", "HEAD", g.rev("HEAD~1")], "HEAD.lock"),
    "refs/heads/<target>.lock": ("reference-transaction",
                                 lambda g: ["update-ref", "refs/heads/main", g.rev("HEAD~1"),
                                            g.rev("HEAD")], "refs/heads/main.lock"),
    "packed-refs.lock": ("reference-transaction", lambda g: ["update-ref", "-d", "refs/heads/packed"],
                         "packed-refs.lock"),
}

CHILD = textwrap.dedent("""
    import json, sys
    from bmad_loop.git.runner import Git
    repo, hook, argv = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    g = Git(repo, run_hooks=(hook,))
    g.run(*argv, env=g.identity_env())
""")


def gone_or_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_a_step_holding_its_lock(repo: Git, tmp_path: Path, hook: str, argv: list[str],
                                 lock: Path) -> None:
    """Run `argv` through Git.run in a child, stopped by `hook` while git holds `lock`; then
    SIGKILL the child's process group (the child, its git and the hook)."""
    marker = tmp_path / "holding"
    install_hook(repo, hook, marker)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(repo.repo_dir), hook, json.dumps(argv)],
                             start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_files(marker, timeout=30)
        assert lock.exists()  # git holds it now
        steps = repo.common_dir() / gitlocks.STEPS_DIRNAME
        records = [json.loads(p.read_text()) for p in steps.iterdir() if not p.name.startswith(".")]
        assert len(records) == 1  # written before the step started, naming what it may lock
        record = records[0]
        assert record["pid"] == child.pid and record["argv"] == argv and record["child"]
        assert str(lock) in record["locks"] or any(str(lock).startswith(p) for p in record["prefixes"])
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    # SIGKILL is delivered asynchronously: wait until the step's git is really gone.
    wait_until(lambda: gone_or_zombie(record["child"]), what="the killed git to die")
    remove_hook(repo, hook)  # the person's hook is not what is tested from here on


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_stale_lock_left_by_a_sigkilled_step_is_removed_and_the_step_succeeds(repo, tmp_path, kind):
    hook, make_argv, lock_rel = KINDS[kind]
    write(repo.repo_dir / "a.txt", "edited\n")
    argv = make_argv(repo)
    prev = repo.rev("HEAD~1")
    lock = repo.common_dir() / lock_rel
    kill_a_step_holding_its_lock(repo, tmp_path, hook, argv, lock)
    assert lock.exists()  # left behind: every git that needs it now fails
    assert plain_git(repo.repo_dir, *argv).returncode != 0

    stale, waited = [], []
    again = Git(repo.repo_dir, lock_wait_s=5, on_stale_lock=lambda p, c: stale.append(p),
                on_lock_wait=lambda p, c: waited.append(p))
    again.run(*argv, env=again.identity_env())

    assert str(lock) in stale and waited == []  # removed at once, not waited for
    assert not lock.exists()
    assert not list((repo.common_dir() / gitlocks.STEPS_DIRNAME).iterdir())  # records gone too
    if kind == "index.lock":
        assert repo.out("show", "HEAD:a.txt") == "edited"
    elif kind == "packed-refs.lock":
        assert repo.rev("refs/heads/packed") is None
    elif kind == "HEAD.lock":
        assert repo.current_branch() is None and repo.rev("HEAD") == prev
    else:
        assert repo.rev("main") == prev


def test_recovery_clears_a_killed_steps_locks_without_any_git_failing(repo, tmp_path):
    hook, make_argv, _ = KINDS["packed-refs.lock"]
    argv = make_argv(repo)
    kill_a_step_holding_its_lock(repo, tmp_path, hook, argv, repo.common_dir() / "packed-refs.lock")
    common = repo.common_dir()
    left = sorted(str(common / rel) for rel in
                  ("packed-refs.lock", "packed-refs.new", "refs/heads/packed.lock"))
    assert all(os.path.exists(p) for p in left)  # the new packed-refs was being written, too

    stale = []
    recovering = Git(repo.repo_dir, on_stale_lock=lambda p, c: stale.append((p, c)))
    assert sorted(recovering.clear_stale_locks()) == left
    assert sorted(stale) == [(p, "recovery") for p in left]
    assert plain_git(repo.repo_dir, *argv).returncode == 0


def test_a_lock_older_than_a_dead_step_is_not_that_steps_and_is_left_alone(repo):
    lock = repo.common_dir() / "index.lock"
    lock.write_text("a person's\n")
    os.utime(lock, (time.time() - 60, time.time() - 60))
    # A step of ours that died before it took any lock (its record is real, its process gone).
    died = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os
        from pathlib import Path
        from bmad_loop.git import locks as gitlocks
        gitlocks.begin_step(Path({str(repo.repo_dir)!r}), ["add", "-A"], {{}})
        os._exit(0)
    """)])
    assert died.returncode == 0
    g = Git(repo.repo_dir, lock_wait_s=0.3)
    with pytest.raises(TransientError) as caught:
        g.run("add", "-A")
    assert caught.value.where == str(lock)
    assert lock.read_text() == "a person's\n"
    assert not list((repo.common_dir() / gitlocks.STEPS_DIRNAME).iterdir())  # the dead record went


def test_a_dead_lanes_marked_index_lock_is_removed_by_the_next_git_step(repo, tmp_path):
    ready = tmp_path / "locked"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from bmad_loop.git.locks import IndexLock
        IndexLock(Path({str(repo.common_dir() / 'index')!r}), wait_s=0).acquire()
        Path({str(ready)!r}).write_text("x")
        time.sleep(120)
    """)], start_new_session=True)
    wait_for_files(ready, timeout=30)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    stale = []
    g = Git(repo.repo_dir, on_stale_lock=lambda p, c: stale.append(p))
    write(repo.repo_dir / "b.txt", "b\n")
    g.run("add", "b.txt")
    assert stale == [str(repo.common_dir() / "index.lock")]


# ------------------------------------------------------------------------------ foreign locks
def hold_with_a_real_git(repo: Git, tmp_path: Path, hook: str, argv: list[str], seconds: int):
    """A person's git, stopped in the repository's own `hook` while it holds its lock."""
    marker = tmp_path / "foreign-holding"
    hook_path = repo.common_dir() / "hooks" / hook
    write(hook_path, SLEEPING_HOOK.format(hook=hook, marker=marker).replace("120", str(seconds)))
    hook_path.chmod(0o755)
    env = clean_env({"GIT_AUTHOR_NAME": "p", "GIT_AUTHOR_EMAIL": "p@x", "GIT_COMMITTER_NAME": "p",
                     "GIT_COMMITTER_EMAIL": "p@x"})
    proc = subprocess.Popen(["git", *argv], cwd=repo.repo_dir, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_files(marker, timeout=30)
    return proc


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_foreign_lock_held_by_a_live_git_is_waited_for_then_reported_naming_the_file(repo, tmp_path):
    write(repo.repo_dir / "a.txt", "theirs\n")
    person = hold_with_a_real_git(repo, tmp_path, "pre-commit", ["commit", "-a", "-q", "-m", "p"], 120)
    lock = repo.common_dir() / "index.lock"
    try:
        waited = []
        g = Git(repo.repo_dir, lock_wait_s=1, on_lock_wait=lambda p, c: waited.append((p, c)))
        write(repo.repo_dir / "b.txt", "b\n")
        started = time.monotonic()
        with pytest.raises(TransientError) as caught:
            g.run("add", "b.txt", check=False)  # even unchecked: a lock is not an answer
        assert time.monotonic() - started >= 1.0
        assert caught.value.where == str(lock) and str(lock) in str(caught.value)
        assert waited == [(str(lock), "git add b.txt")] and g.lock_waits == 1
        assert lock.exists()  # a foreign lock is never removed
        fault = transient_fault(caught.value)
        assert fault.kind == "lock" and fault.where == str(lock)
    finally:
        end(person)


def test_a_foreign_lock_released_during_the_wait_lets_the_step_go_on(repo, tmp_path):
    write(repo.repo_dir / "a.txt", "theirs\n")
    person = hold_with_a_real_git(repo, tmp_path, "pre-commit", ["commit", "-a", "-q", "-m", "p"], 2)
    try:
        waited = []
        g = Git(repo.repo_dir, lock_wait_s=30, on_lock_wait=lambda p, c: waited.append(p))
        write(repo.repo_dir / "b.txt", "b\n")
        g.run("add", "b.txt")
        assert waited == [str(repo.common_dir() / "index.lock")]
        assert person.wait(timeout=30) == 0  # the person's commit went through too
        assert "b.txt" in repo.out("diff", "--cached", "--name-only")
    finally:
        end(person)


# ------------------------------------------------------------------------------ the messages
def test_every_lock_message_git_prints_is_recognised_with_its_file(repo):
    common = repo.common_dir()
    root = repo.repo_dir
    head, prev = repo.rev("HEAD"), repo.rev("HEAD~1")
    cases = [
        ("index.lock", ["add", "a.txt"]),
        ("HEAD.lock", ["update-ref", "--no-deref", "HEAD", prev]),
        ("refs/heads/main.lock", ["update-ref", "refs/heads/main", prev]),
        ("packed-refs.lock", ["update-ref", "-d", "refs/heads/packed"]),
        ("config.lock", ["config", "x.y", "1"]),
    ]
    for rel, argv in cases:
        lock = common / rel
        lock.write_text("")
        try:
            proc = plain_git(root, *argv)
        finally:
            lock.unlink()
        assert proc.returncode != 0, rel
        hit = gitlocks.lock_in(proc.stderr, root, common)
        assert hit is not None and hit.path == str(lock) and not hit.race, (rel, proc.stderr)
    # A racing fetch's message; update-ref with a wrong expected value prints the same.
    proc = plain_git(root, "update-ref", "refs/heads/main", prev, "1" * 40)
    hit = gitlocks.lock_in(proc.stderr, root, common)
    assert hit.race and hit.ref == "refs/heads/main" and hit.path == str(common / "refs/heads/main.lock")
    # Not locks: a conflict of names, a missing object.
    for argv in (["update-ref", "refs/heads/main/x", head], ["update-ref", "refs/heads/y", "f" * 40]):
        assert gitlocks.lock_in(plain_git(root, *argv).stderr, root, common) is None


def test_a_compare_and_swap_refused_because_the_ref_moved_is_not_waited_for(repo):
    waited = []
    g = Git(repo.repo_dir, lock_wait_s=30, on_lock_wait=lambda p, c: waited.append(p))
    started = time.monotonic()
    proc = g.run("update-ref", "refs/heads/main", repo.rev("HEAD~1"), "1" * 40, check=False)
    assert proc.returncode != 0 and "but expected" in proc.stderr
    assert time.monotonic() - started < 5 and waited == []


def test_a_foreign_ref_lock_never_reads_as_a_conflict_and_the_cas_reports_the_lock(repo, tmp_path):
    """compose's merge and ff paths use no lock at all; the CAS names the lock it met."""
    g = Git(repo.repo_dir, lock_wait_s=0.5)
    base = repo.rev("main")
    g.run("branch", "story", base)
    wt = tmp_path / "wt"
    g.run("worktree", "add", "-q", wt, "story")
    write(wt / "s.txt", "story\n")
    g.run("add", "s.txt", cwd=wt)
    g.run("commit", "-q", "-m", "story", cwd=wt, env=g.identity_env())
    story = g.rev("story")
    expected = {s: compose(g, s, base, story, "m") for s in ("merge", "squash", "ff")}

    person = hold_with_a_real_git(repo, tmp_path, "reference-transaction",
                                  ["update-ref", "refs/heads/main", repo.rev("HEAD~1"), base], 120)
    assert (repo.common_dir() / "refs/heads/main.lock").exists()
    mine = []  # every other lock too, for as long as the composition runs
    for rel in ("index.lock", "HEAD.lock", "packed-refs.lock"):
        lock = repo.common_dir() / rel
        if not lock.exists():
            lock.write_text("")
            mine.append(lock)
    try:
        for strategy, before in expected.items():
            comp = compose(g, strategy, base, story, "m")
            assert comp.ok and not comp.conflicts and comp.sha == before.sha, strategy
        with pytest.raises(TransientError) as caught:
            cas_advance(g, "main", expected["merge"].sha, base)
        assert caught.value.where == str(repo.common_dir() / "refs/heads/main.lock")
        assert repo.rev("main") == base
    finally:
        end(person)
        for lock in mine:
            lock.unlink()


def test_without_a_lock_a_failing_step_fails_at_once_as_before(repo):
    g = Git(repo.repo_dir, lock_wait_s=30)
    started = time.monotonic()
    with pytest.raises(GitError):
        g.run("update-ref", "refs/heads/main", "f" * 40)
    assert time.monotonic() - started < 5
    assert not list((repo.common_dir() / gitlocks.STEPS_DIRNAME).iterdir())
