"""`validate` asks the database server, as it asks Redis: an unreachable PostgreSQL (down, wrong
port, no such database) is one FAIL line naming the key it came from, exit 2, and nothing is
created on a server that does answer."""

from __future__ import annotations

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from support import StoryDef

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])


def _state_line(result) -> str:
    return next(line for line in result.output.splitlines() if " state: " in line)


def _tables(url: str) -> int:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM information_schema.tables "
                                     "WHERE table_schema = 'public'")).scalar()
    finally:
        engine.dispose()


def test_validate_connects_to_a_reachable_postgres_and_creates_nothing(make_repo, postgres_url):
    repo = make_repo([ALPHA], policy=f'[database]\nurl = "{postgres_url}"\n')
    result = repo.cli("validate")
    assert result.exit_code == 0, result.output
    assert _state_line(result).startswith("ok   state: database postgresql")
    assert _tables(postgres_url) == 0


def test_validate_fails_on_an_unreachable_postgres_naming_the_policy_key(make_repo):
    url = "postgresql+psycopg://bmad:secret@127.0.0.1:1/loop"
    repo = make_repo([ALPHA], policy=f'[database]\nurl = "{url}"\n')
    result = repo.cli("validate")
    assert result.exit_code == 2, result.output
    line = _state_line(result)
    assert line.startswith("FAIL state: ") and "policy.toml: [database] url: cannot reach the database" in line
    assert "secret" not in result.output
    assert not (repo.root / ".bmad-loop" / "state.db").exists()


def test_validate_names_the_environment_variable_for_a_database_that_does_not_exist(
        make_repo, postgres_url, monkeypatch):
    missing = make_url(postgres_url).set(database="bmad_no_such_db").render_as_string(hide_password=False)
    monkeypatch.setenv("BMAD_LOOP_DATABASE_URL", missing)
    repo = make_repo([ALPHA])
    result = repo.cli("validate")
    assert result.exit_code == 2, result.output
    line = _state_line(result)
    assert "BMAD_LOOP_DATABASE_URL: cannot reach the database" in line and "bmad_no_such_db" in line
