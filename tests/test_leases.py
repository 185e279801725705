"""Leases with fencing tokens (engine/leases.py), decided on an explicit, stepped clock.

Every call takes `now` from the test, so expiry is reached by stepping a clock, never by
sleeping. The database is a real, migrated SQLite file per test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from bmad_loop.db.database import Database
from bmad_loop.engine import leases
from support import TTL, at

NAME = "lane:/some/project"
# Owners on another host: their pid cannot be checked here, so only expiry frees their lease.
ALICE = "elsewhere-a:101:lane"
BOB = "elsewhere-b:202:lane"


def lease_row(db, name=NAME):
    from bmad_loop.db.models import Lease

    with db.transaction() as s:
        row = s.get(Lease, name)
        return None if row is None else (row.owner, row.token, row.expires_at)


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_first_acquire_creates_the_lease_with_token_1_and_an_expiry_ttl_ahead(db):
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(0)) == 1
    assert lease_row(db) == (ALICE, 1, at(TTL))
    assert leases.holds(db, NAME, ALICE, 1, now=at(0))


def test_a_second_owner_is_refused_while_the_lease_is_unexpired(db):
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(0)) == 1
    for seconds in (0, 1, TTL - 0.001):
        assert leases.acquire(db, NAME, BOB, TTL, now=at(seconds)) is None
    assert lease_row(db) == (ALICE, 1, at(TTL))
    assert not leases.holds(db, NAME, BOB, 1, now=at(1))


def test_acquiring_again_as_the_holder_renews_and_keeps_the_token(db):
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(0)) == 1
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(7)) == 1
    assert lease_row(db) == (ALICE, 1, at(7 + TTL))


def test_renewing_extends_the_expiry_so_a_second_owner_stays_refused_past_the_first_ttl(db):
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(0)) == 1
    assert leases.renew(db, NAME, ALICE, 1, TTL, now=at(TTL - 1))
    assert leases.acquire(db, NAME, BOB, TTL, now=at(TTL + 0.5)) is None
    assert leases.holds(db, NAME, ALICE, 1, now=at(TTL + 0.5))


def test_after_expiry_a_second_owner_takes_over_with_the_token_incremented(db):
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(0)) == 1
    assert leases.acquire(db, NAME, BOB, TTL, now=at(TTL)) == 2  # expires_at <= now: expired
    assert lease_row(db) == (BOB, 2, at(2 * TTL))
    assert leases.holds(db, NAME, BOB, 2, now=at(TTL + 1))


def test_the_old_holder_is_fenced_after_a_takeover_its_renew_and_holds_fail(db):
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(0)) == 1
    assert leases.acquire(db, NAME, BOB, TTL, now=at(TTL + 1)) == 2
    # Alice stalled past her TTL and wakes up: every fenced operation refuses her.
    assert not leases.renew(db, NAME, ALICE, 1, TTL, now=at(TTL + 2))
    assert not leases.holds(db, NAME, ALICE, 1, now=at(TTL + 2))
    # Her failed renewal did not disturb the new holder.
    assert lease_row(db) == (BOB, 2, at(2 * TTL + 1))
    assert leases.holds(db, NAME, BOB, 2, now=at(TTL + 2))


def test_a_stale_token_of_the_same_owner_is_fenced_too(db):
    """An owner that lost its lease and re-acquired it holds a new token; the old one is dead."""
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(0)) == 1
    assert leases.acquire(db, NAME, BOB, TTL, now=at(TTL + 1)) == 2
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(3 * TTL)) == 3
    assert not leases.holds(db, NAME, ALICE, 1, now=at(3 * TTL))
    assert not leases.renew(db, NAME, ALICE, 1, TTL, now=at(3 * TTL))
    assert leases.holds(db, NAME, ALICE, 3, now=at(3 * TTL))


def test_holds_is_false_once_the_lease_expired_even_without_a_takeover(db):
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(0)) == 1
    assert leases.holds(db, NAME, ALICE, 1, now=at(TTL - 0.001))
    assert not leases.holds(db, NAME, ALICE, 1, now=at(TTL))


def test_release_by_another_owner_is_a_no_op_and_by_the_holder_frees_the_lease(db):
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(0)) == 1
    leases.release(db, NAME, BOB)
    assert lease_row(db) == (ALICE, 1, at(TTL))
    leases.release(db, NAME, ALICE)
    assert lease_row(db) is None
    assert leases.acquire(db, NAME, BOB, TTL, now=at(1)) == 1


def test_an_owner_whose_pid_is_dead_on_this_host_is_taken_over_at_once(db):
    dead = f"{socket.gethostname()}:{dead_pid()}:lane"
    assert leases.pid_alive(dead) is False
    assert leases.acquire(db, NAME, dead, TTL, now=at(0)) == 1
    # Long before expiry: the owner is provably gone, so waiting for the TTL would be waste.
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(1)) == 2
    assert lease_row(db) == (ALICE, 2, at(1 + TTL))


def test_an_owner_whose_pid_is_alive_on_this_host_is_not_taken_over_before_expiry(db):
    alive = f"{socket.gethostname()}:{os.getpid()}:lane"
    assert leases.pid_alive(alive) is True
    assert leases.acquire(db, NAME, alive, TTL, now=at(0)) == 1
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(TTL - 1)) is None
    assert leases.acquire(db, NAME, ALICE, TTL, now=at(TTL)) == 2


def test_pid_alive_cannot_judge_another_hosts_owner():
    assert leases.pid_alive("some-other-host:1") is None
    assert leases.pid_alive("") is None
    assert leases.pid_alive(None) is None


def test_owner_id_is_host_colon_pid_with_an_optional_tag():
    assert leases.owner_id() == f"{socket.gethostname()}:{os.getpid()}"
    assert leases.owner_id("lane") == f"{socket.gethostname()}:{os.getpid()}:lane"


def test_two_lease_holders_on_a_stepped_clock_hand_over_and_report_the_loss(db):
    now = [at(0)]
    events = []
    first = leases.LeaseHolder(db, NAME, ALICE, TTL, clock=lambda: now[0],
                               on_acquired=lambda t: events.append(("alice+", t)),
                               on_lost=lambda: events.append(("alice-",)))
    second = leases.LeaseHolder(db, NAME, BOB, TTL, clock=lambda: now[0],
                                on_acquired=lambda t: events.append(("bob+", t)),
                                on_lost=lambda: events.append(("bob-",)))
    first.step()
    second.step()
    assert first.held and not second.held and first.token == 1
    assert first.still_holds() and not second.still_holds()

    now[0] = at(TTL / 3)  # a heartbeat: renewed
    first.step()
    second.step()
    assert first.still_holds() and not second.held

    # Alice stalls (no step) past her TTL; Bob takes over.
    now[0] = at(TTL / 3 + TTL)
    second.step()
    assert second.held and second.token == 2
    assert first.held and not first.still_holds()  # she does not know yet, but she is fenced
    first.step()  # her next beat finds out
    assert not first.held
    assert events == [("alice+", 1), ("bob+", 2), ("alice-",)]


def test_lease_holder_stop_releases_only_its_own_lease(db):
    now = [at(0)]
    holder = leases.LeaseHolder(db, NAME, ALICE, TTL, clock=lambda: now[0])
    holder.step()
    holder.stop(release_lease=True)
    assert lease_row(db) is None and not holder.held


def test_take_in_belongs_to_the_callers_transaction_and_takes_over_any_holder(db):
    """A story worker takes its lease in the transaction that claims the story: rolled back,
    no lease is left; committed, the token goes past whoever held it."""
    name = leases.story_lease_name(7)
    with pytest.raises(RuntimeError, match="claim lost"):
        with db.transaction() as s:
            assert leases.take_in(s, name, "h:1", TTL, at(0)) == 1
            raise RuntimeError("claim lost")  # the claim's transaction fails after the take
    assert not leases.holds(db, name, "h:1", 1, at(1))
    assert leases.acquire(db, name, "h:2", TTL, at(0)) == 1  # an unexpired holder …
    with db.transaction() as s:
        assert leases.take_in(s, name, "h:3", TTL, at(1)) == 2  # … is taken over all the same
    assert leases.holds(db, name, "h:3", 2, at(2))
    assert not leases.holds(db, name, "h:2", 1, at(2))


@pytest.mark.parametrize("kind", ["sqlite", "sqlite-before-3.35",
                                  pytest.param("postgres", marks=pytest.mark.scaleout)])
def test_take_in_keeps_the_token_of_its_own_owner_and_raises_it_for_another(kind, tmp_path, request):
    """The claim takes its lease in one statement (an upsert) on both databases, or as before
    (a SELECT, then an INSERT or UPDATE) where the SQLite library predates RETURNING (3.35):
    a new lease starts at token 1, the same owner taking it again keeps its token, any other
    owner gets the next one, and every take renews the expiry."""
    if kind.startswith("sqlite"):
        database = request.getfixturevalue("db")
        if kind == "sqlite-before-3.35":  # what SQLAlchemy concludes from such a library
            monkeypatch = request.getfixturevalue("monkeypatch")
            monkeypatch.setattr(database.engine.dialect, "insert_returning", False)
    else:
        database = Database(request.getfixturevalue("postgres_url"), lock_dir=tmp_path)
        database.migrate()
    name = leases.story_lease_name(9)
    try:
        with database.transaction() as s:
            assert leases.take_in(s, name, "h:1", TTL, at(0)) == 1
        with database.transaction() as s:
            assert leases.take_in(s, name, "h:1", TTL, at(5)) == 1
        with database.transaction() as s:
            assert leases.take_in(s, name, "h:2", TTL, at(6)) == 2
        with database.transaction() as s:
            assert leases.take_in(s, name, "h:3", TTL, at(7)) == 3
        assert leases.holds(database, name, "h:3", 3, at(7 + TTL - 1))
        assert not leases.holds(database, name, "h:3", 3, at(7 + TTL + 1))
        assert not leases.holds(database, name, "h:2", 2, at(8))
    finally:
        if kind == "postgres":
            database.dispose()
