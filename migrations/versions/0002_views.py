"""views for the questions operators ask (docs/schema.md documents them)

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 13:30:00

Views are not models: the models stay the single source of truth for tables, and alembic's
autogenerate comparison only reflects tables, so these never show up as drift. Each view is
plain SQL that SQLite and PostgreSQL both run; the only dialect differences (a duration in
seconds between two timestamps, a field of a JSON column) are spelled per dialect below.
"""
from alembic import op


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

VIEWS = ("v_story_runs", "v_integrations", "v_escalations", "v_waits")


def _seconds(dialect: str, start: str, end: str) -> str:
    """Seconds from `start` to `end` (NULL if either is NULL), rounded to milliseconds."""
    if dialect == "sqlite":
        return f"ROUND((julianday({end}) - julianday({start})) * 86400.0, 3)"
    return f"ROUND(CAST(EXTRACT(EPOCH FROM ({end} - {start})) AS NUMERIC), 3)"


def _json_text(dialect: str, column: str, field: str) -> str:
    if dialect == "sqlite":
        return f"json_extract({column}, '$.{field}')"
    return f"({column} ->> '{field}')"


def _view_sql(dialect: str) -> dict[str, str]:
    secs = lambda a, b: _seconds(dialect, a, b)  # noqa: E731
    jtext = lambda c, f: _json_text(dialect, c, f)  # noqa: E731
    return {
        # One row per story of a run: how many sessions it took and where its time went.
        "v_story_runs": f"""
CREATE VIEW v_story_runs AS
SELECT s.run_id, s.seq, s.key AS story, s.epic, s.state, s.phase,
       s.dev_attempts, s.review_cycles,
       (SELECT COUNT(*) FROM attempts a WHERE a.story_id = s.id) AS sessions,
       (SELECT COUNT(*) FROM attempts a WHERE a.story_id = s.id AND a.phase = 'dev') AS dev_sessions,
       (SELECT COUNT(*) FROM attempts a WHERE a.story_id = s.id AND a.phase = 'review') AS review_sessions,
       (SELECT COUNT(*) FROM attempts a WHERE a.story_id = s.id AND a.phase = 'fix') AS fix_sessions,
       (SELECT ROUND(CAST(COALESCE(SUM(a.duration_s), 0) AS NUMERIC), 3)
          FROM attempts a WHERE a.story_id = s.id) AS agent_s,
       (SELECT COUNT(*) FROM candidates c WHERE c.story_id = s.id) AS candidates,
       s.queued_at, s.started_at, s.ready_at, s.ended_at,
       {secs('s.started_at', 's.ready_at')} AS work_s,
       {secs('s.started_at', 's.ended_at')} AS total_s,
       s.integrated_sha, s.reason
FROM stories s
""",
        # One row per candidate: the integration log of the lane.
        "v_integrations": f"""
CREATE VIEW v_integrations AS
SELECT c.run_id, s.seq, s.key AS story, c.attempt, c.attempt - 1 AS recompositions,
       c.strategy, c.state,
       c.target_sha AS target_before,
       CASE WHEN c.state = 'advanced' THEN c.candidate_sha END AS target_after,
       c.branch_sha, c.candidate_sha, c.verify_s,
       {secs('c.created_at', 'c.ended_at')} AS duration_s,
       c.created_at, c.ended_at, c.reason, c.ref, c.worktree, c.evidence
FROM candidates c JOIN stories s ON s.id = c.story_id
""",
        # One row per escalation (or block) as journaled, with what became of the story since.
        "v_escalations": f"""
CREATE VIEW v_escalations AS
SELECT e.run_id, e.seq AS event_seq, e.ts AS escalated_at, e.kind, e.story,
       s.seq AS story_seq,
       {jtext('e.data', 'phase')} AS phase,
       {jtext('e.data', 'reason')} AS reason,
       c.attempt AS candidate_attempt, c.state AS candidate_state, c.evidence,
       s.state AS state_now
FROM events e
LEFT JOIN stories s ON s.run_id = e.run_id AND s.key = e.story
LEFT JOIN candidates c ON c.id = CAST({jtext('e.data', 'candidate')} AS INTEGER)
WHERE e.kind IN ('story.escalated', 'story.blocked')
""",
        # How long each story waited for a worker slot and, once finished, for the lane.
        "v_waits": f"""
CREATE VIEW v_waits AS
SELECT s.run_id, s.seq, s.key AS story, s.state,
       COALESCE(r.started_at, r.created_at) AS run_started_at,
       s.queued_at, s.started_at, s.ready_at, s.ended_at,
       {secs('COALESCE(r.started_at, r.created_at)', 's.queued_at')} AS slot_wait_s,
       {secs('s.queued_at', 's.started_at')} AS pickup_s,
       {secs('s.ready_at', 's.ended_at')} AS lane_wait_s,
       s.wait_reason
FROM stories s JOIN runs r ON r.id = s.run_id
""",
    }


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for sql in _view_sql(dialect).values():
        op.execute(sql)


def downgrade() -> None:
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
