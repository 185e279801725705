"""`bmad-loop sql` and the views: read-only for real, on SQLite and PostgreSQL, over real runs."""

import json
import sqlite3

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from bmad_loop.db import migrate
from bmad_loop.db.models import Base
from bmad_loop.operator.readonly import SqlRefused, run_query
from backends import fresh_postgres_database
from support import ALPHA_BETA as STORIES, BAD_BETA_SCRIPT as SCRIPT, REJECT_BAD_POLICY as POLICY
from support import VIEWS as VIEW_NAMES

VIEWS = list(VIEW_NAMES)  # compared with a sorted list of view names

WRITES = [
    ("INSERT INTO runs (id) VALUES ('x')", "INSERT"),
    ("update stories set state = 'integrated'", "UPDATE"),
    ("DELETE FROM events", "DELETE"),
    ("CREATE TABLE t (x INTEGER)", "CREATE"),
    ("DROP VIEW v_waits", "DROP"),
    ("ALTER TABLE runs ADD COLUMN x TEXT", "ALTER"),
    ("ATTACH DATABASE 'other.db' AS other", "ATTACH"),
    ("PRAGMA user_version = 7", "PRAGMA user_version writes"),
    ("PRAGMA journal_mode = DELETE", "PRAGMA journal_mode writes"),
    ("WITH gone AS (DELETE FROM events RETURNING seq) SELECT * FROM gone", "DELETE"),
    ("SELECT 1; DELETE FROM runs", "one statement at a time"),
    ("REPLACE INTO runs (id) VALUES ('x')", "REPLACE"),
    ("VACUUM", "VACUUM"),
]


@pytest.fixture
def escalated_run(make_repo):
    """A real run on SQLite: alpha integrates, beta's verify keeps failing and it escalates."""
    repo = make_repo(STORIES, script=SCRIPT, policy=POLICY)
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    return repo


def _counts(repo):
    conn = sqlite3.connect(repo.root / ".bmad-loop" / "state.db")
    try:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("runs", "stories", "attempts", "candidates", "events")}
    finally:
        conn.close()


def test_every_view_answers_for_a_real_run(escalated_run):
    repo = escalated_run
    run_id = repo.status()["run"]["id"]
    stories = json.loads(repo.cli("sql", "SELECT * FROM v_story_runs ORDER BY seq", "--json").output)
    assert [(s["story"], s["state"]) for s in stories] == [("1-1-alpha", "integrated"),
                                                           ("1-2-beta", "escalated")]
    assert stories[0]["sessions"] == 2 and stories[0]["review_sessions"] == 1
    assert stories[1]["dev_sessions"] == 2 and stories[1]["dev_attempts"] == 2
    assert stories[0]["work_s"] > 0 and stories[0]["total_s"] >= stories[0]["work_s"]
    assert all(s["run_id"] == run_id for s in stories)

    (integration,) = json.loads(repo.cli("sql", "SELECT * FROM v_integrations", "--json").output)
    assert integration["story"] == "1-1-alpha" and integration["state"] == "advanced"
    assert integration["target_before"] == repo.status()["run"]["start_sha"]
    assert integration["target_after"] == repo.git("rev-parse", "main")
    assert integration["recompositions"] == 0 and integration["verify_s"] >= 0

    (escalation,) = json.loads(repo.cli("sql", "SELECT * FROM v_escalations", "--json").output)
    assert escalation["story"] == "1-2-beta" and escalation["phase"] == "verify"
    assert "verify failed after 2 dev attempts" in escalation["reason"]
    assert escalation["state_now"] == "escalated"

    waits = json.loads(repo.cli("sql", "SELECT * FROM v_waits ORDER BY seq", "--json").output)
    assert waits[0]["slot_wait_s"] >= 0 and waits[0]["pickup_s"] >= 0
    assert waits[0]["lane_wait_s"] >= 0
    assert waits[1]["lane_wait_s"] is None  # beta never reached the lane


def test_sql_prints_an_aligned_table_with_a_row_count(escalated_run):
    result = escalated_run.cli("sql", "SELECT story, state FROM v_story_runs ORDER BY seq")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "story      state",
        "---------  ----------",
        "1-1-alpha  integrated",
        "1-2-beta   escalated",
        "(2 rows)",
    ]


