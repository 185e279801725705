"""Opening a brand-new state database while another process has the file open.

A new SQLite file is in rollback mode, and switching it to WAL needs an exclusive lock that
SQLite takes without its busy handler: two consumers starting at once on a new database used to
get "database is locked" at once. The holder here is a real second process keeping a write
transaction (SQLite's reserved lock, as the other opener's own switch takes it) open on such a
file until it is told to end it: the case SQLite treats as a possible deadlock and refuses
without waiting.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from bmad_loop.db.database import Database
from bmad_loop.db.migrate import current_revision, head_revision
from bmad_loop.errors import ConfigError

HOLDER = textwrap.dedent("""
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")  # the reserved lock, kept until COMMIT
    conn.execute("SELECT * FROM notes").fetchall()
    print("holding", flush=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
    print("released", flush=True)
    sys.stdin.readline()
""")


@pytest.fixture
def rollback_file(tmp_path):
    """A database file as a first opener leaves it: not yet WAL."""
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (text TEXT)")
    conn.commit()
    conn.close()
    return path


@pytest.fixture
def holder(rollback_file):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(rollback_file)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    yield proc
    proc.kill()
    proc.wait(timeout=30)


def _journal_mode(path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()


def test_a_write_lock_on_a_new_file_is_waited_for_lock_wait_s_then_refused_in_one_line(
        rollback_file, holder):
    database = Database(f"sqlite:///{rollback_file}", lock_wait_s=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError) as refused:
            database.migrate()
    finally:
        database.dispose()
    waited = time.monotonic() - started
    message = str(refused.value)
    assert str(rollback_file) in message and "locked" in message and "\n" not in message
    # SQLite alone gives up at once here; the wait is what lets a second consumer start.
    assert waited >= 0.5, waited
    assert _journal_mode(rollback_file) == "delete"  # nothing was changed


def test_opening_goes_on_once_the_other_process_lets_go(rollback_file, holder):
    database = Database(f"sqlite:///{rollback_file}", lock_wait_s=30)
    outcome: list[object] = []
    opener = threading.Thread(target=lambda: outcome.append(_migrate(database)))
    opener.start()
    holder.stdin.write("go\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "released"
    opener.join(timeout=60)
    try:
        assert outcome == [None], outcome
        assert current_revision(database.engine) == head_revision()
    finally:
        database.dispose()
    assert _journal_mode(rollback_file) == "wal"


def _migrate(database: Database):
    try:
        database.migrate()
    except Exception as exc:  # reported to the test thread
        return exc
    return None
