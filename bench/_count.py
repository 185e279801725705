"""`--count`: how many git processes and state-database transactions one run costs.

Wraps, in this process only (the engine code is unchanged):

- `Git.run`: every git subprocess bmad-loop starts, by subcommand (``rev-parse --verify``,
  ``worktree list``, …) and by the engine function that asked for it (the innermost frame of
  ``bmad_loop`` outside the git wrappers), so a look-up repeated in a hot spot shows where;
- `Database.transaction` and `Database.read`: every transaction, by the engine function that
  opened it (a read-only one marked `(read)`);
- every SQL statement SQLAlchemy sends (its ``before_cursor_execute`` event), by its first
  words and table (``SELECT stories``, ``INSERT INTO events``; an executemany counts once). A
  transaction's own BEGIN goes to the driver directly and is not counted, nor is the schema's
  set-up (DDL, PRAGMA, ``alembic_version``) when the run makes the database.

Call `install()` before the run, `report(stories)` after: Markdown tables, per story.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections import Counter

_lock = threading.Lock()
GIT: Counter = Counter()       # (subcommand, caller) -> calls
TX: Counter = Counter()        # caller -> transactions
SQL: Counter = Counter()       # "SELECT stories"-style label -> statements
_SET_UP = {"CREATE", "ALTER", "DROP", "PRAGMA"}
_installed = False
DEPTH = 1  # engine frames shown per git call (bench --count-depth)

# Modules whose frames are plumbing: the caller is the first frame outside them.
_PLUMBING = ("bmad_loop/git/runner.py", "bmad_loop/git/worktrees.py", "bmad_loop/db/database.py",
             "bench/_count.py", "contextlib.py")


def _caller(depth: int = 1) -> str:
    """The innermost `depth` engine frames outside the plumbing, innermost first."""
    frame, names = sys._getframe(2), []
    while frame is not None and len(names) < depth:
        name = frame.f_code.co_filename.replace("\\", "/")
        if "bmad_loop/" in name and not name.endswith(_PLUMBING):
            module = name.rsplit("bmad_loop/", 1)[1].removesuffix(".py")
            names.append(f"{module}.{frame.f_code.co_name}")
        frame = frame.f_back
    return " ← ".join(names) or "?"


def subcommand(args) -> str:
    """``rev-parse --verify``-style label of a git argv (global ``-c k=v`` skipped)."""
    words = [str(a) for a in args]
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in ("-c", "-C") else 1
    words = words[i:]
    if not words:
        return "?"
    label = words[0]
    if len(words) > 1 and (words[0] in ("worktree", "cat-file")
                           or words[1].startswith("-") and words[0] in (
                               "rev-parse", "merge-base", "update-ref", "config",
                               "symbolic-ref", "merge-tree")):
        label += " " + words[1]
    return label


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    from bmad_loop.git import runner as gitcmd
    from bmad_loop.db import database

    original_run = gitcmd.Git.run

    @functools.wraps(original_run)
    def run(self, *args, **kwargs):
        key = (subcommand(args), _caller(DEPTH))
        with _lock:
            GIT[key] += 1
        return original_run(self, *args, **kwargs)

    gitcmd.Git.run = run
    original_tx = database.Database.transaction

    original_read = database.Database.read
    reading = threading.local()  # a read that falls back to a transaction counts once

    @contextlib.contextmanager
    def transaction(self):
        if not getattr(reading, "on", False):
            caller = _caller()
            with _lock:
                TX[caller] += 1
        with original_tx(self) as session:
            yield session

    @contextlib.contextmanager
    def read(self):
        caller = _caller() + " (read)"
        with _lock:
            TX[caller] += 1
        reading.on = True
        try:
            with original_read(self) as session:
                reading.on = False
                yield session
        finally:
            reading.on = False

    database.Database.transaction = transaction
    database.Database.read = read

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "before_cursor_execute")
    def statement(_conn, _cursor, text, _params, _context, _many):
        key = statement_label(text)
        if key.split()[0] in _SET_UP or key.endswith("alembic_version"):
            return  # the state database made or migrated on first use: not the loop's work
        with _lock:
            SQL[key] += 1


def statement_label(text: str) -> str:
    """``SELECT stories``, ``UPDATE attempts``, ``INSERT INTO events``: verb and table."""
    words = text.split()
    if not words:
        return "?"
    verb, upper = words[0].upper(), [w.upper() for w in words]
    table = lambda i: words[i].strip('"').split(".")[-1].strip('"') if i < len(words) else "?"  # noqa: E731
    if verb == "UPDATE":
        return f"UPDATE {table(1)}"
    if verb == "INSERT" and "INTO" in upper:
        return f"INSERT INTO {table(upper.index('INTO') + 1)}"
    if "FROM" in upper:
        return f"{verb} {table(upper.index('FROM') + 1)}"
    return verb


def reset() -> None:
    with _lock:
        GIT.clear()
        TX.clear()
        SQL.clear()


def totals() -> tuple[int, int, int]:
    """(git processes, transactions, SQL statements) counted so far."""
    with _lock:
        return sum(GIT.values()), sum(TX.values()), sum(SQL.values())


def report(stories: int, top: int | None = None) -> str:
    from _common import table

    with _lock:
        git, tx, sql = Counter(GIT), Counter(TX), Counter(SQL)
    per = lambda n: f"{n / stories:.1f}"  # noqa: E731
    by_sub: Counter = Counter()
    for (sub, _caller_), n in git.items():
        by_sub[sub] += n
    out = [f"git processes: {per(sum(git.values()))} per story; "
           f"state-database transactions: {per(sum(tx.values()))} per story\n"]
    out.append(table(["git subcommand", "per story"],
                     [[k, per(n)] for k, n in by_sub.most_common()]))
    out.append("\nWho asks (git subcommand ← engine function):\n")
    out.append(table(["git subcommand ← caller", "per story"],
                     [[f"{k[0]} ← {k[1]}", per(n)] for k, n in git.most_common(top)]))
    out.append("\nTransactions by the function that opened them:\n")
    out.append(table(["caller", "per story"], [[k, per(n)] for k, n in tx.most_common(top)]))
    out.append(f"\nSQL statements: {per(sum(sql.values()))} per story\n")
    out.append(table(["statement", "per story"], [[k, per(n)] for k, n in sql.most_common(top)]))
    return "\n".join(out)
