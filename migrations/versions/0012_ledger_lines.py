"""stories.ledger_lines: what a story added to a git-ignored union ledger

A project that keeps BMAD's deferred-work ledger (or another `union` ledger) out of git gets
each story's added lines captured when it reaches `ready` ({path: text}), so they survive its
worktree and travel to the lane's host; the lane appends them to the checkout's copy once the
story lands. Null: nothing captured.

Revision ID: 0012
Revises: 0011
"""
from alembic import op
import sqlalchemy as sa

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN on every back-end: a batch copy of the table would break the views on it.
    op.add_column("stories", sa.Column("ledger_lines", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Native DROP COLUMN (SQLite 3.35+): a batch copy of the table would break the views on it.
    op.execute("ALTER TABLE stories DROP COLUMN ledger_lines")
