"""attempts.boxed: whether the session ran in the OS sandbox

True: the agent ran boxed (bubblewrap or sandbox-exec, see bmad_loop.sandbox); False: unboxed
(`sandbox = "off"`, or "auto" where no sandbox works). Sessions recorded before this migration
have NULL: not known.

Revision ID: 0013
Revises: 0012
"""
from alembic import op
import sqlalchemy as sa

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN: a batch copy of the table is not needed for a nullable column.
    op.add_column("attempts", sa.Column("boxed", sa.Boolean(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35): a batch copy of the table would break the views on it.
    op.drop_column("attempts", "boxed")
