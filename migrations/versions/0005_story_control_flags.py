"""stories.human_fix and stories.after_phase: control flags out of the feedback JSON

`feedback` keeps what the next agent prompt shows (verify output, review notes); whether the
branch was fixed by a human and which phase the next verify follows are columns now.

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

stories = sa.table("stories", sa.column("id", sa.Integer), sa.column("feedback", sa.JSON),
                   sa.column("human_fix", sa.Boolean), sa.column("after_phase", sa.String))


def upgrade() -> None:
    # Plain ADD COLUMN on every back-end: a batch copy of the table would break the views on it.
    op.add_column("stories", sa.Column("human_fix", sa.Boolean(), nullable=False,
                                       server_default=sa.false()))
    op.add_column("stories", sa.Column("after_phase", sa.String(length=16), nullable=True))
    # Carry the flags of stories in flight over from the JSON.
    conn = op.get_bind()
    for story_id, feedback in conn.execute(sa.select(stories.c.id, stories.c.feedback)).all():
        feedback = dict(feedback or {})
        human_fix = bool(feedback.pop("human_fix", False))
        after = feedback.pop("after", None)
        if human_fix or after:
            conn.execute(stories.update().where(stories.c.id == story_id)
                         .values(human_fix=human_fix, after_phase=after, feedback=feedback))


def downgrade() -> None:
    # Native DROP COLUMN (SQLite 3.35+): a batch copy of the table would break the views on it.
    op.execute("ALTER TABLE stories DROP COLUMN after_phase")
    op.execute("ALTER TABLE stories DROP COLUMN human_fix")
