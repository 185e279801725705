"""stories.rev: a row version the database moves on every UPDATE of a story

The lane reads its run's stories on every pass. With `rev` it keeps the rows it read and reads
again only those whose `rev` moved: one narrow read of (id, rev) instead of every open story's
twenty columns. Every writer moves it, whoever it is (a worker, `approve` in another process,
a hand-written UPDATE in a SQL shell), because a trigger does it, not the code: on SQLite an
AFTER UPDATE trigger that adds one (the WHEN clause keeps its own UPDATE from firing it again),
on PostgreSQL a BEFORE UPDATE trigger that sets it. Existing rows start at 0.

A later migration that copies the stories table (SQLite's batch mode) drops the trigger with
the old table: it must create it again (`SQLITE_TRIGGER` below).

Revision ID: 0010
Revises: 0009
"""
from alembic import op
import sqlalchemy as sa

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

SQLITE_TRIGGER = """
CREATE TRIGGER stories_rev AFTER UPDATE ON stories FOR EACH ROW WHEN NEW.rev = OLD.rev
BEGIN
    UPDATE stories SET rev = OLD.rev + 1 WHERE id = NEW.id;
END
"""

POSTGRESQL_FUNCTION = """
CREATE OR REPLACE FUNCTION bmad_loop_story_rev() RETURNS trigger AS $$
BEGIN
    NEW.rev := OLD.rev + 1;
    RETURN NEW;
END
$$ LANGUAGE plpgsql
"""

# EXECUTE PROCEDURE, not FUNCTION: PostgreSQL 10 knows only the older spelling.
POSTGRESQL_TRIGGER = """
CREATE TRIGGER stories_rev BEFORE UPDATE ON stories
FOR EACH ROW EXECUTE PROCEDURE bmad_loop_story_rev()
"""


def upgrade() -> None:
    # Plain ADD COLUMN on every back-end: a batch copy of the table would break the views on it.
    op.add_column("stories", sa.Column("rev", sa.Integer(), nullable=False, server_default="0"))
    if op.get_bind().dialect.name == "sqlite":
        op.execute(SQLITE_TRIGGER)
    else:
        op.execute(POSTGRESQL_FUNCTION)
        op.execute(POSTGRESQL_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS stories_rev")
    else:
        op.execute("DROP TRIGGER IF EXISTS stories_rev ON stories")
        op.execute("DROP FUNCTION IF EXISTS bmad_loop_story_rev()")
    # Native DROP COLUMN (SQLite 3.35+): a batch copy of the table would break the views on it.
    op.execute("ALTER TABLE stories DROP COLUMN rev")
