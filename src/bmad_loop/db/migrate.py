"""Run the alembic migrations from code (no alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from ..errors import ConfigError

if TYPE_CHECKING:
    from alembic.config import Config

# alembic is imported only when a schema must change (or a test asks): importing it and reading
# the revision scripts cost ~180 ms, paid by every command on a database that is up to date.

__all__ = ["alembic_config", "upgrade", "at_head", "current_revision", "head_revision",
           "migrations_dir", "HEAD_REVISION"]

# The newest revision in migrations/versions. tests/test_migrations.py checks it against
# alembic's own answer, so a new migration that does not move it fails the suite.
HEAD_REVISION = "0014"


def migrations_dir() -> Path:
    """The alembic scripts: packaged as bmad_loop._migrations, or the source tree's migrations/."""
    try:
        import bmad_loop._migrations as packaged

        return Path(packaged.__file__).resolve().parent
    except ImportError:  # running from a source checkout without an install
        return Path(__file__).resolve().parents[3] / "migrations"


def alembic_config(engine: Engine | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def at_head(engine: Engine) -> bool:
    """Is the schema at `HEAD_REVISION`? One query and no alembic (a database without the
    version table, or one that cannot be read now, answers False: `upgrade` then decides)."""
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD_REVISION
    except DBAPIError:
        return False


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def upgrade(engine: Engine, where: str = "the state database") -> None:
    """Bring the schema to head. A schema at a revision this bmad-loop does not know (a newer
    bmad-loop migrated it: another host of a scale-out, or a rollback of this one) is refused in
    one line, before anything is changed, instead of alembic's traceback."""
    if at_head(engine):  # asked again under the migration lock: another process may have done it
        return
    from alembic import command
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    config = alembic_config(engine)
    current = current_revision(engine)
    if current is not None:
        try:
            ScriptDirectory.from_config(config).get_revision(current)
        except CommandError:
            raise ConfigError(
                f"{where} is at schema revision {current}, newer than this bmad-loop knows (its "
                f"newest is {HEAD_REVISION}): a newer bmad-loop migrated it; upgrade bmad-loop "
                "here (every host of a scale-out runs the same version)") from None
    command.upgrade(config, "head")
