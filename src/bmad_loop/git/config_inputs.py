"""``git config --list`` asked again only when something git reads for it has changed.

The guard reads the repository's git configuration (`gitconfig_guard`) before and after every
agent session and for each guard environment: four ``git config --list`` per story, and the
answer almost never changes. What git's answer depends on, for one folder, is finite and cheap
to read: the system file (where this git was built to look, asked once per process), the two
global files (``$XDG_CONFIG_HOME/git/config`` or ``~/.config/git/config``, and ``~/.gitconfig``),
the repository's ``config``, every ``config.worktree`` it could read, every file an
``include.path`` or ``includeIf.<condition>.path`` names (taken or not, present or not), the
worktree's ``HEAD`` (``includeIf "onbranch:…"``), its ``.git`` file, the owners of the folders
(``safe.directory``) and the environment variables that move the global files.

`entries` keeps, per folder, git's answer with the *contents* of all of those (not their
timestamps, so an edit within the same clock tick, or one that keeps the size, is still seen).
The contents are read before and after git runs and the answer is kept only when they agree,
so an edit racing git's own read is never hidden. Anything unusual (a folder that is not its
worktree's top, an include git expands in ways this does not follow, an unreadable file, a
system file whose path git does not reveal) means git is asked every time, as before.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from pathlib import Path

from .locks import git_dirs
from ..caches import CACHES

__all__ = ["entries"]

_KEPT = 32
_FLIGHT_WAIT_S = 10.0
_ENV = ("HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_NOSYSTEM")
_UNREADABLE = object()
_SYSTEM_MISSING = re.compile(r"unable to read config file '([^']+)'")

_lock = threading.Lock()
_answers: OrderedDict[str, tuple[tuple, object, tuple[Path, ...]]] = OrderedDict()
# common dir -> the answer a linked worktree of it gave, shared with its siblings (`_sharing`)
_shared: OrderedDict[str, tuple[tuple, object, tuple[Path, ...]]] = OrderedDict()
_system: list[Path | None] = []  # [path] once known; [None]: git would not say
_flights: dict[str, threading.RLock] = {}  # folder -> held while git is asked (re-entrant: a
# `read` may come back here, e.g. for the hooks folder its own git run needs)
CACHES.register("git.config_answers", lambda: (_answers.clear(), _shared.clear(), _system.clear()),
               bound=f"{_KEPT} folders",
               holds="folder -> git's configuration there, until a file it reads changes")


def entries(git, cwd: Path, read):
    """`read(git, cwd)` (the real ``git config --list`` reader: (entries, error)), or the answer
    it gave last time for `cwd` when nothing it depends on has changed since. Threads asking
    for one folder at once ask git once: the others wait for that answer and check it."""
    key = os.fspath(Path(cwd).absolute())
    with _lock:
        flight = _flights.setdefault(key, threading.RLock())
    # Bounded: a wait that outlasts it asks git itself, so no order of nested reads can hang.
    waited = flight.acquire(timeout=_FLIGHT_WAIT_S)
    try:
        return _entries(git, cwd, read, key)
    finally:
        if waited:
            flight.release()
        with _lock:
            if len(_flights) > 4 * _KEPT:
                _flights.clear()  # a holder keeps its own lock; at worst git is asked twice


def _entries(git, cwd: Path, read, key: str):
    with _lock:
        known = _answers.get(key)
    base = _base_files(git, Path(cwd))
    if base is None:
        return read(git, cwd)
    watched = tuple(dict.fromkeys(base + (known[2] if known else ())))
    before = _snapshot(Path(cwd), watched)
    if known is not None and before is not None and known[0] == before:
        with _lock:
            _answers.move_to_end(key, last=True)
        return known[1]
    share = _sharing(git, Path(cwd))
    if share is not None:
        with _lock:
            other = _shared.get(share[0])
        if other is not None:
            files = tuple(dict.fromkeys(share[1] + other[2]))
            if _snapshot(Path(cwd), files) == other[0]:
                return other[1]
    answer = read(git, cwd)
    found, error = answer
    included = _included_files(found) if error is None else None
    after = _snapshot(Path(cwd), watched)
    if (included is not None and before is not None and after == before
            and set(included) <= set(watched)):
        with _lock:
            _answers[key] = (after, answer, tuple(included))
            while len(_answers) > _KEPT:
                _answers.popitem(last=False)
        if share is not None and not any(k.startswith("includeif.") for _s, _o, k, _v in found):
            # No condition can tell this worktree from its siblings: they may share it.
            files = tuple(dict.fromkeys(share[1] + tuple(included)))
            contents = dict(after[1:-1])
            shared = (after[0], *((os.fspath(f), contents[os.fspath(f)]) for f in files),
                      after[-1])
            with _lock:
                _shared[share[0]] = (shared, answer, tuple(included))
                while len(_shared) > _KEPT:
                    _shared.popitem(last=False)
    elif included is not None:  # the files to watch are known now: the next read can keep it
        with _lock:
            _answers[key] = ((), answer, tuple(included))
    return answer


def _sharing(git, cwd: Path) -> tuple[str, tuple[Path, ...]] | None:
    """(common dir, the files its linked worktrees' answers depend on) when `cwd` is a linked
    worktree without its own configuration, it and its git folders owned by this user (so
    ``safe.directory`` says the same for every sibling); else None."""
    if not (cwd / ".git").is_file():
        return None
    dirs = git_dirs(cwd)
    system = _system_file(git)
    if dirs is None or system is None or os.path.lexists(dirs[0] / "config.worktree"):
        return None
    try:
        if any(os.stat(p).st_uid != os.geteuid() for p in (cwd, *dirs)):
            return None
    except OSError:
        return None
    common = dirs[1]
    return os.fspath(common), (system, common / "config", common / "config.worktree",
                               *_global_files())


def _base_files(git, cwd: Path) -> tuple[Path, ...] | None:
    """The files every read depends on; None when this folder is not one to cache for."""
    if not os.path.lexists(cwd / ".git"):
        return None  # a subfolder: git would search upwards; not worth following
    dirs = git_dirs(cwd)
    system = _system_file(git)
    if dirs is None or system is None:
        return None
    gitdir, common = dirs
    return (system, common / "config", common / "config.worktree", gitdir / "config.worktree",
            gitdir / "HEAD", gitdir / "commondir", cwd / ".git", *_global_files())


def _global_files() -> list[Path]:
    home = os.environ.get("HOME")
    xdg = os.environ.get("XDG_CONFIG_HOME")
    files = []
    if xdg:
        files.append(Path(xdg) / "git" / "config")
    elif home:
        files.append(Path(home) / ".config" / "git" / "config")
    if home:
        files.append(Path(home) / ".gitconfig")
    return files


def _system_file(git) -> Path | None:
    """Where this git reads its system configuration: the file it names when asked for it."""
    with _lock:
        if _system:
            return _system[0]
    proc = git.run("config", "--system", "--list", "--show-origin", check=False)
    path = None
    if proc.returncode == 0:
        first = proc.stdout.split("\n", 1)[0]
        if first.startswith("file:") and "\t" in first:
            path = Path(first[len("file:"):].split("\t", 1)[0])
    else:
        missing = _SYSTEM_MISSING.search(proc.stderr or "")
        if missing:
            path = Path(missing.group(1))
    if path is not None and not path.is_absolute():
        path = None
    with _lock:
        if not _system:
            _system.append(path)
        return _system[0]


def _included_files(found) -> list[Path] | None:
    """Every file an include names (relative ones beside the file that names them); None when
    one is written in a form this does not follow (``~user/``, ``%(prefix)/``, no file)."""
    files = []
    for _scope, origin, key, value in found:
        if not (key == "include.path" or (key.startswith("includeif.") and key.endswith(".path"))):
            continue
        if not value or value.startswith("%(prefix)") or \
                (value.startswith("~") and not value.startswith("~/")):
            return None
        if value.startswith("~/"):
            home = os.environ.get("HOME")
            if not home:
                return None
            files.append(Path(home) / value[2:])
        elif os.path.isabs(value):
            files.append(Path(value))
        elif os.path.isabs(origin):
            files.append(Path(os.path.normpath(os.path.join(os.path.dirname(origin), value))))
        else:
            return None
    return files


def _snapshot(cwd: Path, files) -> tuple | None:
    """The contents of `files` (None where absent), the owners of the folders and the
    environment, or None when one cannot be read."""
    parts: list = [tuple(os.environ.get(name) for name in _ENV)]
    for path in files:
        content = _content(path)
        if content is _UNREADABLE:
            return None
        parts.append((os.fspath(path), content))
    dirs = git_dirs(cwd)
    if dirs is None:
        return None
    try:
        parts.append(tuple(os.stat(p).st_uid for p in (cwd, *dirs)))
    except OSError:
        return None
    return tuple(parts)


def _content(path: Path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:  # the main checkout's .git; a folder where a file is expected
        return b"\0folder"
    except OSError:
        return _UNREADABLE
