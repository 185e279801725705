"""stories.claim: a claim generation that fences stalled story workers

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("stories", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claim", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    # Native DROP COLUMN (SQLite 3.35+): a batch copy of the table would break the views on it.
    op.execute("ALTER TABLE stories DROP COLUMN claim")
