"""The migrations themselves: empty -> head, re-run is a no-op, two runners at once, no drift.

Each test uses a brand-new SQLite file in tmp_path: the embedded default users get. The models
(`bmad_loop.db.models.Base.metadata`) are the schema's source of truth; the last test proves the
migrations build exactly that schema.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from bmad_loop.db.database import Database
from bmad_loop.db.migrate import current_revision, head_revision
from bmad_loop.db.models import Base
from support import CONTRACT_TABLES


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def _schema(path: Path) -> list[tuple]:
    """Every table, index and view with its SQL, as SQLite stores it."""
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master "
                            "ORDER BY type, name").fetchall()


def test_migrating_an_empty_database_to_head_creates_every_table(tmp_path):
    path = tmp_path / "state.db"
    db = Database(_url(path), lock_dir=tmp_path)
    try:
        assert current_revision(db.engine) is None
        db.migrate()
        tables = set(sa.inspect(db.engine).get_table_names())
        assert CONTRACT_TABLES <= tables
        assert set(Base.metadata.tables) <= tables
        assert current_revision(db.engine) == head_revision()
    finally:
        db.dispose()


def test_migrating_again_is_a_no_op_that_keeps_schema_and_rows(tmp_path):
    path = tmp_path / "state.db"
    db = Database(_url(path), lock_dir=tmp_path)
    try:
        db.migrate()
        with db.engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO events (run_id, ts, kind, data) "
                                 "VALUES ('r1', '2026-01-01 00:00:00', 'run.created', '{}')"))
        before = _schema(path)
        db.migrate()
        again = Database(_url(path), lock_dir=tmp_path)  # a later process, same file
        try:
            again.migrate()
        finally:
            again.dispose()
        assert _schema(path) == before
        assert current_revision(db.engine) == head_revision()
        with db.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT kind FROM events")).scalars().all() == ["run.created"]
            assert conn.execute(sa.text("SELECT count(*) FROM alembic_version")).scalar() == 1
    finally:
        db.dispose()


def _migrate_after_barrier(url: str, lock_dir: str, barrier_dir: str, me: int, peers: int) -> None:
    """Child process body: wait until every peer has started, then migrate the shared file."""
    barrier = Path(barrier_dir)
    (barrier / f"ready-{me}").write_text("ready")
    deadline = time.monotonic() + 60
    while len(list(barrier.glob("ready-*"))) < peers:
        if time.monotonic() > deadline:
            raise SystemExit(f"peer processes never started (barrier in {barrier})")
        time.sleep(0.005)
    db = Database(url, lock_dir=Path(lock_dir))
    try:
        db.migrate()
    finally:
        db.dispose()


def test_two_processes_migrating_the_same_new_database_at_once_both_succeed(tmp_path):
    path = tmp_path / "state.db"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_migrate_after_barrier,
                         args=(_url(path), str(tmp_path), str(barrier), n, 2)) for n in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0, 0]

    db = Database(_url(path), lock_dir=tmp_path)
    try:
        assert CONTRACT_TABLES <= set(sa.inspect(db.engine).get_table_names())
        assert current_revision(db.engine) == head_revision()
        with db.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM alembic_version")).scalar() == 1
    finally:
        db.dispose()


def test_the_migrated_schema_has_no_autogenerate_diff_against_the_models(tmp_path):
    db = Database(_url(tmp_path / "state.db"), lock_dir=tmp_path)
    try:
        db.migrate()
        with db.engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True,
                                                             "render_as_batch": True})
            diff = compare_metadata(context, Base.metadata)
        assert diff == [], f"models and migrations drifted: {diff}"
    finally:
        db.dispose()


# --- 0006: epic ids become strings, with the rows of a run made before it ---------------------

def _rows_at_0005(engine) -> None:
    from alembic import command

    from bmad_loop.db import migrate

    command.upgrade(migrate.alembic_config(engine), "0005")
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO runs (id, project, target_branch, target_sha, head_sha, state, "
            "max_parallel, merge_strategy, isolation, selection, policy, board_path, "
            "gates_passed, gate_epic, created_at) VALUES ('r1', '/p', 'main', 'a', 'a', "
            "'paused', 1, 'merge', 'worktree', '{}', '{}', 'b.yaml', '[1, 2]', 3, "
            "'2026-01-01 00:00:00')"))
        conn.execute(sa.text(
            "INSERT INTO stories (run_id, key, seq, epic, title, state, footprint, depends_on, "
            "merge_class, done_checkpoint, dev_attempts, review_cycles, feedback, approved, "
            "signed_off, claim, human_fix) VALUES ('r1', '12-1-x', 1, 12, 't', 'pending', '{}', "
            "'[]', 'self', false, 0, 0, '{}', false, false, 0, false)"))


def _check_after_0006(engine) -> None:
    with engine.connect() as conn:
        run = conn.execute(sa.text("SELECT gates_passed, gate_epic FROM runs")).one()
        story = conn.execute(sa.text("SELECT epic, to_create FROM stories")).one()
        view = conn.execute(sa.text("SELECT story, epic FROM v_story_runs")).one()
    gates = run[0] if isinstance(run[0], list) else __import__("json").loads(run[0])
    assert gates == ["1", "2"] and run[1] == "3"
    assert story[0] == "12" and not story[1]
    assert tuple(view) == ("12-1-x", "12")


def _upgraded_from_0005(url: str, check) -> None:
    """The database at `url` with a run and a story written at 0005, upgraded to head, then
    `check(engine)`."""
    engine = sa.create_engine(url)
    try:
        _rows_at_0005(engine)
        from bmad_loop.db import migrate

        migrate.upgrade(engine)
        check(engine)
    finally:
        engine.dispose()


def test_0006_keeps_a_runs_numeric_epics_as_text_on_sqlite(tmp_path):
    def check(engine):
        _check_after_0006(engine)
        with engine.begin() as conn:  # a letter epic is stored and read back as text
            conn.execute(sa.text("UPDATE stories SET epic = 'r'"))
            assert conn.execute(sa.text("SELECT epic FROM v_story_runs")).scalar() == "r"

    _upgraded_from_0005(_url(tmp_path / "state.db"), check)


def _upgraded_on_postgresql_from_0005(check) -> None:
    from backends import fresh_postgres_database

    with fresh_postgres_database() as url:
        _upgraded_from_0005(url, check)


def test_0006_keeps_a_runs_numeric_epics_as_text_on_postgresql():
    _upgraded_on_postgresql_from_0005(_check_after_0006)


def test_the_head_revision_constant_is_alembics_head():
    """`HEAD_REVISION` lets a process skip alembic on an up-to-date database; a new migration
    must move it."""
    from bmad_loop.db.migrate import HEAD_REVISION

    assert HEAD_REVISION == head_revision()


def test_opening_an_up_to_date_database_loads_no_alembic_and_an_old_one_is_upgraded(tmp_path):
    """A real second process opens the database: once it is at head, alembic is not even
    imported (it and the revision scripts cost ~180 ms per command); a database left at an older
    revision is still brought to head on open."""
    import subprocess
    import sys

    from alembic import command

    from bmad_loop.db import migrate

    path = tmp_path / "state.db"
    probe = ("import sys; from pathlib import Path; from bmad_loop.db.database import Database; "
             f"db = Database({_url(path)!r}, lock_dir=Path({str(tmp_path)!r})); db.migrate(); "
             "print('alembic' in sys.modules); db.dispose()")

    def open_in_a_process() -> str:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    engine = sa.create_engine(_url(path))
    try:
        command.upgrade(migrate.alembic_config(engine), "0005")  # an old database
        assert open_in_a_process() == "True"  # it had to migrate
        assert current_revision(engine) == head_revision()
        assert open_in_a_process() == "False"  # at head: no alembic at all
    finally:
        engine.dispose()


# --- 0010: stories.rev, moved by the database on every UPDATE of a story ----------------------

def _revs(engine) -> dict:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT key, rev FROM stories")).all())


def _check_rev_moves_with_every_update(engine) -> None:
    """A story made before 0010 starts at 0; each UPDATE, whatever it sets, moves its own row's
    rev by one and no other row's; an UPDATE that matches no row moves nothing."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO stories (run_id, key, seq, epic, title, state, footprint, depends_on, "
            "merge_class, done_checkpoint, dev_attempts, review_cycles, feedback, approved, "
            "signed_off, claim, human_fix) VALUES ('r1', '12-2-y', 2, '12', 't', 'pending', "
            "'{}', '[]', 'self', false, 0, 0, '{}', false, false, 0, false)"))
    assert _revs(engine) == {"12-1-x": 0, "12-2-y": 0}
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE stories SET wait_reason = 'w' WHERE key = '12-1-x'"))
    with engine.begin() as conn:  # two statements in one transaction: two moves
        conn.execute(sa.text("UPDATE stories SET state = 'queued' WHERE key = '12-1-x'"))
        conn.execute(sa.text("UPDATE stories SET claim = claim + 1 WHERE key = '12-1-x'"))
        conn.execute(sa.text("UPDATE stories SET state = 'queued' WHERE key = 'none such'"))
    assert _revs(engine) == {"12-1-x": 3, "12-2-y": 0}


