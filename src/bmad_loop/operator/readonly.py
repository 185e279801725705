"""Reading the state database without ever writing it: the sessions the operator surfaces read
through (`Reader`), and `bmad-loop sql`'s one statement (`run_query`).

The engine's own sessions start every SQLite transaction with BEGIN IMMEDIATE (a write lock),
which is right for the engine and wrong for a board that re-reads every second: a `Reader`
opens the database file with `mode=ro` and never takes the write lock, so watching a run never
slows it down. Other databases (PostgreSQL) use the project's engine as it is.

For `bmad-loop sql`, read-only is enforced by the database, not by string matching alone:

- SQLite: a separate connection opened with the `mode=ro` URI, `PRAGMA query_only = ON`, and an
  authorizer that allows only reads (SELECT, table reads, functions, recursive CTEs and
  introspection pragmas). ATTACH, which `mode=ro` alone would let create a new file, is denied.
- PostgreSQL: the statement runs in a `READ ONLY` transaction, as a prepared statement (the
  server refuses several commands in one), on a connection of its own.

A screening pass in front of that only exists to give a clear one-line message naming what was
refused (`INSERT`, `ATTACH`, a `PRAGMA` write, …) before the database is touched.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import re
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator
from urllib.parse import quote

from sqlalchemy.orm import Session, sessionmaker

from ..db.dialects import dialect_for
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..engine.project import Project

__all__ = ["Reader", "SqlRefused", "SqlFailed", "QueryResult", "screen", "run_query",
           "format_table", "jsonable"]


class Reader:
    """Read-only sessions on a project's state database, for the surfaces that read (watch,
    follow, attach, the TUI, history, report)."""

    def __init__(self, project: Project) -> None:
        db = project.db  # created and migrated on first use, like every command
        self._engine = db.dialect.read_only_engine()
        self._sessions = sessionmaker(self._engine or db.engine, expire_on_commit=False)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        session = self._sessions()
        try:
            yield session
        finally:
            session.rollback()
            session.close()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


# ---------------------------------------------------------------------------- bmad-loop sql
class SqlRefused(ConfigError):
    """A statement that would write (or attach, or change a setting): refused, exit 2."""


class SqlFailed(ConfigError):
    """The database rejected the statement (syntax error, unknown table, …): exit 2."""


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, (jsonable(v) for v in row))) for row in self.rows]


READ_STARTS = {"SELECT", "WITH", "VALUES", "EXPLAIN", "PRAGMA", "TABLE", "SHOW"}
WRITE_WORDS = {
    "INSERT", "UPDATE", "DELETE", "REPLACE", "UPSERT", "MERGE", "TRUNCATE", "CREATE", "DROP",
    "ALTER", "RENAME", "ATTACH", "DETACH", "VACUUM", "REINDEX", "ANALYZE", "GRANT", "REVOKE",
    "COPY", "CALL", "DO", "LOCK", "SET", "RESET", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT",
    "RELEASE", "LISTEN", "NOTIFY", "PREPARE", "EXECUTE", "DEALLOCATE", "DISCARD", "LOAD",
    "CLUSTER", "COMMENT", "SECURITY", "REFRESH", "IMPORT",
}
# Words that are writes wherever they appear (a data-modifying CTE, `EXPLAIN ANALYZE DELETE`).
# REPLACE is missing on purpose: it is also a string function.
WRITE_ANYWHERE = {"INSERT", "UPDATE", "DELETE", "MERGE", "TRUNCATE", "CREATE", "DROP", "ALTER",
                  "ATTACH", "DETACH", "GRANT", "REVOKE", "COPY", "VACUUM", "REINDEX"}
# PRAGMAs that only describe the schema (their argument names a table or index).
INTROSPECTION_PRAGMAS = {
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "collation_list", "function_list", "module_list", "pragma_list",
    "database_list", "compile_options",
}
# PRAGMAs that may be read (never set): `PRAGMA user_version` yes, `PRAGMA user_version = 1` no.
QUERYABLE_PRAGMAS = {
    "user_version", "schema_version", "application_id", "journal_mode", "page_size",
    "page_count", "freelist_count", "encoding", "foreign_keys", "query_only", "busy_timeout",
    "data_version", "auto_vacuum", "synchronous", "cache_size", "integrity_check",
    "quick_check", "foreign_key_check",
}

_TOKEN = re.compile(r"""
    (?P<comment>--[^\n]*|/\*.*?\*/)
  | (?P<string>'(?:[^']|'')*'|"(?:[^"]|"")*"|`[^`]*`|\[[^\]]*\])
  | (?P<dollar>\$(?P<tag>[A-Za-z_]*)\$.*?\$(?P=tag)\$)
  | (?P<semi>;)
  | (?P<word>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<other>.)
