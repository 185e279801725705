"""Small file helpers shared across bmad-loop."""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

__all__ = ["shown", "write_atomic", "LinkRefused", "folder_beneath", "read_beneath",
           "write_beneath", "unlink_beneath"]

# A lone surrogate: how Python holds a byte of a file name that is not UTF-8 (`surrogateescape`).
_SURROGATE = re.compile("[\ud800-\udfff]")


def shown(text: str) -> str:
    """`text` fit to print or to store as text: each byte of a name that is not UTF-8 (held as
    a surrogate) written `\\xff`, any other lone surrogate `\\udXXX`. Anything else is kept as is.
    git accepts any bytes in a name; JSON keeps them exactly (`\\udcff`), text shows them so."""
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(lambda m: (f"\\x{ord(m[0]) - 0xDC00:02x}" if 0xDC80 <= ord(m[0]) <= 0xDCFF
                                     else f"\\u{ord(m[0]):04x}"), text)


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` so readers see the old file or the new one, never half of it.

    The file's mode follows the umask, as a plain `open` would (a report is an artifact CI
    publishes; `mkstemp` would make every file 0600 whatever the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# -- beneath a folder bmad-loop trusts, never through a link it did not make ------------------
# A worktree, a scratch folder: the folder itself is bmad-loop's (its parents are hidden from
# every box), but an agent writes what is inside. Each step below it is opened with
# O_NOFOLLOW, so a symlink planted anywhere on the way (a folder or the file) is refused,
# not followed, even one swapped in between a check and the use.

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class LinkRefused(OSError):
    """A path beneath a trusted folder that is a symlink, or not what it should be."""


def folder_beneath(root: Path, parts: list[str] | tuple[str, ...], *, create: bool = False,
                   own: bool = False) -> int:
    """A descriptor of the folder `root`/`parts`..., reached without following any link below
    `root`. `create`: missing folders are made. `own`: the folders are bmad-loop's own names (the
    session folder): a link or a file standing there is removed and a folder made instead."""
    fd = os.open(root, os.O_RDONLY | _DIRECTORY)
    try:
        for part in parts:
            fd = _step_into(fd, part, create, own)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _step_into(fd: int, part: str, create: bool, own: bool) -> int:
    if part in ("", ".", "..") or "/" in part:
        raise LinkRefused(f"{part!r} is not a folder name")
    for _ in range(2):
        try:
            child = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            _mkdir_at(fd, part)
            continue
        except OSError as exc:  # ELOOP (a link) or ENOTDIR (a file)
            if not own:
                raise LinkRefused(f"{part}: a symlink or not a folder, refused") from exc
            os.unlink(part, dir_fd=fd)  # unlink never follows the link it removes
            _mkdir_at(fd, part)
            continue
        os.close(fd)
        return child
    raise LinkRefused(f"{part}: replaced while bmad-loop made it, refused")


def _mkdir_at(fd: int, part: str) -> None:
    try:
        os.mkdir(part, 0o777, dir_fd=fd)
    except FileExistsError:
        pass  # made meanwhile: the next open checks what it is


def read_beneath(root: Path, rel: str, limit: int | None = None) -> bytes | None:
    """The bytes of the regular file `root`/`rel` (None: missing), read without following a
    link anywhere below `root` (LinkRefused: a link, a FIFO, a device). `limit`: read at most
    that many bytes plus one (the caller tells a file that is too large)."""
    *folders, name = Path(rel).parts
    try:
        parent = folder_beneath(root, folders)
    except FileNotFoundError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LinkRefused(f"{rel}: a symlink, refused") from exc
    finally:
        os.close(parent)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise LinkRefused(f"{rel}: not a regular file, refused")
        return handle.read() if limit is None else handle.read(limit + 1)


def write_beneath(root: Path, rel: str, data: bytes, *, own: bool = False) -> Path:
    """Write `data` to `root`/`rel` atomically, its folders made as needed, through no link
    below `root` (a link at the file itself is replaced, never written through). `own`: the
    folders are bmad-loop's own (see `folder_beneath`)."""
    *folders, name = Path(rel).parts
    parent = folder_beneath(root, folders, create=True, own=own)
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            raise
    finally:
        os.close(parent)
    return Path(root) / rel


def unlink_beneath(root: Path, rel: str) -> None:
    """Remove `root`/`rel` if it is there, reached through no link below `root`."""
    *folders, name = Path(rel).parts
    try:
        parent = folder_beneath(root, folders)
    except (FileNotFoundError, LinkRefused):
        return  # nothing of ours there
    try:
        os.unlink(name, dir_fd=parent)
    except FileNotFoundError:
        pass
    finally:
        os.close(parent)