def test_0010_moves_a_storys_rev_on_every_update_on_sqlite(tmp_path):
    def check(engine):
        _check_rev_moves_with_every_update(engine)
        # A writer that is not bmad-loop (the sqlite3 module, no SQLAlchemy).
        with sqlite3.connect(tmp_path / "state.db") as conn:
            conn.execute("UPDATE stories SET reason = 'by hand' WHERE key = '12-2-y'")
        assert _revs(engine) == {"12-1-x": 3, "12-2-y": 1}

    _upgraded_from_0005(_url(tmp_path / "state.db"), check)


def test_0010_moves_a_storys_rev_on_every_update_on_postgresql():
    _upgraded_on_postgresql_from_0005(_check_rev_moves_with_every_update)


def test_0010_downgrade_drops_the_trigger_and_the_column(tmp_path):
    from alembic import command

    from bmad_loop.db import migrate

    path = tmp_path / "state.db"
    engine = sa.create_engine(_url(path))
    try:
        _rows_at_0005(engine)
        migrate.upgrade(engine)
        command.downgrade(migrate.alembic_config(engine), "0009")
        assert not [row for row in _schema(path) if row[0] == "trigger"]
        with engine.begin() as conn:  # no trigger left to name the dropped column
            conn.execute(sa.text("UPDATE stories SET reason = 'after the downgrade'"))
            assert "rev" not in {c["name"] for c in sa.inspect(conn).get_columns("stories")}
    finally:
        engine.dispose()


