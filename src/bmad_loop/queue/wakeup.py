"""Cross-process wake-ups for the SQLite queue: UNIX-domain datagram sockets in one folder.

huey's SQLite storage cannot block, so a consumer in another process would only find a message
at its next poll. Instead, every process that consumes a queue binds a datagram socket named
`<queue>-<pid>-<token>.sock` in the queue's wake folder, and every enqueue sends one byte to
each socket of that queue but its own process's (those threads are woken in memory). The
receiving thread rings the process's `queue.Doorbell`, which the idle workers wait on.

Why sockets and not a FIFO: a datagram to a socket nobody has bound fails at once with
"connection refused", so a file left behind by a killed process is recognised and removed by
the next sender, and no reader can be left holding a stale FIFO open. Why no inotify/kqueue:
neither exists on both Linux and macOS. Where AF_UNIX datagrams do not exist (Windows) the
channel is simply off and consumers keep their bounded poll; a wake-up is an optimisation, the
queue is the truth.

A wake folder is used only when this user owns it, it is a real folder (not a symlink) and no
one else may write in it: the fallback folder in the temporary directory has a predictable name,
so another user could make it first and receive, drop or forge the wake-ups. Such a folder is
never touched; the sockets go to a private folder in `XDG_RUNTIME_DIR` or `~/.cache` instead,
or, with neither usable, the consumers keep their poll. The warning is logged once per process.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
import stat
import tempfile
import threading
from pathlib import Path
from typing import Callable

__all__ = ["WakeChannel", "Listener", "wake_dir_for", "untrusted"]

log = logging.getLogger(__name__)

# sun_path holds 104 bytes on macOS (108 on Linux), its terminating NUL included.
_SUN_PATH_MAX = 103
_NAME_ROOM = 40  # "integration-<pid>-<token>.sock" and some to spare
_STOP = b"stop"
_RING = b"r"


def wake_dir_for(queue_db: Path) -> Path | None:
    """Where the sockets of the queue in `queue_db` live: `wake/` beside it when the socket
    paths fit in sun_path, else a folder in the temporary directory named after the queue's
    absolute path (so every process of the project picks the same one). A folder there that
    is not this user's alone is passed over for one in `XDG_RUNTIME_DIR` or `~/.cache`; None
    when none fits (no wake-ups: the consumers poll)."""
    beside = Path(queue_db).resolve().parent / "wake"
    if _fits(beside):
        return beside
    digest = hashlib.sha1(os.fsencode(str(Path(queue_db).resolve()))).hexdigest()[:12]
    shared = Path(tempfile.gettempdir()) / f"bmad-loop-wake-{digest}"
    refusal = untrusted(shared)
    if refusal is None:
        return shared
    for parent in _private_parents():
        folder = parent / f"bmad-loop-wake-{digest}"
        if _fits(folder) and untrusted(folder) is None:
            _warn_once(shared, f"{shared} {refusal}: wake sockets go to {folder} instead")
            return folder
    _warn_once(shared, f"{shared} {refusal}: no private folder fits, consumers poll instead")
    return None


def untrusted(folder: Path) -> str | None:
    """Why `folder` may not hold wake sockets (another user's, writable by others, a symlink,
    not a folder), or None when it is fine or does not exist yet (it is made private)."""
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        return f"belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _fits(folder: Path) -> bool:
    return len(os.fsencode(str(folder))) + 1 + _NAME_ROOM <= _SUN_PATH_MAX


def _private_parents() -> list[Path]:
    """Folders only this user writes in, for wake folders: the runtime folder, then ~/.cache
    (made private if absent)."""
    found = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and untrusted(Path(runtime)) is None:
        found.append(Path(runtime))
    cache = Path.home() / ".cache"
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return found
    if untrusted(cache) is None:
        found.append(cache)
    return found


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(folder: Path, message: str) -> None:
    with _warned_lock:
        if str(folder) in _warned:
            return
        _warned.add(str(folder))
    log.warning("wake-ups: %s", message)


def supported() -> bool:
    return hasattr(socket, "AF_UNIX") and os.name == "posix"


class WakeChannel:
    """One queue's wake-ups in one folder: `ring()` after an enqueue, `listen()` to be woken."""

    def __init__(self, folder: Path, queue: str):
        self.folder = Path(folder)
        self.queue = queue
        self._sender: socket.socket | None = None
        self._lock = threading.Lock()

    def _own_prefix(self) -> str:
        return f"{self.queue}-{os.getpid()}-"

    def ring(self) -> int:
        """Wake every other process listening on this queue; returns how many were sent a ring.
        A socket file nobody has bound any more (its process was killed) is removed."""
        if not supported() or untrusted(self.folder) is not None:
            return 0  # not this user's alone: nothing is sent into it
        try:
            entries = [e for e in os.scandir(self.folder)
                       if e.name.startswith(self.queue + "-") and e.name.endswith(".sock")
                       and not e.name.startswith(self._own_prefix())]
        except OSError:
            return 0  # no folder yet: nobody listens
        sent = stale = 0
        for entry in entries:
            try:
                self._send(entry.path, _RING)
                sent += 1
            except (ConnectionRefusedError, FileNotFoundError):
                _unlink(entry.path)  # stale: its process died without removing it
                stale += 1
            except OSError:
                pass  # a full buffer already holds wake-ups for it; anything else: it polls
        if stale and not sent:
            _remove_if_empty(self.folder)
        return sent

    def _send(self, path: str, data: bytes) -> None:
        with self._lock:
            if self._sender is None:
                self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sender.setblocking(False)
            self._sender.sendto(data, path)

    def listen(self, on_ring: Callable[[], None]) -> "Listener | None":
        """Bind this process's socket for the queue and call `on_ring` on each wake-up, from a
        thread of its own. None when the platform or the folder cannot have one (the caller
        keeps polling)."""
        if not supported():
            return None
        path = self.folder / f"{self._own_prefix()}{secrets.token_hex(4)}.sock"
        for last in (False, True):  # twice: the last listener of another process may remove
            try:                    # the folder between our mkdir and our bind
                self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                refusal = untrusted(self.folder)  # made by someone else since it was chosen
                if refusal is not None:
                    _warn_once(self.folder, f"{self.folder} {refusal}: consumers poll instead")
                    return None
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                try:
                    sock.bind(str(path))
                except OSError:
                    sock.close()
                    raise
                return Listener(sock, path, on_ring)
            except FileNotFoundError:
                if last:
                    break
            except OSError as exc:
                log.info("no cross-process wake-ups for queue %s (%s): polling", self.queue, exc)
                return None
        return None


class Listener:
    """A bound socket and the thread reading it; `close()` removes the socket file."""

    def __init__(self, sock: socket.socket, path: Path, on_ring: Callable[[], None]):
        self.path = path
        self._sock = sock
        self._on_ring = on_ring
        self._closing = False
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"bmad-wake-{path.name}")
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                data = self._sock.recv(64)
            except OSError:
                return
            if data == _STOP and self._closing:
                return
            try:
                self._on_ring()
            except Exception:  # a failing callback must not end the wake-ups
                log.exception("wake-up callback failed")

    def close(self) -> None:
        """Stop the thread (a datagram to itself ends its blocking read), then remove the file."""
        if self._closing:
            return
        self._closing = True
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
                out.sendto(_STOP, str(self.path))
        except OSError:
            pass
        self._thread.join(timeout=5)
        _unlink(self.path)
        self._sock.close()
        _remove_if_empty(self.path.parent)  # the last one out leaves no folder


def _remove_if_empty(folder: Path) -> None:
    """rmdir refuses a folder that is not empty, so another process's socket is never lost; a
    listener binding just then retries (see `listen`)."""
    try:
        folder.rmdir()
    except OSError:
        pass


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