""", re.S | re.X)


def screen(sql: str) -> str:
    """The statement's first keyword, or SqlRefused naming what would write."""
    words: list[str] = []
    after_semicolon = False
    for match in _TOKEN.finditer(sql):
        kind = match.lastgroup
        if kind in ("comment", "tag"):
            continue
        if kind == "semi":
            after_semicolon = True
            continue
        if match.group().isspace():
            continue
        if after_semicolon:
            raise SqlRefused("sql: one statement at a time (found more after ';')")
        if kind == "word":
            words.append(match.group().upper())
        elif not words and match.group() != "(":
            words.append(match.group())
    if not words:
        raise SqlRefused("sql: empty statement")
    first = words[0]
    if first in WRITE_WORDS:
        raise SqlRefused(f"sql is read-only: {first} statements are refused")
    if first not in READ_STARTS:
        raise SqlRefused(f"sql is read-only: only SELECT, WITH, VALUES, EXPLAIN and PRAGMA "
                         f"reads are accepted (got {first})")
    if first == "PRAGMA":
        _screen_pragma(sql)
    for word in words[1:]:
        if word in WRITE_ANYWHERE:
            raise SqlRefused(f"sql is read-only: {word} is refused")
    return first


def _screen_pragma(sql: str) -> None:
    match = re.match(r"\s*PRAGMA\s+(?:\w+\s*\.\s*)?(\w+)\s*(=|\()?", _strip_comments(sql), re.I)
    if not match:
        raise SqlRefused("sql: cannot read this PRAGMA")
    name, op = match.group(1).lower(), match.group(2)
    if name in INTROSPECTION_PRAGMAS:
        return
    if op is None and name in QUERYABLE_PRAGMAS:
        return
    if op is not None:
        raise SqlRefused(f"sql is read-only: PRAGMA {name} writes are refused")
    raise SqlRefused(f"sql is read-only: PRAGMA {name} is refused")


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*|/\*.*?\*/", " ", sql, flags=re.S)


def run_query(database_url: str, sql: str, *, screened: bool = True,
              max_rows: int | None = None) -> QueryResult:
    """Run one read-only statement. `screened=False` skips the message-friendly screening and
    leaves enforcement to the database alone (tests use it to prove that enforcement)."""
    if screened:
        screen(sql)
    # Each kind of database enforces read-only its own way: SQLite through an authorizer on a
    # `mode=ro` connection, a server through a READ ONLY transaction.
    query = _sqlite_query if dialect_for(database_url).kind == "sqlite" else _server_query
    return query(database_url, sql, max_rows)


# ---------------------------------------------------------------------------- SQLite
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}
_ACTION_NAMES = {
    getattr(sqlite3, name): name[len("SQLITE_"):].replace("_", " ")
    for name in ("SQLITE_INSERT", "SQLITE_UPDATE", "SQLITE_DELETE", "SQLITE_ATTACH",
                 "SQLITE_DETACH", "SQLITE_TRANSACTION", "SQLITE_SAVEPOINT", "SQLITE_ALTER_TABLE",
                 "SQLITE_REINDEX", "SQLITE_ANALYZE", "SQLITE_CREATE_TABLE", "SQLITE_CREATE_INDEX",
                 "SQLITE_CREATE_VIEW", "SQLITE_CREATE_TRIGGER", "SQLITE_CREATE_TEMP_TABLE",
                 "SQLITE_CREATE_TEMP_INDEX", "SQLITE_CREATE_TEMP_VIEW",
                 "SQLITE_CREATE_TEMP_TRIGGER", "SQLITE_CREATE_VTABLE", "SQLITE_DROP_TABLE",
                 "SQLITE_DROP_INDEX", "SQLITE_DROP_VIEW", "SQLITE_DROP_TRIGGER",
                 "SQLITE_DROP_TEMP_TABLE", "SQLITE_DROP_TEMP_INDEX", "SQLITE_DROP_TEMP_VIEW",
                 "SQLITE_DROP_TEMP_TRIGGER", "SQLITE_DROP_VTABLE")
    if hasattr(sqlite3, name)
}
_DENIED_FUNCTIONS = {"load_extension", "writefile", "edit"}


