"""`history --html`: the index page, one line per run (newest first) linking to its report."""

from __future__ import annotations

from html import escape

from ..history import cost_cell, tokens_cell
from .html import page
from .svg import format_seconds

__all__ = ["render_index"]


def _row(entry: dict, link: str | None) -> str:
    run_id = escape(entry["id"])
    name = f'<a href="{escape(link)}">{run_id}</a>' if link else run_id
    counts = ", ".join(f"{n} {escape(state)}" for state, n in entry["counts"].items())
    cells = [name, escape(entry["state"]), escape(entry["outcome"]),
             escape(entry["created_at"] or "-"), format_seconds(entry["duration_s"]),
             str(entry["stories"]), escape(tokens_cell(entry["usage"])), escape(cost_cell(entry["usage"])),
             counts, escape(entry["reason"] or "")]
    return f'<tr data-run="{run_id}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def render_index(entries: list[dict], links: dict[str, str]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("run", "state", "outcome", "created", "duration",
                                             "stories", "tokens", "cost", "counts", "reason"))
    rows = "".join(_row(e, links.get(e["id"])) for e in entries)
    body = (f"<h1>bmad-loop runs</h1><p class=meta>{len(entries)} run(s), newest first; each "
            f"links to its report.</p><table class=runs><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table>" if entries else
            "<h1>bmad-loop runs</h1><p class=meta>No runs yet.</p>")
    return page("bmad-loop runs", body)
