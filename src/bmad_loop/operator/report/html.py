"""The run report as HTML: one self-contained page per run (inline CSS and SVG, no script,
nothing fetched), the `history --html` index of the runs, and the writing of both.

A run's page has these sections: the run; the timeline (`svg.timeline_svg`); where the night
went (makespan against the lower bound and its chain, per phase, per story); cost and tokens per
story and phase; every escalation and failure with its log's last lines and relative links to
the logs; the target's commits with their stories. Built with `html.escape` and f-strings: the
page is a few fixed sections, and the standard library keeps the report dependency-free
(docs/operator.md says why).

The pages are read through the caller's session (a read-only `Reader` for the read commands,
the engine's own database after `run`) and written whole (`write_atomic`), so a CI step never
publishes half a page.
"""

from __future__ import annotations

import os
from html import escape
from pathlib import Path
from typing import Collection

from sqlalchemy.orm import Session

from ...db.models import Run
from ...engine.usage import USAGE_COLUMNS
from ...fileio import write_atomic
from ..history import cost_cell, tokens_cell
from .data import gather_report
from .geometry import layout_report
from .svg import format_seconds, timeline_svg
from .text import recovered_lines, sessions_text

__all__ = ["render_report", "page", "CSS", "render_index", "write_run_report",
           "write_history_reports", "report_file_name", "INDEX_NAME"]

INDEX_NAME = "index.html"

