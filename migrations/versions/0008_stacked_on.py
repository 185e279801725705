"""stories.stacked_on: the finished, not yet integrated stories a stacked start is built on

A story may start on a stacked base (the target composed with earlier finished stories' own
commits) instead of waiting for their integration. `stacked_on` lists them in plan order, each
as `{"key": ..., "head": ...}` (the head the base was composed from), so the lane can tell when
one of them failed to integrate or was redone, and restack the story. Null: a plain start.

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN on every back-end: a batch copy of the table would break the views on it.
    op.add_column("stories", sa.Column("stacked_on", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Native DROP COLUMN (SQLite 3.35+): a batch copy of the table would break the views on it.
    op.execute("ALTER TABLE stories DROP COLUMN stacked_on")
