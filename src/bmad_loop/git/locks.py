"""git's lock files and bmad-loop's own locks: recognised, attributed, waited for, held.

git serialises writers with ``<file>.lock`` files created exclusively (``index.lock``,
``HEAD.lock``, ``refs/heads/<b>.lock``, ``packed-refs.lock`` with its ``packed-refs.new``,
``config.lock``), prints no distinct exit code when one is taken, and names no owner in it. A
git killed with SIGKILL leaves its lock behind, and every later git that needs it fails until
someone removes it.

So every *mutating* git step bmad-loop runs is written down before it starts (write-ahead): a
small JSON record ``<git-common-dir>/bmad-loop-steps/<pid>-<n>`` with the host, the process and
its start time, the argv, the lock files the step may take (its worktree's index and HEAD, the
common ``refs/`` folder, ``packed-refs``, ``config``…) and, once spawned, the git child's pid
and start time. The record is removed when the step ends. A lock file is *stale* — left by a
step of ours that died — when a record on this host lists it, its bmad-loop process is gone (or
gave up on a child it had to kill) and its git child is gone too, the lock is no older than the
record, and no live step of ours could hold it. Stale locks are removed (`sweep`); any other
lock is foreign and is waited for (`runner.Git.run`).

bmad-loop's own locks are here too:

- the repository's mutation lock (`repo_lock`), shared by bmad-loop's threads and processes on
  one machine: it serialises ref and worktree mutations inside one repository (concurrent ``git
  worktree add`` in one repository fails intermittently otherwise); `locked_read` keeps a read
  such as ``worktree list`` apart from them without creating the lock file;
- a checkout's index lock held the way git itself holds it (`IndexLock`), across the lane's
  compare-and-swap: git serialises writers of an index with ``<index>.lock``, created
  exclusively, and a writer puts the new index in the lock file and renames it over the index.
  The lane takes that lock *before* it moves the target and keeps it until the checkout follows
  the new target, so nobody (an editor running ``git status``, a person committing) ever sees
  the checkout half-way: its branch moved but its index still at the old tree, which would read
  as a staged revert of the story. While held, the lock file carries a marker line naming
  bmad-loop, the host and the process, never index data: git treats any content as "locked",
  and a stale one (its process died) is told from a foreign one, which is waited for instead.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psutil

from ..errors import TransientError
from ..hostid import host_name
from ..proctree import is_running, own_start_time, start_time

__all__ = ["LockHit", "lock_in", "git_dirs", "StepRecord", "begin_step", "sweep",
           "stale_lock", "STEPS_DIRNAME", "STEP_ENV",
           "Repository", "LOCK_FILE_NAME", "repo_lock", "locked_read",
           "IndexLock", "INDEX_LOCK_MARKER", "lock_owner", "stale_marker_lock"]
STEPS_DIRNAME = "bmad-loop-steps"
STEP_ENV = "BMAD_LOOP_GIT_STEP"  # in every mutating step's environment: finds an unrecorded child
_SLACK_S = 2.0  # a lock this much older than a record is not that step's (clock granularity)
_UNREADABLE_S = 60.0  # a record nobody can parse (killed while writing it) is dropped after this

# What git prints when a lock it needs is taken.
_FILE_EXISTS = re.compile(r"Unable to create '(?P<path>[^'\n]+\.lock)': File exists")
# The temporary file beside packed-refs.lock (``packed-refs.new``), which a killed git leaves too.
_TEMP_EXISTS = re.compile(r"unable to create file (?P<path>[^\n]+?): File exists")
_CONFIG = re.compile(r"could not lock config file (?P<path>.+?): File exists")
_RACE = re.compile(r"cannot lock ref '(?P<ref>[^']+)': is at [0-9a-f]+ but expected [0-9a-f]+")


@dataclass(frozen=True)
class LockHit:
    """A lock a git command failed on: the lock file, and whether it was a ref that moved under
    the command (`race`: "is at X but expected Y", a racing fetch) rather than a held file."""

    path: str
    race: bool = False
    ref: str = ""


def lock_in(stderr: str | bytes | None, cwd: Path, common: Path | None = None) -> LockHit | None:
    """The lock `stderr` says a git command in `cwd` failed on, or None."""
    if not stderr:
        return None
    if isinstance(stderr, bytes):
        stderr = stderr.decode("utf-8", "replace")
    m = _FILE_EXISTS.search(stderr)
    if m:
        return LockHit(_absolute(m.group("path"), cwd))
    m = _TEMP_EXISTS.search(stderr)
    if m:
        return LockHit(_absolute(m.group("path"), cwd))
    m = _CONFIG.search(stderr)
    if m:
        return LockHit(_absolute(m.group("path"), cwd) + ".lock")
    m = _RACE.search(stderr)
    if m:
        ref = m.group("ref")
        base = common if common is not None else cwd
        return LockHit(str(Path(base) / f"{ref}.lock"), race=True, ref=ref)
    return None


def _absolute(path: str, cwd: Path) -> str:
    p = Path(path)
    return str(p if p.is_absolute() else (Path(cwd) / p))


def git_dirs(cwd: Path) -> tuple[Path, Path] | None:
    """(git dir, common dir) of the repository `cwd` is in, found without running git (a
    ``.git`` folder, a ``.git`` file of a linked worktree, or a bare repository); None if none.
    Asked before most git steps, so it walks with `os.path` strings, not `Path` objects."""
    folder = os.path.abspath(cwd)
    while True:
        dotgit = os.path.join(folder, ".git")
        gitdir = None
        if os.path.isdir(dotgit):
            gitdir = dotgit
        elif os.path.isfile(dotgit):
            try:
                with open(dotgit, encoding="utf-8", errors="replace") as handle:
                    text = handle.read().strip()
            except OSError:
                return None
            if not text.startswith("gitdir:"):
                return None
            gitdir = os.path.join(folder, text[len("gitdir:"):].strip())  # absolute stays so
        elif os.path.isfile(os.path.join(folder, "HEAD")) and os.path.isdir(os.path.join(folder, "objects")):
            gitdir = folder  # a bare repository
        if gitdir is not None:
            gitdir = os.path.abspath(gitdir)
            common = gitdir
            try:
                with open(os.path.join(gitdir, "commondir"), encoding="utf-8") as handle:
                    raw = handle.read().strip()
                common = os.path.abspath(os.path.join(gitdir, raw))
            except (OSError, UnicodeDecodeError):
                pass
            return Path(gitdir), Path(common)
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


# -- write-ahead records ------------------------------------------------------------------------

_counter = itertools.count(1)
_counter_lock = threading.Lock()


def _alive(pid: int | None, start: float | None) -> bool:
    # Start times come back from a record file: half a second of slack for rounding.
    return pid is not None and pid != 0 and is_running(pid, start, tolerance_s=0.5)


class StepRecord:
    """One mutating git step, on disk while it runs."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path, self.data = path, data

    @property
    def name(self) -> str:
        return self.path.name

    def set_child(self, pid: int) -> None:
        self.data.update(child=pid, child_start=start_time(pid))
        self.write()

    def orphan(self) -> None:
        """The git child died without finishing (killed, timed out): its locks may be left.
        The record stays, marked, for `sweep` to clear them."""
        self.data["orphaned"] = True
        self.write()

    def end(self) -> None:
        if not self.data.get("orphaned"):
            try:
                self.path.unlink()
            except OSError:
                pass

    def write(self) -> None:
        _write_json(self.path, self.data)

    # What a step may lock: exact files and folders (any *.lock below them).
    def covers(self, lock: str) -> bool:
        if lock in self.data.get("locks", ()):
            return True
        return any(lock.startswith(prefix) for prefix in self.data.get("prefixes", ()))

    def stale(self) -> bool:
        """Dead: on this host, its bmad-loop process gone (or it gave up on its child), and its
        git child gone."""
        d = self.data
        if d.get("host") != host_name():
            return False
        if not d.get("orphaned") and _alive(d.get("pid"), d.get("pid_start")):
            return False
        if d.get("child"):
            return not _alive(d["child"], d.get("child_start"))
        return not _carries_marker(self.name)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _carries_marker(name: str) -> bool:
    """Is any process on this machine running with this step's marker (a child whose pid the
    record never got, because its owner died right after spawning it)?"""
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(STEP_ENV) == name:
                return True
        except (psutil.Error, OSError):
            continue
    return False