def test_sql_refuses_every_kind_of_write_with_one_line_and_exit_2(escalated_run):
    before = _counts(escalated_run)
    for statement, named in WRITES:
        result = escalated_run.cli("sql", statement)
        assert result.exit_code == 2, statement
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and named in lines[0], (statement, result.output)
        assert lines[0].startswith("bmad-loop: sql"), result.output
    assert _counts(escalated_run) == before
    assert not (escalated_run.root / "other.db").exists()


def test_the_sqlite_connection_itself_refuses_writes_that_skip_the_screening(
        escalated_run, monkeypatch):
    monkeypatch.chdir(escalated_run.root)  # a relative ATTACH would create its file here
    url = f"sqlite:///{escalated_run.root / '.bmad-loop' / 'state.db'}"
    before = _counts(escalated_run)
    for statement, _ in WRITES:
        if statement.startswith("WITH gone"):
            continue  # not SQLite syntax (a data-modifying CTE): PostgreSQL checks it below
        with pytest.raises(SqlRefused):
            run_query(url, statement, screened=False)
    assert _counts(escalated_run) == before
    assert not (escalated_run.root / "other.db").exists()


def test_reads_that_look_like_writes_in_strings_are_allowed(escalated_run):
    result = escalated_run.cli("sql", "SELECT COUNT(*) AS n FROM events WHERE kind = 'DELETE FROM runs'"
                                      " OR data LIKE '%; DROP%'")
    assert result.exit_code == 0, result.output
    assert "(1 row)" in result.output
    result = escalated_run.cli("sql", "PRAGMA table_info(stories)")
    assert result.exit_code == 0 and "heartbeat_at" in result.output


def test_a_bad_query_is_a_one_line_error_and_exit_2(escalated_run):
    result = escalated_run.cli("sql", "SELECT nope FROM nowhere")
    assert result.exit_code == 2
    assert result.output.strip() == "bmad-loop: sql: no such table: nowhere"


def test_sql_on_postgresql_is_read_only_and_sees_the_same_views(make_repo):
    with fresh_postgres_database() as url:
        repo = make_repo(STORIES, script=SCRIPT, policy=POLICY + f'[database]\nurl = "{url}"\n')
        result = repo.cli("run")
        assert result.exit_code == 3, result.output
        rows = json.loads(repo.cli("sql", "SELECT story, phase, state_now FROM v_escalations",
                                   "--json").output)
        assert rows == [{"story": "1-2-beta", "phase": "verify", "state_now": "escalated"}]
        waits = json.loads(repo.cli("sql", "SELECT story, lane_wait_s FROM v_waits ORDER BY seq",
                                    "--json").output)
        assert waits[0]["lane_wait_s"] >= 0 and waits[1]["lane_wait_s"] is None
        for statement, _ in WRITES:
            if statement.startswith(("ATTACH", "PRAGMA", "REPLACE")):
                continue  # SQLite-only syntax
            with pytest.raises(SqlRefused):
                run_query(url, statement, screened=False)
        counts = json.loads(repo.cli("sql", "SELECT COUNT(*) AS n FROM stories", "--json").output)
        assert counts == [{"n": 2}]


def _engine(tmp_path):
    return create_engine(f"sqlite:///{tmp_path / 'fresh.db'}")


def test_autogenerate_sees_no_drift_with_the_views_in_place(tmp_path):
    engine = _engine(tmp_path)
    migrate.upgrade(engine)
    with engine.connect() as conn:
        assert sorted(inspect(conn).get_view_names()) == VIEWS
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_the_views_migration_downgrades_and_upgrades_again(tmp_path):
    engine = _engine(tmp_path)
    migrate.upgrade(engine)
    command.downgrade(migrate.alembic_config(engine), "0001")
    with engine.connect() as conn:
        assert inspect(conn).get_view_names() == []
        assert "stories" in inspect(conn).get_table_names()
    command.upgrade(migrate.alembic_config(engine), "head")
    with engine.connect() as conn:
        assert sorted(inspect(conn).get_view_names()) == VIEWS


def test_the_views_migrate_on_postgresql_without_drift():
    with fresh_postgres_database() as url:
        engine = create_engine(url)
        try:
            migrate.upgrade(engine)
            with engine.connect() as conn:
                assert sorted(inspect(conn).get_view_names()) == VIEWS
                assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
            command.downgrade(migrate.alembic_config(engine), "0001")
            with engine.connect() as conn:
                assert inspect(conn).get_view_names() == []
        finally:
            engine.dispose()