CSS = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 24px;
color:#1f2933;background:#fff;min-width:1360px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #d9dee3}
.meta{color:#52606d}.meta b{color:#1f2933}
table{border-collapse:collapse;margin:4px 0 8px}th,td{padding:2px 10px 2px 0;text-align:left;
vertical-align:top}th{color:#52606d;font-weight:600}td.num,th.num{text-align:right}
code,pre{font:12px/1.35 ui-monospace,SFMono-Regular,Menlo,monospace}
pre{background:#f5f7fa;border:1px solid #e4e7eb;padding:6px 8px;overflow-x:auto;max-height:360px}
.timeline svg{display:block}.row-title{color:#52606d;margin:8px 0 2px}
text.label{font-size:11px;fill:#1f2933}text.tick{font-size:10px;fill:#7b8794;text-anchor:middle}
line.tick{stroke:#9aa5b1}line.grid{stroke:#eef1f4}rect.paused{fill:#f0b42926}
.k-prepare,.k-commit{fill:#9aa5b1}.k-create{fill:#8e6cc6}.k-dev{fill:#3b82c4}
.k-verify{fill:#e0a526}.k-review{fill:#2fa37a}.k-fix{fill:#d9622b}
.k-wait{fill:#dde3e9}.k-lane-wait{fill:#cfe3f5}.k-integrating{fill:#b9c8d6}
.k-compose{fill:#7b93ab}.k-verify-failed{fill:#d64545}.k-advance{fill:#cfe3f5}.k-epic{fill:#7b93ab}
rect.bar[data-open="1"]{stroke:#1f2933;stroke-dasharray:3 2;stroke-width:1}
.mark{stroke-width:2}.m-integrated,.m-advanced{fill:#1e8e3e;stroke:#fff;stroke-width:1}
.m-escalated,.m-failed{stroke:#d64545;fill:none}.m-blocked,.m-held,.m-interrupted,.m-skipped{stroke:#52606d}
polygon.slots{fill:#3b82c455;stroke:#3b82c4}line.slot-n{stroke:#d64545;stroke-dasharray:4 3}
.legend span{display:inline-block;margin-right:12px}.legend i{display:inline-block;width:14px;
height:10px;margin-right:4px;vertical-align:middle}
details.epic summary{cursor:pointer}details.epic svg.epic-summary{display:block}
.failure{margin:8px 0 12px}.failure .why{color:#b42318}.bound{font-size:14px}
"""

_LEGEND = (("create", "#8e6cc6"), ("dev", "#3b82c4"), ("verify", "#e0a526"),
           ("review", "#2fa37a"), ("fix", "#d9622b"), ("prepare / commit", "#9aa5b1"),
           ("waiting for a slot", "#dde3e9"), ("ready, waiting for the lane", "#cfe3f5"),
           ("integrating", "#b9c8d6"), ("compose", "#7b93ab"), ("verify failed", "#d64545"),
           ("paused", "#f0b42966"))


def page(title: str, body: str) -> str:
    """A whole HTML document around `body`, with the report's style sheet."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head>"
            f"<body>{body}</body></html>\n")


def _table(header: list[str], rows: list[list[str]], numeric: Collection[int] = frozenset(),
           css_class: str = "") -> str:
    """A table of already-escaped cells."""
    head = "".join(f'<th{" class=num" if i in numeric else ""}>{h}</th>' for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{c}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f'<table class="{css_class}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _header(report: dict) -> str:
    run, summary = report["run"], report["summary"]
    counts = ", ".join(f"{n} {escape(state)}" for state, n in summary["by_state"].items())
    facts = [("state", run["state"]), ("outcome", run["outcome"]),
             ("target", run["target_branch"]), ("N", run["max_parallel"]),
             ("strategy", run.get("merge_strategy")), ("created", run["created_at"]),
             ("report ends", run["report_end"]), ("makespan", format_seconds(report["makespan_s"])),
             ("active", format_seconds(report["active_s"])),
             ("paused or stopped", format_seconds(report["paused_s"]) if report["paused_s"] else None)]
    line = " · ".join(f"{escape(k)} <b>{escape(str(v))}</b>" for k, v in facts if v is not None)
    reason = f'<p class="why">{escape(run["reason"])}</p>' if run.get("reason") else ""
    if run.get("silent_s"):
        reason += (f'<p class="why silent">Nothing heard from this run for '
                   f'{format_seconds(run["silent_s"])} though it is {escape(run["state"])}: it '
                   f'crashed or its workers stopped. <code>bmad-loop resume {escape(run["id"])}'
                   f'</code> continues it.</p>')
    return (f'<h1>bmad-loop run {escape(run["id"])}</h1><p class="meta">{line}</p>'
            f'<p class="meta">{summary["stories"]} stories: {counts}</p>{reason}')


def _timeline(report: dict) -> str:
    legend = "".join(f'<span><i style="background:{color}"></i>{escape(name)}</span>'
                     for name, color in _LEGEND)
    layout = layout_report(report)
    grouped = ("<p class=meta>Grouped by epic: open an epic to see its stories.</p>"
               if layout.grouped else "")
    return (f'<h2 id="timeline">Timeline</h2><div class="legend">{legend}</div>{grouped}'
            f'{timeline_svg(layout, report["slots"]["n"])}')


def _night(report: dict) -> str:
    bound = report["bound"]
    ratio = bound.get("ratio")  # active time to the bound: paused time is nobody's work
    paused = (f' (makespan {format_seconds(report["makespan_s"])}, of which paused or stopped '
              f'{format_seconds(report["paused_s"])})') if report["paused_s"] else ""
    head = (f'<p class="bound">active time <b>{format_seconds(report["active_s"])}</b>{paused} '
            f'against a lower bound of <b>{format_seconds(bound["lower_bound_s"])}</b>'
            + (f" ({ratio:.2f}×)" if ratio else "") + f' = max(longest chain '
            f'{format_seconds(bound["chain_s"])}, total work {format_seconds(bound["work_s"])} '
            f'÷ N={bound["slots"]} = {format_seconds(bound["work_per_slot_s"])}); '
            f'bound by {escape(bound["bound_by"])}</p>'
            f'<p>The chain: {" → ".join(escape(k) for k in bound["chain"]) or "-"}</p>')
    phases = _table(["phase", "stories", "wall in the phase", "agent sessions"],
                    [[escape(p), str(v["stories"]), format_seconds(v["wall_s"]),
                      format_seconds(v["agent_s"])] for p, v in report["phases"].items()],
                    {1, 2, 3}, "phases")
    rows = [[f'<span title="{escape(s["key"])}">{escape(s["key"])}</span>', escape(s["state"]),
             format_seconds(s["work_s"]),
             format_seconds(s["agent_s"]), format_seconds(s["verify_s"]),
             format_seconds(s["wait_s"]), format_seconds(s["integrating_s"]),
             escape(sessions_text(s))] for s in report["stories"]]
    stories = _table(["story", "state", "in a worker", "agent", "verify", "waiting",
                      "integrating", "sessions"], rows, {2, 3, 4, 5, 6}, "night")
    return f'<h2 id="night">Where the night went</h2>{head}{phases}{stories}'


def _usage_cells(usage: dict) -> list[str]:
    out = []
    for name in USAGE_COLUMNS:
        value = usage.get(name)
        out.append("-" if value is None else (f"${value:.2f}" if name == "cost_usd" else f"{value:,}"))
    return out


def _cost(report: dict) -> str:
    rows = [[escape(s["key"]), escape(phase), *_usage_cells(usage)]
            for s in report["stories"] for phase, usage in s["usage_by_phase"].items()]
    if not rows:
        return ('<h2 id="cost">Cost and tokens</h2><p class="meta">No agent of this run '
                'reported its usage.</p>')
    total = ["<b>total</b>", "", *_usage_cells(report["usage"])]
    return ('<h2 id="cost">Cost and tokens</h2>'
            + _table(["story", "phase", "input", "output", "cache read", "cache write", "cost"],
                     rows + [total], {2, 3, 4, 5, 6}, "cost"))


def _link(path: str, out_dir: Path, text: str) -> str:
    rel = os.path.relpath(path, out_dir)
    return f'<a href="{escape(Path(rel).as_posix())}">{escape(text)}</a>'


def _failure(entry: dict, out_dir: Path) -> str:
    head = (f'<b>{escape(entry["story"] or "-")}</b> {escape(entry["kind"])} at '
            f'{format_seconds(entry["at"])}: <span class="why">{escape(entry["reason"])}</span>')
    if entry["log"] is None:
        where = ""
    elif entry["local"]:
        where = (f' — {_link(entry["log"], out_dir, Path(entry["log"]).name)} '
                 f'(all logs: {_link(entry["log_dir"], out_dir, "folder")})')
    else:
        where = f' — log on host <b>{escape(entry["host"])}</b>: <code>{escape(entry["log"])}</code>'
    tail = (f'<details><summary>the end of the log</summary><pre>{escape(entry["tail"])}</pre>'
            f'</details>' if entry.get("tail") else "")
    return f'<div class="failure" data-story="{escape(entry["story"] or "")}">{head}{where}{tail}</div>'


def _failures(report: dict, out_dir: Path) -> str:
    entries = report["failures"]
    body = "".join(_failure(e, out_dir) for e in entries) or "<p class=meta>None.</p>"
    return f'<h2 id="failures">Escalations and failures ({len(entries)})</h2>{body}'


def _recovered(report: dict) -> str:
    """Flakes, red targets and repairs: what the run got past without a person."""
    lines = recovered_lines(report)
    body = ("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>") if lines \
        else "<p class=meta>No flaky command, no red target, no repair.</p>"
    return f'<h2 id="recovered">Flakes and repairs ({len(lines)})</h2>{body}'


def _commits(report: dict) -> str:
    rows = [[f'<code>{escape((c["sha"] or "-")[:10])}</code>',
             escape(c["story"] or "(moved by someone else; adopted)"),
             format_seconds(c["at"]), escape(c.get("strategy") or "")] for c in report["commits"]]
    table = _table(["commit", "story", "at", "strategy"], rows, {2}, "commits") if rows else \
        "<p class=meta>The target did not move.</p>"
    return f'<h2 id="commits">The target\'s commits ({escape(report["run"]["target_branch"])})</h2>{table}'


def render_report(report: dict, out_dir: Path) -> str:
    """The page; links to logs are relative to `out_dir`, the folder the page is written to."""
    body = (_header(report) + _timeline(report) + _night(report) + _cost(report)
            + _failures(report, out_dir) + _recovered(report) + _commits(report))
    return page(f"bmad-loop run {report['run']['id']}", body)


# ---------------------------------------------------------------------------- history --html
def _index_row(entry: dict, link: str | None) -> str:
    run_id = escape(entry["id"])
    name = f'<a href="{escape(link)}">{run_id}</a>' if link else run_id
    counts = ", ".join(f"{n} {escape(state)}" for state, n in entry["counts"].items())
    cells = [name, escape(entry["state"]), escape(entry["outcome"]),
             escape(entry["created_at"] or "-"), format_seconds(entry["duration_s"]),
             str(entry["stories"]), escape(tokens_cell(entry["usage"])), escape(cost_cell(entry["usage"])),
             counts, escape(entry["reason"] or "")]
    return f'<tr data-run="{run_id}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def render_index(entries: list[dict], links: dict[str, str]) -> str:
    """`history --html`'s index page: one line per run (newest first) linking to its report."""
    head = "".join(f"<th>{h}</th>" for h in ("run", "state", "outcome", "created", "duration",
                                             "stories", "tokens", "cost", "counts", "reason"))
    rows = "".join(_index_row(e, links.get(e["id"])) for e in entries)
    body = (f"<h1>bmad-loop runs</h1><p class=meta>{len(entries)} run(s), newest first; each "
            f"links to its report.</p><table class=runs><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table>" if entries else
            "<h1>bmad-loop runs</h1><p class=meta>No runs yet.</p>")
    return page("bmad-loop runs", body)


# ---------------------------------------------------------------------------- the files
def report_file_name(run_id: str) -> str:
    return f"run-{run_id}.html"


def write_run_report(session: Session, run: Run, state_dir: Path, path: str | Path) -> Path:
    """`run`'s page at `path`; log links relative to its folder."""
    path = Path(path)
    report = gather_report(session, run, state_dir)
    return write_atomic(path, render_report(report, path.resolve().parent))


def write_history_reports(session: Session | None, runs: list[Run], entries: list[dict],
                          state_dir: Path, target: str | Path) -> Path:
    """The index and each run's page. `target` is a folder (the index is `index.html` in it) or
    a file ending in `.html` (the index; the pages go beside it). Returns the index's path.
    `session` is None only for a project with no state yet, so with no `runs`."""
    target = Path(target)
    as_file = target.suffix.lower() in (".html", ".htm") and not target.is_dir()
    index = target if as_file else target / INDEX_NAME
    folder = index.parent
    for run in runs:
        assert session is not None  # the runs were read through it
        write_run_report(session, run, state_dir, folder / report_file_name(run.id))
    links = {e["id"]: report_file_name(e["id"]) for e in entries}
    return write_atomic(index, render_index(entries, links))