def begin_step(cwd: Path, argv: list[str], env: Mapping[str, str] | None) -> StepRecord | None:
    """Write the record of a mutating step about to run in `cwd`; None outside a repository."""
    dirs = git_dirs(cwd)
    if dirs is None:
        return None
    gitdir, common = dirs
    index = (env or {}).get("GIT_INDEX_FILE")
    index_lock = (_absolute(index, cwd) if index else str(gitdir / "index")) + ".lock"
    locks = sorted({index_lock, str(gitdir / "HEAD.lock"), str(common / "HEAD.lock"),
                    str(common / "packed-refs.lock"), str(common / "packed-refs.new"),
                    str(common / "config.lock"),
                    str(gitdir / "config.worktree.lock"), str(common / "shallow.lock")})
    prefixes = [str(common / "refs") + os.sep, str(gitdir / "refs") + os.sep]
    if argv[:1] == ["worktree"]:
        prefixes.append(str(common / "worktrees") + os.sep)
    folder = common / STEPS_DIRNAME
    try:
        folder.mkdir(exist_ok=True)
    except OSError:
        return None
    with _counter_lock:
        n = next(_counter)
    pid = os.getpid()
    record = StepRecord(folder / f"{pid}-{n}", {
        "host": host_name(), "pid": pid, "pid_start": own_start_time(), "started": time.time(),
        "argv": argv[:40], "cwd": str(cwd), "locks": locks, "prefixes": sorted(set(prefixes)),
    })
    try:
        record.write()
    except OSError:
        return None  # a full disk: git itself will say so
    return record


