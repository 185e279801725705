"""Looking at a SQLite file before anything opens it, and naming what is wrong with it.

bmad-loop keeps two SQLite files under `.bmad-loop/`: the state database (`state.db`) and the
huey queue (`queue.db`). A file that is not a database, or one cut short (a full disk, a copy
that stopped half-way), must be refused in one line naming it, *before* a connection is made: a
connection would create `-wal`/`-shm` files beside it, and a writer could go on to use the pages
that are left. `check_sqlite_file` reads the 100-byte header only; it never writes.

`sqlite_error_message` turns the errors SQLite raises later (a lock another process holds, a
read-only folder, a damaged page) into the same kind of line.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from ..errors import ConfigError

__all__ = ["check_sqlite_file", "check_folder_writable", "sqlite_error_message"]

_MAGIC = b"SQLite format 3\x00"
_HEADER = 100

# Files this process has checked, and may since hold SQLite connections on. They are never
# opened here again: POSIX locks belong to the process, and closing *any* descriptor of the
# file drops every lock SQLite holds on it through its connections; another process could then
# checkpoint the WAL under a reader here ("database disk image is malformed").
_checked: set[str] = set()


def _header_problem(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            header = handle.read(_HEADER)
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    if size == 0:
        return None  # SQLite's own "new, empty database"
    if size < _HEADER or not header.startswith(_MAGIC):
        return "not a SQLite database"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return f"damaged SQLite header (page size {page_size})"
    if size % page_size:
        return f"truncated: {size} bytes is not a whole number of {page_size}-byte pages"
    # The in-header page count is valid when the change counter matches "version-valid-for".
    pages = int.from_bytes(header[28:32], "big")
    if pages and header[24:28] == header[92:96] and size < pages * page_size:
        return f"truncated: {size} bytes, but its header says {pages * page_size}"
    return None


def check_sqlite_file(path: Path, what: str) -> None:
    """Refuse (ConfigError, exit 2) an existing `path` that is not a whole SQLite database.

    A missing or empty file is fine: SQLite makes a new database there. A file that looks wrong
    is looked at once more after a moment, so one that another process is creating or extending
    right now (its first page half-written, a checkpoint growing it) is not taken for damage.
    """
    path = Path(path)
    key = os.path.abspath(path)
    if key in _checked:
        return
    if not path.exists():
        return
    problem = _header_problem(path)
    if problem:
        time.sleep(0.2)
        problem = _header_problem(path)
    if problem:
        raise ConfigError(f"{path}: the {what} is unusable: {problem}; it was left untouched "
                          "(restore it, or move it aside to start afresh)")
    _checked.add(key)


def check_folder_writable(folder: Path, what: str) -> None:
    """Refuse a folder (or, when it does not exist yet, its nearest existing parent) this
    process cannot write: read-only permissions or a read-only file system."""
    probe = Path(folder)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        reason = "read-only file system" if _read_only_fs(probe) else "permission denied"
        raise ConfigError(f"{probe}: the {what} is not writable ({reason}); bmad-loop keeps its "
                          "database, queue, worktrees and logs there")


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def sqlite_error_message(path: str, exc: BaseException, lock_wait_s: float) -> str | None:
    """One line for an error SQLite raised on `path`, or None when it is none of these."""
    reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
    lowered = reason.lower()
    if "locked" in lowered or "busy" in lowered:
        return (f"{path}: the state database is locked by another process (waited "
                f"{lock_wait_s:g} s, [database] lock_wait_s); try again once it is done")
    if "readonly" in lowered or "read-only" in lowered or "unable to open" in lowered:
        return f"{path}: cannot write the state database ({reason}); is its folder writable?"
    if "not a database" in lowered or "malformed" in lowered or "corrupt" in lowered:
        return (f"{path}: the state database is damaged ({reason}); restore it, or move it "
                "aside to start afresh")
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{exc.filename or path}: {exc.strerror}"
    return None
