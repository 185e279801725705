"""database_identity: one row holding the state database's random id

A repository may be driven from two state databases (a run on PostgreSQL, another on the
SQLite default in a new shell). Each database says who it is with an id made once, here, at its
first migration; the repository's run records (engine/runrecords.py) name the database that owns
each run by this id, so `cleanup` of one database never removes another's work. Self-contained:
it only adds a table.

Revision ID: 0011
Revises: 0010
"""
import datetime as dt
import secrets

from alembic import op
import sqlalchemy as sa

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "database_identity",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_database_identity")),
    )
    # Naive UTC, as the models' UtcDateTime stores it.
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    op.bulk_insert(table, [{"id": secrets.token_hex(8), "created_at": now}])


def downgrade() -> None:
    op.drop_table("database_identity")