def _records(common: Path) -> list[StepRecord]:
    folder = Path(common) / STEPS_DIRNAME
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        if name.startswith("."):
            path = folder / name
            if _older_than(path, _UNREADABLE_S):
                path.unlink(missing_ok=True)  # a temp file of a writer that died
            continue
        path = folder / name
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            if _older_than(path, _UNREADABLE_S):
                path.unlink(missing_ok=True)
            continue
        found.append(StepRecord(path, data))
    return found


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False


def _candidates(record: StepRecord) -> list[str]:
    found = [p for p in record.data.get("locks", ()) if os.path.lexists(p)]
    for prefix in record.data.get("prefixes", ()):
        for root, _dirs, files in os.walk(prefix):
            found.extend(os.path.join(root, f) for f in files if f.endswith(".lock"))
    return found


def sweep(common: Path, *, mine: StepRecord | None = None,
          on_stale: Callable[[str], None] | None = None) -> list[str]:
    """Remove the lock files steps of ours that died left behind, then their records.

    A lock is removed only when a dead step lists it, it is no older than that step, and no
    live step (other than `mine`, the caller's own, which failed to take it) could hold it.
    `on_stale(path)` is called for each. Returns the removed paths."""
    records = [r for r in _records(common) if mine is None or r.path != mine.path]
    dead = [r for r in records if r.stale()]
    if not dead:
        return []
    live = [r for r in records if r not in dead]
    removed: list[str] = []
    for record in dead:
        started = float(record.data.get("started", 0))
        for lock in _candidates(record):
            if any(r.covers(lock) for r in live):
                continue
            try:
                if os.lstat(lock).st_mtime < started - _SLACK_S:
                    continue  # older than the step: not its lock
                os.unlink(lock)
            except FileNotFoundError:
                continue
            except OSError:
                continue
            removed.append(lock)
            if on_stale is not None:
                on_stale(lock)
        try:
            record.path.unlink()
        except OSError:
            pass
    return removed


def stale_lock(lock: str, common: Path | None, *, mine: StepRecord | None = None,
               on_stale: Callable[[str], None] | None = None) -> bool:
    """Remove `lock` if it is stale (a dead step's, or a dead lane's marked index lock), with
    whatever else the dead steps left; True when this call removed `lock` itself."""
    if not os.path.lexists(lock):
        return False
    if stale_marker_lock(Path(lock)):
        try:
            os.unlink(lock)
        except FileNotFoundError:
            return False
        if on_stale is not None:
            on_stale(lock)
        return True
    if common is None:
        return False
    return lock in sweep(common, mine=mine, on_stale=on_stale)


# -- the repository's mutation lock -------------------------------------------------------------


class Repository(Protocol):
    """What the repository lock needs of a repository: where its git common dir is."""

    def common_dir(self) -> Path: ...


LOCK_FILE_NAME = "bmad-loop.lock"
T = TypeVar("T")

# Per-thread depth of the locks this thread holds, keyed by lock file: makes repo_lock re-entrant
# within a thread (a caller may hold it around several mutations that each take it again).
_held = threading.local()


