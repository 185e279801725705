"""repairs, flakes and target checks: the lane hands a failed story back to its agent

- `stories.repairs`: repair sessions the story used in its current budget (`[limits]
  max_repairs`; `resume` gives an escalated story a fresh budget, as it does dev attempts).
- `flakes`: one row per verify command that failed and then passed on a retry of the very
  same tree (`[verify] retries`), in a story's worktree (`site = 'story'`), on a candidate
  (`'candidate'`) or on the target itself (`'target'`), with both logs.
- `target_checks`: the lane's check of the target when a candidate composed on it still fails
  after retries: one row per (run, target commit, failing command); `failed` means the target
  is red (inherited failure, no story blamed).
- `v_flaky_commands`: flaky commands with their counts.

Revision ID: 0014
Revises: 0013
"""
from alembic import op
import sqlalchemy as sa

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

FLAKY_VIEW = """
CREATE VIEW v_flaky_commands AS
SELECT f.command,
       COUNT(*) AS flakes,
       COUNT(DISTINCT f.run_id) AS runs,
       SUM(CASE WHEN f.site = 'story' THEN 1 ELSE 0 END) AS in_stories,
       SUM(CASE WHEN f.site = 'candidate' THEN 1 ELSE 0 END) AS on_candidates,
       SUM(CASE WHEN f.site = 'target' THEN 1 ELSE 0 END) AS on_targets,
       MIN(f.at) AS first_at,
       MAX(f.at) AS last_at
FROM flakes f
GROUP BY f.command
"""


def upgrade() -> None:
    op.add_column("stories", sa.Column("repairs", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "flakes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("story", sa.String(length=255), nullable=True),
        sa.Column("site", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("tree", sa.String(length=64), nullable=True),
        sa.Column("retry", sa.Integer(), nullable=False),
        sa.Column("failed_log", sa.Text(), nullable=True),
        sa.Column("passed_log", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_flakes_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_flakes")),
    )
    op.create_index(op.f("ix_flakes_run_id"), "flakes", ["run_id"], unique=False)
    op.create_table(
        "target_checks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("target_sha", sa.String(length=64), nullable=False),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("story", sa.String(length=255), nullable=True),
        sa.Column("log", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_target_checks_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_target_checks")),
        sa.UniqueConstraint("run_id", "target_sha", "command",
                            name=op.f("uq_target_checks_run_id_target_sha_command")),
    )
    op.create_index(op.f("ix_target_checks_run_id"), "target_checks", ["run_id"], unique=False)
    op.execute(FLAKY_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS v_flaky_commands")
    op.drop_index(op.f("ix_target_checks_run_id"), table_name="target_checks")
    op.drop_table("target_checks")
    op.drop_index(op.f("ix_flakes_run_id"), table_name="flakes")
    op.drop_table("flakes")
    op.drop_column("stories", "repairs")
