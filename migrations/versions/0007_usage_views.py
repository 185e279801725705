"""views of the agent CLIs' usage: tokens and cost per story, per run, per phase

Columns come from revision 0006 (`attempts.input_tokens`, `output_tokens`, `cache_read_tokens`,
`cache_write_tokens`, `cost_usd`: each session's own report, NULL where its CLI reported none).
A sum over attempts none of which reported a value is NULL, never a made-up 0. `tokens` is
input + output (what `[limits] max_tokens_per_story` counts: cache reads are not new input).
Plain SQL that SQLite and PostgreSQL both run (docs/schema.md documents them).

Revision ID: 0007
Revises: 0006
"""
from alembic import op


revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

VIEWS = ("v_story_usage", "v_run_usage", "v_phase_usage")

_SUMS = """COUNT(a.id) AS sessions,
       SUM(a.input_tokens) AS input_tokens, SUM(a.output_tokens) AS output_tokens,
       SUM(a.cache_read_tokens) AS cache_read_tokens, SUM(a.cache_write_tokens) AS cache_write_tokens,
       SUM(COALESCE(a.input_tokens, 0) + COALESCE(a.output_tokens, 0)) AS tokens,
       SUM(a.cost_usd) AS cost_usd"""

VIEW_SQL = {
    # One row per story of a run: what its agent sessions used and cost.
    "v_story_usage": f"""
CREATE VIEW v_story_usage AS
SELECT s.run_id, s.seq, s.key AS story, s.state,
       {_SUMS}
FROM stories s LEFT JOIN attempts a ON a.story_id = s.id
GROUP BY s.run_id, s.seq, s.key, s.state
""",
    # One row per run: what all its agent sessions used and cost.
    "v_run_usage": f"""
CREATE VIEW v_run_usage AS
SELECT r.id AS run_id, r.state, r.created_at,
       {_SUMS}
FROM runs r LEFT JOIN attempts a ON a.run_id = r.id
GROUP BY r.id, r.state, r.created_at
""",
    # One row per run and phase (create, dev, review, fix) that ran a session.
    "v_phase_usage": f"""
CREATE VIEW v_phase_usage AS
SELECT a.run_id, a.phase,
       {_SUMS}
FROM attempts a
GROUP BY a.run_id, a.phase
""",
}


def upgrade() -> None:
    for name in VIEWS:
        op.execute(VIEW_SQL[name])


def downgrade() -> None:
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
