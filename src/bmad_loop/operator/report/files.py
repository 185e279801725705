"""Writing run reports: one run's page (`report --html`, `run/resume --report-html`) and, for
`history --html`, an index of the runs with one page per run beside it.

Reads go through the caller's session (a read-only `Reader` for the read commands, the engine's
own database after `run`); files are written whole (`write_atomic`), so a CI step never
publishes half a page.
"""

from __future__ import annotations

from pathlib import Path

from ...fileio import write_atomic
from .data import gather_report
from .html import render_report
from .index import render_index

__all__ = ["write_run_report", "write_history_reports", "report_file_name", "INDEX_NAME"]

INDEX_NAME = "index.html"


def report_file_name(run_id: str) -> str:
    return f"run-{run_id}.html"


def write_run_report(session, run, state_dir: Path, path: Path) -> Path:
    """`run`'s page at `path`; log links relative to its folder."""
    path = Path(path)
    report = gather_report(session, run, state_dir)
    return write_atomic(path, render_report(report, path.resolve().parent))


def write_history_reports(session, runs, entries: list[dict], state_dir: Path,
                          target: Path) -> Path:
    """The index and each run's page. `target` is a folder (the index is `index.html` in it) or
    a file ending in `.html` (the index; the pages go beside it). Returns the index's path."""
    target = Path(target)
    as_file = target.suffix.lower() in (".html", ".htm") and not target.is_dir()
    index = target if as_file else target / INDEX_NAME
    folder = index.parent
    for run in runs:
        write_run_report(session, run, state_dir, folder / report_file_name(run.id))
    links = {e["id"]: report_file_name(e["id"]) for e in entries}
    return write_atomic(index, render_index(entries, links))
