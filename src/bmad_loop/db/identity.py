"""Who a state database is: its random id (made at its first migration, 0011) and a label a
person can read (its URL without the password).

The repository's run records (engine/run/runrecords.py) carry both, so a checkout driven from two
databases can tell its own runs' refs from another database's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from .models import DatabaseIdentity

if TYPE_CHECKING:
    from .database import Database

__all__ = ["database_id", "database_label"]


def database_id(db: Database) -> str:
    """The id of the database `db` opens (read once per `Database` object)."""
    known = db.identity
    if known is None:
        with db.read() as s:
            known = s.scalars(select(DatabaseIdentity.id).order_by(DatabaseIdentity.created_at)).first()
        if known is None:  # only a hand-emptied table: the id is not ours to invent
            raise RuntimeError("the state database has no row in database_identity")
        db.identity = known
    return known


def database_label(url: str) -> str:
    """The URL without its password: no user secret ever reaches a file in the repository.
    The query string goes too (a driver may take `?password=…` there)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url.split("://", 1)[0] + "://…"
    bare = URL.create(parsed.drivername, username=parsed.username, host=parsed.host,
                      port=parsed.port, database=parsed.database)
    return bare.render_as_string(hide_password=False)