@contextmanager
def repo_lock(git: Repository) -> Iterator[None]:
    """Hold the repository's mutation lock: ``fcntl.flock`` on ``<common_dir>/bmad-loop.lock``.

    Each outermost acquisition opens its own file description, so threads of one process exclude
    each other as well as processes do; the kernel releases it if the holder is killed (even with
    SIGKILL). Re-entrant within one thread. Do not fork while holding it (the child would share
    it). Works only among processes on one machine (the scale-out mode needs a lease instead).
    """
    path = str(git.common_dir() / LOCK_FILE_NAME)
    depths = _held.__dict__.setdefault("depths", {})
    if depths.get(path):
        depths[path] += 1
        try:
            yield
        finally:
            depths[path] -= 1
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        depths[path] = 1
        try:
            yield
        finally:
            depths[path] = 0
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def locked_read(git: Repository, read: Callable[[], T]) -> T:
    """`read()` kept apart from bmad-loop's mutations, without creating the lock file.

    A read-only command (`validate`, `status`) must leave `.git` as it found it. Every mutation
    creates the lock file before it starts and nothing deletes it, so when the file is missing
    both before and after the read, no mutation overlapped it; when it appeared meanwhile (a
    first run starting this moment), the read runs again under the lock.
    """
    path = git.common_dir() / LOCK_FILE_NAME
    if not path.exists():
        try:
            result = read()
        except Exception:
            if not path.exists():
                raise
        else:
            if not path.exists():
                return result
    with repo_lock(git):
        return read()


# -- a checkout's index lock --------------------------------------------------------------------

INDEX_LOCK_MARKER = b"bmad-loop index lock"


def lock_owner(lock: Path) -> tuple[str, int] | None:
    """(host, pid) of a bmad-loop lock file; None for a lock git made (or an unreadable one)."""
    try:
        head = lock.read_bytes()[:200]
    except OSError:
        return None
    if not head.startswith(INDEX_LOCK_MARKER):
        return None
    words = head[len(INDEX_LOCK_MARKER):].decode("utf-8", "replace").split()
    try:
        return words[0], int(words[1])
    except (IndexError, ValueError):
        return None


def stale_marker_lock(lock: Path) -> bool:
    """True for a bmad-loop lock on this host whose process is gone."""
    owner = lock_owner(lock)
    if owner is None or owner[0] != host_name():
        return False
    host, pid = owner
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class IndexLock:
    """`<index>.lock` of one checkout, taken exclusively; waits for a foreign holder.

    `on_wait(path)` is called once when the lock is found held; `on_stale(path)` when a stale
    lock of a dead bmad-loop process is removed.
    """

    def __init__(self, index: Path, *, wait_s: float,
                 on_wait: Callable[[str], None] | None = None,
                 on_stale: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.index = Path(index)
        self.lock = self.index.with_name(self.index.name + ".lock")
        self.wait_s = wait_s
        self.on_wait, self.on_stale = on_wait, on_stale
        self.clock, self.sleep = clock, sleep
        self.held = False

    def acquire(self) -> None:
        deadline = self.clock() + self.wait_s
        delay, told = 0.01, False
        while True:
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if stale_marker_lock(self.lock):
                    self._remove_stale()
                    continue
                if self.clock() >= deadline:
                    raise TransientError(
                        f"{self.lock} is held by another git process (an editor, a person?) "
                        f"and stayed so for {self.wait_s:g}s", where=str(self.lock)) from None
                if not told and self.on_wait:
                    self.on_wait(str(self.lock))
                told = True
                self.sleep(delay)
                delay = min(delay * 2, 0.25)
                continue
            try:
                os.write(fd, INDEX_LOCK_MARKER + f" {host_name()} {os.getpid()}\n".encode())
            finally:
                os.close(fd)
            self.held = True
            return

    def install(self, new_index: Path) -> None:
        """Make `new_index` the checkout's index (atomically), still holding the lock."""
        os.replace(new_index, self.index)

    def release(self) -> None:
        if self.held:
            self.held = False
            if lock_owner(self.lock) == (host_name(), os.getpid()):
                self.lock.unlink(missing_ok=True)

    def _remove_stale(self) -> None:
        try:
            self.lock.unlink()
        except FileNotFoundError:
            return
        if self.on_stale:
            self.on_stale(str(self.lock))

    def __enter__(self) -> IndexLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
