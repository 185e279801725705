"""One contract suite, every back-end: the state and queue contracts on SQLite and on Redis + PostgreSQL.

Each test runs twice (`backend` is parametrized, see `tests/backends.py`): on the embedded
default (a SQLite state file and huey's SQLite queue in `tmp_path`) and on the scale-out pair
(a fresh PostgreSQL database and a private Redis queue prefix). The services run on loopback
on this machine; without them the second half skips locally and fails in CI.
"""

from __future__ import annotations

import collections
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from bmad_loop.db.migrate import current_revision, head_revision
from bmad_loop.db.models import Base, Run, Story
from bmad_loop.engine import leases
from bmad_loop.engine.transitions import transition_story
from bmad_loop.queue.queues import STORIES, BackgroundConsumer, make_huey
from backends import Backend
from support import (
    ALPHA_BETA_GAMMA,
    CONTRACT_TABLES,
    TTL,
    at,
    settled_status,
    wait_until,
    write_each,
)
from support import VIEWS as VIEW_NAMES

VIEWS = set(VIEW_NAMES)
THREADS = 8


@pytest.fixture
def db(backend: Backend):
    """A migrated state database on the back-end under test, disposed after the test."""
    database = backend.database()
    database.migrate()
    yield database
    database.dispose()


def _new_run_with_story(db, state: str = "queued") -> int:
    with db.transaction() as s:
        s.add(Run(id="20260101-000000-abcd", project="/nowhere", target_branch="main",
                  target_sha="0" * 40, state="running", merge_strategy="merge",
                  isolation="worktree", board_path="board.yaml"))
        s.flush()
        story = Story(run_id="20260101-000000-abcd", key="1-1-alpha", seq=1, epic="1",
                      state="pending")
        s.add(story)
        s.flush()
        story.state = state  # through the transition table, as the lane would
        return story.id


def _race(n: int, body) -> list:
    """Run body(i) on n threads released together by a barrier; their results in thread order."""
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list = []

    def run(i):
        try:
            barrier.wait(timeout=30)
            results[i] = body(i)
        except BaseException as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


# --- state: migrations ---------------------------------------------------------------------


def test_migrating_an_empty_database_reaches_head_with_every_table_and_view(backend):
    database = backend.database()
    try:
        assert current_revision(database.engine) is None
        database.migrate()
        inspector = sa.inspect(database.engine)
        assert CONTRACT_TABLES <= set(inspector.get_table_names())
        assert set(Base.metadata.tables) <= set(inspector.get_table_names())
        assert VIEWS <= set(inspector.get_view_names())
        assert current_revision(database.engine) == head_revision()
        database.migrate()  # again: a no-op
        with database.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM alembic_version")).scalar() == 1
    finally:
        database.dispose()


def test_the_migrated_schema_has_no_autogenerate_diff_against_the_models(db):
    with db.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True,
                                                         "render_as_batch": True})
        diff = compare_metadata(context, Base.metadata)
    assert diff == [], f"models and migrations drifted on {db.engine.dialect.name}: {diff}"


def test_every_view_answers_a_select_on_a_freshly_migrated_database(db):
    _new_run_with_story(db)
    with db.engine.connect() as conn:
        for view in sorted(VIEWS):
            conn.execute(sa.text(f"SELECT * FROM {view}")).fetchall()
        row = conn.execute(sa.text("SELECT story, state, sessions FROM v_story_runs")).one()
    assert tuple(row) == ("1-1-alpha", "queued", 0)


# A child process standing for one host: wait until every peer is up, then migrate.
_MIGRATE_CHILD = """
import sys, time
from pathlib import Path
from bmad_loop.db.database import Database
url, lock_dir, barrier, me, peers = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
(barrier / f"ready-{me}").write_text("ready")
deadline = time.monotonic() + 60
while len(list(barrier.glob("ready-*"))) < peers:
    if time.monotonic() > deadline:
        sys.exit("peer processes never started")
    time.sleep(0.005)
database = Database(url, lock_dir=lock_dir)
try:
    database.migrate()
finally:
    database.dispose()
"""


