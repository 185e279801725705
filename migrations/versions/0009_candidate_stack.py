"""candidates.stack and candidates.on_candidate_id: speculative candidates

The lane may compose several candidates ahead (C1 = target + story 1, C2 = C1 + story 2, ...)
and verify them at once. `stack` is a candidate's place (1 = composed on the target itself) and
`on_candidate_id` the candidate it was composed on (null: the target). Candidates written before
this revision were all composed on the target: they get `stack = 1`.

Revision ID: 0009
Revises: 0008
"""
from alembic import op
import sqlalchemy as sa

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN on every back-end: a batch copy of the table would break the views on it.
    op.add_column("candidates", sa.Column("stack", sa.Integer(), nullable=True))
    op.add_column("candidates", sa.Column("on_candidate_id", sa.Integer(), nullable=True))
    op.execute("UPDATE candidates SET stack = 1")


def downgrade() -> None:
    # Native DROP COLUMN (SQLite 3.35+): a batch copy of the table would break the views on it.
    op.execute("ALTER TABLE candidates DROP COLUMN on_candidate_id")
    op.execute("ALTER TABLE candidates DROP COLUMN stack")
