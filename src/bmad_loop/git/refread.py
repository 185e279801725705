"""Reading a branch or a worktree's HEAD from the files git keeps, without starting git.

The lane and the workers read the target branch, story branches and worktree HEADs many times
per story; each ``git rev-parse`` is a process (~2 ms). The files backend stores a ref as a loose
file ``<common dir>/<ref>`` holding ``<sha>\\n``, or as a line ``<sha> <ref>`` of
``<common dir>/packed-refs``; a loose file wins. ``HEAD`` is per worktree (``<git dir>/HEAD``)
and usually says ``ref: refs/heads/<branch>``. git writes every one of these files whole (a
``.lock`` beside it, then a rename), and when it packs a ref it writes ``packed-refs`` before it
deletes the loose file, so reading the loose file first and then ``packed-refs`` gives the old
value or the new one, never a mix.

`read_commit_ref` answers for ``HEAD`` and ``refs/heads/<branch>`` only (git refuses to point
either at anything but a commit) and gives up, with `UNKNOWN`, on anything unusual: another
namespace, a reftable repository, a symbolic ref other than HEAD -> a branch, a symlink, content
that is not one full object name, an unborn HEAD, a folder that is not in a repository. The
caller then asks git. An absent branch is `None` only when none of the names git would also try
for it (``refs/refs/heads/x``, ``refs/heads/refs/heads/x``, …) exists either.

What git checks and this does not: that the object exists. A ref naming a missing object is a
broken repository, and the first command that uses the SHA fails on it. A compare-and-swap
(``update-ref <ref> <new> <old>``) still has git check the old value: a stale read can only
make it refuse.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from .refnames import branch_name_ok
from .locks import git_dirs

__all__ = ["read_commit_ref", "main_checkout_branch", "read_git_file", "UNKNOWN"]

UNKNOWN = object()  # ask git
_SHA = re.compile(rb"([0-9a-f]{40}|[0-9a-f]{64})\n?")
_HEADS = "refs/heads/"
# The other names `git rev-parse refs/heads/x` tries when refs/heads/x does not exist.
_ALSO_TRIED = ("refs/{}", "refs/tags/{}", "refs/heads/{}", "refs/remotes/{}",
               "refs/remotes/{}/HEAD")
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR)


def read_commit_ref(cwd: Path | str, name: str):
    """The SHA `name` (``HEAD`` or ``refs/heads/<branch>``) names as git run in `cwd` would
    read it; None when it does not exist; `UNKNOWN` when git must be asked."""
    if name != "HEAD" and not (name.startswith(_HEADS) and branch_name_ok(name[len(_HEADS):])):
        return UNKNOWN
    if not os.path.isdir(cwd):  # git fails there; never read the repository above it
        return UNKNOWN
    dirs = git_dirs(Path(cwd))
    if dirs is None:
        return UNKNOWN
    gitdir, common = dirs
    if os.path.isdir(common / "reftable"):
        return UNKNOWN
    if name == "HEAD":
        return _head(gitdir, common)
    found = _lookup(common, name)
    if found is not None:
        return found
    for rule in _ALSO_TRIED:
        if _lookup(common, rule.format(name)) is not None:
            return UNKNOWN
    return None


def _head(gitdir: Path, common: Path):
    raw = read_git_file(gitdir / "HEAD")
    if raw is None or raw is UNKNOWN:
        return UNKNOWN
    if raw.startswith(b"ref: "):
        target = raw[5:].strip().decode("utf-8", "surrogateescape")
        if not (target.startswith(_HEADS) and branch_name_ok(target[len(_HEADS):])):
            return UNKNOWN
        found = _lookup(common, target)
        return UNKNOWN if found is None else found  # None: an unborn branch, git's to judge
    return _sha(raw)


def _lookup(common: Path, ref: str):
    """The SHA of `ref` (loose, else packed), None when absent, `UNKNOWN` when odd."""
    raw = read_git_file(common / ref)
    if raw is UNKNOWN:
        return UNKNOWN
    if raw is not None:
        return _sha(raw)
    packed = read_git_file(common / "packed-refs")
    if packed is UNKNOWN:
        return UNKNOWN
    return None if packed is None else _packed(packed, ref)


def _packed(data: bytes, ref: str):
    if not data.endswith(b"\n"):
        data += b"\n"
    needle = b" " + ref.encode("utf-8", "surrogateescape") + b"\n"
    pos = data.find(needle)
    while pos != -1:
        start = data.rfind(b"\n", 0, pos) + 1
        if _SHA.fullmatch(data[start:pos]):  # "<sha> <ref>" is the whole line
            return data[start:pos].decode("ascii")
        pos = data.find(needle, pos + 1)
    return None


def _sha(raw: bytes):
    match = _SHA.fullmatch(raw)
    return match.group(1).decode("ascii") if match else UNKNOWN


def read_git_file(path):
    """The file's bytes; None when there is no such file; `UNKNOWN` for a symlink or an error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return None if exc.errno in _ABSENT else UNKNOWN
    try:
        with os.fdopen(fd, "rb") as handle:
            return handle.read()
    except OSError as exc:
        return None if exc.errno in _ABSENT else UNKNOWN


def main_checkout_branch(folder: Path | str) -> str | None:
    """The branch (``refs/heads/<name>``) checked out in `folder` when `folder` is a main
    worktree (its ``.git`` a folder, not a reftable one) whose HEAD names one; else None."""
    gitdir = Path(folder) / ".git"
    if not gitdir.is_dir() or (gitdir / "reftable").is_dir():
        return None
    raw = read_git_file(gitdir / "HEAD")
    if raw is None or raw is UNKNOWN or not raw.startswith(b"ref: "):
        return None
    target = raw[5:].strip().decode("utf-8", "surrogateescape")
    return target if target.startswith(_HEADS) and branch_name_ok(target[len(_HEADS):]) else None
