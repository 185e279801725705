"""`Database.read`: a read-only transaction that takes no write lock on SQLite.

The writer in these tests is a real second process holding `BEGIN IMMEDIATE` on the same file
until it is told to commit (a line on its stdin), so the read is proven not to wait for it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from sqlalchemy import func, select

from bmad_loop.db.models import Lease, utcnow

WRITER = textwrap.dedent("""
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO leases (name, owner, host, token, acquired_at, renewed_at, expires_at)"
                 " VALUES ('held', 'other', 'h', 1, '2026-01-01', '2026-01-01', '2026-01-01')")
    print("holding", flush=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
    print("committed", flush=True)
""")


def _leases(session) -> int:
    return session.scalar(select(func.count()).select_from(Lease))


def test_a_read_neither_waits_for_a_writer_in_another_process_nor_sees_its_uncommitted_rows(db):
    writer = subprocess.Popen([sys.executable, "-c", WRITER, db.path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "holding"
        with db.read() as s:  # would wait lock_wait_s and fail if it asked for the write lock
            assert _leases(s) == 0
        with pytest.raises(Exception, match="locked"):
            with db.transaction() as s:  # a write transaction does wait, and gives up
                _leases(s)
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "committed"
        with db.read() as s:
            assert _leases(s) == 1  # the next read sees the commit
    finally:
        writer.kill()
        writer.wait(timeout=30)


def test_a_write_in_a_read_is_refused_and_nothing_is_written(db):
    now = utcnow()
    with pytest.raises(RuntimeError, match="read-only"):
        with db.read() as s:
            s.add(Lease(name="x", owner="me", host="h", token=1, acquired_at=now,
                        renewed_at=now, expires_at=now))
    with db.read() as s:
        assert _leases(s) == 0
    with db.transaction() as s:  # the same write in a transaction goes through
        s.add(Lease(name="x", owner="me", host="h", token=1, acquired_at=now,
                    renewed_at=now, expires_at=now))
    with db.read() as s:
        assert _leases(s) == 1