class _Authorizer:
    def __init__(self) -> None:
        self.denied: str | None = None

    def __call__(self, action, arg1, arg2, _db, _trigger):
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() in _DENIED_FUNCTIONS:
                return self._deny(f"function {arg2}")
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA:
            name = (arg1 or "").lower()
            if name in INTROSPECTION_PRAGMAS or (arg2 is None and name in QUERYABLE_PRAGMAS):
                return sqlite3.SQLITE_OK
            return self._deny(f"PRAGMA {name}" + (" write" if arg2 is not None else ""))
        return self._deny(_ACTION_NAMES.get(action, f"action {action}"))

    def _deny(self, what: str) -> int:
        self.denied = self.denied or what
        return sqlite3.SQLITE_DENY


def _sqlite_path(url: str) -> str:
    path = url.split("///", 1)[-1] if "///" in url else ""
    if not path or path == ":memory:":
        raise ConfigError(f"sql: {url} is not a database file")
    return path.split("?", 1)[0]


def _sqlite_query(url: str, sql: str, max_rows: int | None) -> QueryResult:
    path = _sqlite_path(url)
    conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=30)
    try:
        conn.execute("PRAGMA query_only = ON")
        conn.execute("PRAGMA busy_timeout = 30000")
        authorizer = _Authorizer()
        conn.set_authorizer(authorizer)
        try:
            cursor = conn.execute(sql)
            rows = cursor.fetchmany(max_rows) if max_rows else cursor.fetchall()
        except sqlite3.ProgrammingError as exc:  # "You can only execute one statement at a time."
            error = SqlRefused if "one statement" in str(exc) else SqlFailed
            raise error(f"sql: {exc}") from None
        except sqlite3.DatabaseError as exc:
            if authorizer.denied:
                raise SqlRefused(f"sql is read-only: {authorizer.denied} is refused") from None
            if "readonly" in str(exc) or "read-only" in str(exc):
                raise SqlRefused(f"sql is read-only: {exc}") from None
            raise SqlFailed(f"sql: {exc}") from None
        columns = [d[0] for d in cursor.description or ()]
        return QueryResult(columns, [tuple(r) for r in rows])
    finally:
        conn.close()


# ---------------------------------------------------------------------------- PostgreSQL
def _server_query(url: str, sql: str, max_rows: int | None) -> QueryResult:
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        raw = engine.raw_connection()
        try:
            driver = raw.driver_connection
            prepared: dict[str, Any] = {}  # keyword arguments of the driver's own execute
            if driver is not None and hasattr(driver, "read_only") \
                    and type(driver).__module__.startswith("psycopg"):
                driver.read_only = True  # psycopg 3: every transaction starts READ ONLY
                prepared = {"prepare": True}  # the server refuses several commands in one
            cursor = raw.cursor()
            try:
                if not prepared:
                    cursor.execute("SET TRANSACTION READ ONLY")
                cursor.execute(sql, **prepared)
                if cursor.description is None:
                    return QueryResult([], [])
                rows = cursor.fetchmany(max_rows) if max_rows else cursor.fetchall()
                columns = [d[0] for d in cursor.description]
                return QueryResult(columns, [tuple(r) for r in rows])
            except Exception as exc:  # the driver's own error classes
                message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                if any(m in message for m in ("read-only transaction", "multiple commands",
                                              "inside a transaction block")):
                    raise SqlRefused(f"sql is read-only: {message}") from None
                raise SqlFailed(f"sql: {message}") from None
            finally:
                raw.rollback()
        finally:
            raw.close()
    finally:
        engine.dispose()


# ---------------------------------------------------------------------------- output
def jsonable(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    return value


def _cell(value: Any) -> str:
    value = jsonable(value)
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}" if abs(value) < 1e15 else repr(value)
    return str(value).replace("\n", "\\n")


def format_table(result: QueryResult) -> str:
    """An aligned plain-text table (what docs/schema.md shows) with a row count."""
    if not result.columns:
        return "(no result set)"
    cells = [[_cell(v) for v in row] for row in result.rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(result.columns)]
    numeric = [all(isinstance(jsonable(r[i]), (int, float)) or r[i] is None for r in result.rows)
               and any(r[i] is not None for r in result.rows) for i in range(len(result.columns))]

    def line(values):
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [line(result.columns), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in cells]
    out.append(f"({len(result.rows)} row{'s' if len(result.rows) != 1 else ''})")
    return "\n".join(out)
