"""Run the alembic migrations from code (no alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine


__all__ = ["alembic_config", "upgrade", "current_revision", "head_revision", "migrations_dir"]


def migrations_dir() -> Path:
    """The alembic scripts: packaged as bmad_loop._migrations, or the source tree's migrations/."""
    try:
        import bmad_loop._migrations as packaged

        return Path(packaged.__file__).resolve().parent
    except ImportError:  # running from a source checkout without an install
        return Path(__file__).resolve().parents[3] / "migrations"


def alembic_config(engine: Engine | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def upgrade(engine: Engine) -> None:
    if current_revision(engine) == head_revision():
        return
    command.upgrade(alembic_config(engine), "head")
