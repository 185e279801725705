"""The wake folder in the temporary directory has a predictable name; one planted there by
someone else (open to all, another user's, a symlink) is never used: the sockets go to a private
folder instead (or the consumers poll), and bmad-loop says so once.

The shared temporary directory is a real sticky, world-writable folder made for the test, the
queue a real SQLite path too long for its sockets to sit beside it, the listener a real process.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from bmad_loop.queue import wakeup
from bmad_loop.queue.queues import STORIES, QueueConfig, make_huey
from bmad_loop.queue.wakeup import WakeChannel, supported, wake_dir_for
from support import wait_until

pytestmark = pytest.mark.skipif(not supported(), reason="no AF_UNIX datagram sockets here")

LISTENER = textwrap.dedent("""
    import signal, sys
    from pathlib import Path
    from bmad_loop.queue.wakeup import WakeChannel

    folder, out = sys.argv[1], Path(sys.argv[2])
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    listener = WakeChannel(Path(folder), "stories").listen(
        lambda: open(out, "a").write("ring\\n"))
    Path(str(out) + ".ready").write_text(str(listener.path))
    while not stopping:
        signal.pause()
    listener.close()
""")


@pytest.fixture
def places(monkeypatch):
    """A shared temporary directory (mode 1777, like /tmp), a short HOME, no runtime folder,
    and a queue path too long for `wake/` beside it."""
    base = Path(tempfile.mkdtemp(prefix="bw-"))
    shared = base / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    home = base / "h"
    home.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(wakeup, "_warned", set(), raising=False)
    deep = base / ("p" * 90)
    deep.mkdir()
    db = deep / "queue.db"
    planted = shared / Path(str(wake_dir_for(db))).name  # the predictable name, unplanted
    yield db, planted, home
    shutil.rmtree(base, ignore_errors=True)


def plant(planted: Path, how: str, home: Path) -> None:
    if how == "open-to-all":
        planted.mkdir()
        planted.chmod(0o777)
    elif how == "symlink":  # to a folder of ours: a check that follows links would accept it
        target = home / "mine"
        target.mkdir(mode=0o700)
        planted.symlink_to(target)
    elif how == "another-user":
        if os.geteuid() != 0:
            pytest.skip("making a folder of another user needs root")
        planted.mkdir(mode=0o700)
        os.chown(planted, 65534, 65534)


def listing(path: Path) -> list[str]:
    return sorted(os.listdir(path)) if path.is_dir() else []


@pytest.mark.parametrize("how", ["open-to-all", "symlink", "another-user"])
def test_a_planted_wake_folder_is_passed_over_for_a_private_one_and_wake_ups_still_work(
        places, how, caplog, tmp_path):
    db, planted, home = places
    plant(planted, how, home)
    caplog.set_level(logging.WARNING, logger="bmad_loop.queue.wakeup")

    folder = wake_dir_for(db)
    assert folder is not None and folder != planted
    assert folder.parent == home / ".cache"
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and str(planted) in warnings[0] and str(folder) in warnings[0]
    assert wake_dir_for(db) == folder and len(caplog.records) == 1  # said once

    # A real listener in another process binds there; a ring from here reaches it.
    script = tmp_path / "listener.py"
    script.write_text(LISTENER)
    out = tmp_path / "rings"
    proc = subprocess.Popen([sys.executable, str(script), str(folder), str(out)])
    try:
        wait_until(lambda: Path(f"{out}.ready").exists(), what="the listener bound its socket")
        info = os.lstat(folder)
        assert info.st_uid == os.geteuid() and (info.st_mode & 0o077) == 0 and folder.is_dir()
        assert WakeChannel(folder, STORIES).ring() == 1
        wait_until(lambda: out.exists() and out.read_text() == "ring\n", what="the ring arrived")
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    assert listing(planted) == [] and listing(home / "mine") == []  # nothing ever went there


def test_a_socket_planted_in_an_open_folder_is_sent_nothing_and_nothing_binds_there(places):
    db, planted, home = places
    plant(planted, "open-to-all", home)
    spy = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    spy.bind(str(planted / f"{STORIES}-1-abcd.sock"))  # someone else's ear
    spy.setblocking(False)
    try:
        channel = WakeChannel(planted, STORIES)
        assert channel.ring() == 0
        with pytest.raises(BlockingIOError):
            spy.recv(64)
        assert channel.listen(lambda: None) is None  # polls instead of binding in it
        assert listing(planted) == [f"{STORIES}-1-abcd.sock"]
    finally:
        spy.close()


def test_with_no_private_folder_that_fits_the_queue_polls_and_says_so_once(places, monkeypatch, caplog):
    db, planted, home = places
    plant(planted, "open-to-all", home)
    long_home = home / ("h" * 80)
    long_home.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(long_home))  # ~/.cache/… too long for a socket path
    caplog.set_level(logging.WARNING, logger="bmad_loop.queue.wakeup")
    huey = make_huey(QueueConfig(backend="sqlite", sqlite_path=db), STORIES)
    make_huey(QueueConfig(backend="sqlite", sqlite_path=db), "integration")
    assert huey.wake is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "poll" in messages[0] and str(planted) in messages[0]
    assert listing(planted) == []


def test_the_folder_is_used_as_before_when_it_is_this_users_alone(places):
    db, planted, home = places
    planted.mkdir(mode=0o700)
    assert wake_dir_for(db) == planted
