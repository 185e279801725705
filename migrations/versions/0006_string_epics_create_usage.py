"""epic ids as strings; stories.to_create; attempts.reason and usage columns

- `stories.epic` and `runs.gate_epic` become strings: BMAD epics are named `1`, `r` or `3-5`.
  Existing numbers are kept as their decimal text; `runs.gates_passed` (a JSON list) likewise.
- `stories.to_create`: the story file does not exist yet, so the next worker runs the create
  phase before dev.
- `attempts.reason` (why an attempt ended as it did) and the agent CLI's own usage report:
  tokens in, out, cache read, cache write, and cost in US dollars.

The view `v_story_runs` reads `stories.epic`; a column's type cannot change under a view on
either back-end, so that view is dropped and made again exactly as revision 0002 made it.

Revision ID: 0006
Revises: 0005
"""
import importlib.util
from pathlib import Path

from alembic import op
import sqlalchemy as sa

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

runs = sa.table("runs", sa.column("id", sa.String), sa.column("gates_passed", sa.JSON))


def _views_0002():
    """Revision 0002's module: its view SQL is frozen there, per dialect."""
    path = Path(__file__).with_name("0002_views.py")
    spec = importlib.util.spec_from_file_location("bmad_loop_migration_0002", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _retype_sqlite(table: str, column: str, type_sql: str, nullable: bool) -> None:
    """Give `table.column` a text type without copying the table (a copy would break the
    foreign keys on it): add a new column, copy the values as text, drop the old, rename."""
    tmp = f"{column}__text"
    # SQLite adds a NOT NULL column only with a default; every row gets its value just below.
    constraint = "" if nullable else " NOT NULL DEFAULT ''"
    op.execute(f"ALTER TABLE {table} ADD COLUMN {tmp} {type_sql}{constraint}")
    op.execute(f"UPDATE {table} SET {tmp} = CAST({column} AS TEXT)")
    op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    op.execute(f"ALTER TABLE {table} RENAME COLUMN {tmp} TO {column}")


def _retype(dialect: str, table: str, column: str, nullable: bool) -> None:
    if dialect == "sqlite":
        _retype_sqlite(table, column, "VARCHAR(64)", nullable)
    else:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE VARCHAR(64) "
                   f"USING CAST({column} AS VARCHAR(64))")


def upgrade() -> None:
    bind = op.get_bind()
    dialect = bind.dialect.name
    views = _views_0002()
    op.execute("DROP VIEW IF EXISTS v_story_runs")
    _retype(dialect, "stories", "epic", nullable=False)
    _retype(dialect, "runs", "gate_epic", nullable=True)
    op.execute(views._view_sql(dialect)["v_story_runs"])

    for run_id, passed in bind.execute(sa.select(runs.c.id, runs.c.gates_passed)).all():
        if passed and any(not isinstance(epic, str) for epic in passed):
            bind.execute(runs.update().where(runs.c.id == run_id)
                         .values(gates_passed=[str(epic) for epic in passed]))

    # Plain ADD COLUMN on every back-end: a batch copy of the table would break the views on it.
    op.add_column("stories", sa.Column("to_create", sa.Boolean(), nullable=False,
                                       server_default=sa.false()))
    op.add_column("attempts", sa.Column("reason", sa.Text(), nullable=True))
    for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"):
        op.add_column("attempts", sa.Column(name, sa.Integer(), nullable=True))
    op.add_column("attempts", sa.Column("cost_usd", sa.Float(), nullable=True))


def downgrade() -> None:
    # Native DROP COLUMN (SQLite 3.35+): a batch copy of the table would break the views on it.
    for name in ("cost_usd", "cache_write_tokens", "cache_read_tokens", "output_tokens",
                 "input_tokens", "reason"):
        op.execute(f"ALTER TABLE attempts DROP COLUMN {name}")
    op.execute("ALTER TABLE stories DROP COLUMN to_create")
    # Epic ids stay text: a letter epic has no number to go back to.
