"""Telling a fault a retry may cure from one it cannot.

Transient: a lock another process holds (git's `*.lock` files, a busy SQLite database), a full
disk, an I/O error. The lane and the workers retry those with a bounded back-off and then
pause the run naming the file or command; everything else is a bug or a bad input and is
reported as such. `Fault` says what and where, for the journal and the run's reason.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

from .errors import GitError, TransientError

__all__ = ["Fault", "transient_fault", "GIT_LOCK_PATTERNS"]

# What git prints when a lock it needs is taken (it has no distinct exit code for it).
GIT_LOCK_PATTERNS = (
    re.compile(r"Unable to create '(?P<path>[^']+\.lock)': File exists"),
    re.compile(r"could not lock config file (?P<path>\S+)"),
    re.compile(r"cannot lock ref '(?P<path>[^']+)'"),
    re.compile(r"Unable to create '(?P<path>[^']+)'"),
    re.compile(r"Another git process seems to be running"),
)
_DISK = re.compile(r"No space left on device|Disk quota exceeded|Input/output error|"
                   r"Read-only file system")
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}


@dataclass(frozen=True)
class Fault:
    kind: str     # lock | disk | database
    where: str    # the file, ref or command
    message: str

    def describe(self) -> str:
        return f"{self.kind} fault at {self.where}: {self.message}"


def transient_fault(exc: BaseException) -> Fault | None:
    """The transient fault behind `exc` (or its causes), or None when it is not one."""
    seen = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        fault = _classify(link)
        if fault is not None:
            return fault
        link = link.__cause__ or link.__context__
    return None


def _classify(exc: BaseException) -> Fault | None:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, TransientError):
        return Fault("lock" if ".lock" in exc.where else "disk", exc.where or "?", message)
    if isinstance(exc, GitError):
        text = f"{exc}\n{exc.stderr or ''}"
        for pattern in GIT_LOCK_PATTERNS:
            m = pattern.search(text)
            if m:
                where = m.groupdict().get("path") or "a git lock"
                return Fault("lock", where, message)
        if _DISK.search(text):
            return Fault("disk", _command_of(message), message)
        return None
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
        return Fault("disk", exc.filename or "?", message)
    name = type(exc).__name__
    if name in ("OperationalError", "DatabaseError") and re.search(
            r"database is locked|disk I/O error|database or disk is full|unable to open", str(exc)):
        return Fault("database", "state database", message)
    return None


def _command_of(message: str) -> str:
    m = re.search(r"git [^:]+", message)
    return m.group(0) if m else "git"