def test_two_processes_migrating_one_new_database_at_once_both_succeed(backend, tmp_path):
    """On PostgreSQL each process has its own lock folder, as consumers on two hosts would:
    only a lock held in the database itself can serialise them."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    lock_dirs = [tmp_path if backend.is_sqlite else tmp_path / f"host{n}" for n in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", _MIGRATE_CHILD, backend.database_url,
                               str(lock_dirs[n]), str(barrier), str(n), "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for n in range(2)]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    database = backend.database()
    try:
        assert current_revision(database.engine) == head_revision()
        assert VIEWS <= set(sa.inspect(database.engine).get_view_names())
        with database.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM alembic_version")).scalar() == 1
    finally:
        database.dispose()


# --- state: guarded transitions ------------------------------------------------------------


def test_eight_threads_racing_one_guarded_transition_have_exactly_one_winner(db):
    story_id = _new_run_with_story(db, state="queued")
    for round_ in range(5):
        def claim(i):
            with db.transaction() as s:
                return transition_story(s, story_id, "queued", state="working",
                                        host=f"thread-{round_}-{i}")

        won = _race(THREADS, claim)
        assert won.count(True) == 1, f"round {round_}: {won}"
        with db.transaction() as s:
            story = s.get(Story, story_id)
            assert (story.state, story.host) == ("working", f"thread-{round_}-{won.index(True)}")
            story.state = "queued"  # back in line for the next round


# --- state: leases on a stepped clock ------------------------------------------------------

LANE = "lane:/some/project"
# Owners on other hosts: their pid cannot be probed here, so only expiry frees their lease.
ALICE = "host-a:101:lane"
BOB = "host-b:202:lane"


def test_leases_acquire_renew_take_over_and_fence_on_a_stepped_clock(db):
    assert leases.acquire(db, LANE, ALICE, TTL, now=at(0)) == 1
    assert leases.acquire(db, LANE, BOB, TTL, now=at(TTL - 0.001)) is None
    assert leases.renew(db, LANE, ALICE, 1, TTL, now=at(TTL - 1))  # heartbeat: expiry moves on
    assert leases.acquire(db, LANE, BOB, TTL, now=at(TTL + 0.5)) is None
    assert leases.holds(db, LANE, ALICE, 1, now=at(TTL + 0.5))
    # Alice stalls past her renewed TTL; Bob takes over with the next fencing token.
    assert leases.acquire(db, LANE, BOB, TTL, now=at(2 * TTL)) == 2
    assert not leases.renew(db, LANE, ALICE, 1, TTL, now=at(2 * TTL + 1))
    assert not leases.holds(db, LANE, ALICE, 1, now=at(2 * TTL + 1))
    assert leases.holds(db, LANE, BOB, 2, now=at(2 * TTL + 1))
    # Releasing is the holder's alone.
    leases.release(db, LANE, ALICE)
    assert leases.holds(db, LANE, BOB, 2, now=at(2 * TTL + 1))
    leases.release(db, LANE, BOB)
    assert leases.acquire(db, LANE, ALICE, TTL, now=at(2 * TTL + 2)) == 1


def test_eight_hosts_acquiring_a_free_lease_at_once_get_exactly_one_token(db):
    owners = [f"host-{i}:{100 + i}:lane" for i in range(THREADS)]
    tokens = _race(THREADS, lambda i: leases.acquire(db, LANE, owners[i], TTL, now=at(0)))
    assert tokens.count(1) == 1 and tokens.count(None) == THREADS - 1, tokens
    winner = owners[tokens.index(1)]
    assert all(leases.holds(db, LANE, o, 1, now=at(1)) == (o == winner) for o in owners)


def test_eight_hosts_taking_over_an_expired_lease_at_once_get_exactly_one_new_token(db):
    assert leases.acquire(db, LANE, ALICE, TTL, now=at(0)) == 1
    owners = [f"host-{i}:{100 + i}:lane" for i in range(THREADS)]
    tokens = _race(THREADS, lambda i: leases.acquire(db, LANE, owners[i], TTL, now=at(TTL + 1)))
    assert tokens.count(2) == 1 and tokens.count(None) == THREADS - 1, tokens
    assert not leases.holds(db, LANE, ALICE, 1, now=at(TTL + 1))


# --- queue ---------------------------------------------------------------------------------


def test_every_message_enqueued_is_consumed_exactly_once_by_a_real_consumer(backend):
    huey = make_huey(backend.queue_config(), STORIES)
    seen: collections.Counter = collections.Counter()
    lock = threading.Lock()

    @huey.task(name="bmad_loop.test_contract_echo")
    def echo(n: int) -> None:
        with lock:
            seen[n] += 1

    messages = 40
    for n in range(messages):
        echo(n)
    assert huey.pending_count() == messages
    consumer = BackgroundConsumer(huey, workers=4)
    consumer.start()
    try:
        wait_until(lambda: sum(seen.values()) >= messages, timeout=30, what="every message consumed")
        time.sleep(0.3)  # a message delivered twice would show up now
    finally:
        consumer.stop(graceful=True)
    assert seen == collections.Counter(range(messages))
    assert huey.pending_count() == 0


def test_a_duplicate_story_message_is_a_no_op_thanks_to_the_claim(backend, db):
    """Five copies of one wake-up, four consumer threads: the guarded claim lets one through."""
    story_id = _new_run_with_story(db, state="queued")
    huey = make_huey(backend.queue_config(), STORIES)
    outcomes: list[tuple[str, bool]] = []
    lock = threading.Lock()

    @huey.task(name="bmad_loop.test_contract_claim")
    def claim(sid: int) -> None:
        me = threading.current_thread().name
        with db.transaction() as s:  # the same claim engine.worker.work makes
            won = transition_story(s, sid, "queued", state="working", host=me)
        with lock:
            outcomes.append((me, won))

    copies = 5
    for _ in range(copies):
        claim(story_id)
    consumer = BackgroundConsumer(huey, workers=4)
    consumer.start()
    try:
        wait_until(lambda: len(outcomes) >= copies, timeout=30, what="every copy delivered")
    finally:
        consumer.stop(graceful=True)
    assert len(outcomes) == copies
    winners = [me for me, won in outcomes if won]
    assert len(winners) == 1, outcomes
    with db.transaction() as s:
        story = s.get(Story, story_id)
        assert (story.state, story.host) == ("working", winners[0])


def test_projects_on_one_redis_server_get_queue_names_of_their_own(tmp_path):
    from bmad_loop.engine.project import Project
    from bmad_loop.policy import policy_from_dict
    from bmad_loop.queue.tasks import queue_config

    redis_policy = policy_from_dict({"queue": {"backend": "redis", "url": "redis://127.0.0.1:6379/0"}})
    one = queue_config(Project(tmp_path / "one", redis_policy))
    two = queue_config(Project(tmp_path / "two", redis_policy))
    again = queue_config(Project(tmp_path / "one", redis_policy))
    assert one.prefix != two.prefix and one.prefix == again.prefix
    assert one.prefix.startswith("bmad-loop-")
    # SQLite queues live in the project's own file and keep their plain names.
    assert queue_config(Project(tmp_path / "one", policy_from_dict({}))).prefix == "bmad-loop"


def test_every_queue_backend_kind_the_policy_takes_has_one_back_end_of_that_kind():
    from bmad_loop.policy.choices import QueueBackendKind
    from bmad_loop.queue.backends import BACKENDS, backend_of

    assert set(BACKENDS) == set(QueueBackendKind)
    for kind in QueueBackendKind:
        assert backend_of(kind.value) is BACKENDS[kind] and BACKENDS[kind].kind is kind


# --- end to end ----------------------------------------------------------------------------

THREE = ALPHA_BETA_GAMMA
SCRIPT = write_each(THREE)
POLICY = '[scm]\nmax_parallel = {n}\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n'


def test_a_three_story_run_with_two_workers_ends_with_the_sequential_target_trees(backend, make_repo):
    reference = make_repo(THREE, script=SCRIPT, policy=POLICY.format(n=1), name="reference")
    result = reference.cli("run")
    assert result.exit_code == 0, result.output
    expected = [c["tree"] for c in reference.first_parent_trees()]

    repo = make_repo(THREE, script=SCRIPT, policy=POLICY.format(n=2) + backend.policy_toml(),
                     name="repo")
    backend.adopt_project(repo.root)
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert [c["tree"] for c in repo.first_parent_trees()] == expected
    status = repo.status()
    assert status["run"]["state"] == "completed" and status["run"]["max_parallel"] == 2
    assert [s["state"] for s in status["stories"]] == ["integrated"] * 3
    assert {s["host"] for s in status["stories"]} == {socket.gethostname()}
    # Each story's agent ran its dev phase once: no message was acted on twice.
    dev_calls = collections.Counter(c["key"] for c in repo.calls() if c["phase"] == "dev")
    assert dev_calls == {s.key: 1 for s in THREE}
    kinds = [e["kind"] for e in repo.journal()]
    assert kinds[0] == "run.created" and kinds[-1] == "run.completed"
    assert kinds.count("target.advanced") == 3

    sql = repo.cli("sql", "SELECT story, state, dev_sessions FROM v_story_runs ORDER BY seq", "--json")
    assert sql.exit_code == 0, sql.output
    assert json.loads(sql.output) == [{"story": s.key, "state": "integrated", "dev_sessions": 1}
                                      for s in THREE]
    if backend.is_sqlite:
        assert (repo.root / ".bmad-loop" / "state.db").exists()
    else:  # the rows are in PostgreSQL and the queues in Redis, nothing in local files
        assert not (repo.root / ".bmad-loop" / "state.db").exists()
        assert not (repo.root / ".bmad-loop" / "queue.db").exists()
        engine = sa.create_engine(backend.database_url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT count(*) FROM stories WHERE state = 'integrated'")
                                    ).scalar() == 3
                for view in sorted(VIEWS):
                    conn.execute(sa.text(f"SELECT * FROM {view}")).fetchall()
        finally:
            engine.dispose()


def test_late_duplicate_wake_ups_after_a_run_change_nothing(backend, make_repo):
    """Every story message and a lane tick sent again once the run completed: all no-ops."""
    from bmad_loop.engine.run.consumers import ConsumerSet
    from bmad_loop.engine.project import Project

    repo = make_repo(THREE, script=SCRIPT, policy=POLICY.format(n=2) + backend.policy_toml())
    backend.adopt_project(repo.root)
    assert repo.cli("run").exit_code == 0
    before = (repo.git("rev-parse", "main"), len(repo.journal()), len(repo.calls()))

    project = Project.open(repo.root)
    consumers = ConsumerSet(project, queue="all", workers=2)
    run_id = repo.status()["run"]["id"]
    with project.db.transaction() as s:
        story_ids = [story.id for story in s.scalars(sa.select(Story).where(Story.run_id == run_id))]
    for story_id in story_ids * 2:
        consumers.tasks.enqueue_story(run_id, story_id)
    consumers.tasks.enqueue_lane(run_id)
    consumers.start()
    try:
        wait_until(lambda: consumers.tasks.stories.pending_count() == 0
                   and consumers.tasks.lane_pending() == 0, timeout=30, what="queues drained")
        time.sleep(0.5)  # let the tasks in hand finish
    finally:
        consumers.stop(graceful=True)
        project.close()
    assert (repo.git("rev-parse", "main"), len(repo.journal()), len(repo.calls())) == before


def test_a_lane_process_and_two_worker_processes_configured_by_environment_finish_a_run(
        backend, make_repo, monkeypatch):
    """The docker-compose topology on one machine: `lane` and two `worker` replicas as separate
    processes sharing one checkout, the back-ends given only as BMAD_LOOP_* variables."""
    for name, value in backend.environment().items():
        monkeypatch.setenv(name, value)
    repo = make_repo(THREE, script=SCRIPT, policy=POLICY.format(n=2))
    backend.adopt_project(repo.root)
    result = repo.cli("run", "--enqueue-only")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip().splitlines()[-1]
    lane = repo.spawn("worker", "--queue", "integration", log_name="lane")
    workers = [repo.spawn("worker", "--queue", "stories", "-w", "2", log_name=f"worker{n}")
               for n in range(2)]
    settled = settled_status(repo, run_id, timeout=120)
    for proc in (lane, *workers):
        proc.send_signal(signal.SIGTERM)  # what `docker compose stop` sends
    codes = [proc.wait(timeout=30) for proc in (lane, *workers)]
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                     for p in sorted(repo.root.parent.glob(f"{repo.root.name}-*.log")))
    assert settled["run"]["state"] == "completed", (
        [(s["key"], s["state"], s["reason"]) for s in settled["stories"]], logs)
    assert codes == [0, 0, 0], logs
    assert [s["state"] for s in repo.status(run_id)["stories"]] == ["integrated"] * 3
    dev_calls = collections.Counter(c["key"] for c in repo.calls() if c["phase"] == "dev")
    assert dev_calls == {s.key: 1 for s in THREE}
    if not backend.is_sqlite:
        assert not (repo.root / ".bmad-loop" / "state.db").exists()