# --- a schema newer than this bmad-loop: refused in one line, nothing changed ------------------

def _from_a_newer_bmad_loop(path: Path) -> None:
    """The database as a later bmad-loop would leave it: migrated past this one's head."""
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0099'")


def test_a_schema_newer_than_this_bmad_loop_is_refused_in_one_line_and_left_as_it_is(tmp_path):
    from bmad_loop.db.migrate import HEAD_REVISION
    from bmad_loop.errors import ConfigError

    path = tmp_path / "state.db"
    db = Database(_url(path), lock_dir=tmp_path)
    db.migrate()
    db.dispose()
    _from_a_newer_bmad_loop(path)
    before = _schema(path)
    again = Database(_url(path), lock_dir=tmp_path)
    try:
        with pytest.raises(ConfigError) as refused:
            again.migrate()
    finally:
        again.dispose()
    message = str(refused.value)
    assert "\n" not in message and str(path) in message
    assert "0099" in message and HEAD_REVISION in message and "upgrade bmad-loop" in message
    assert _schema(path) == before
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("0099",)]


def test_a_command_on_a_newer_schema_exits_2_with_that_line(make_repo):
    from support import ALPHA_BETA_GAMMA, MERGE_NONE, write_each

    repo = make_repo(ALPHA_BETA_GAMMA, script=write_each(ALPHA_BETA_GAMMA),
                     policy=MERGE_NONE.format(n=1, strategy="merge"))
    assert repo.cli("enqueue").exit_code == 0
    _from_a_newer_bmad_loop(repo.root / ".bmad-loop" / "state.db")
    for args in (("status",), ("run",)):
        result = repo.cli(*args)
        assert result.exit_code == 2, result.output
        assert "schema revision 0099" in result.output and "Traceback" not in result.output
