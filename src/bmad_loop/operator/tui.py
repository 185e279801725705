"""`bmad-loop tui`: runs, stories, the lane and a tailing journal in one terminal screen.

An observer and a launcher, never the engine. It reads rows through a read-only `Reader`, and
its keys call the same code as the CLI: `s`/`S` call `engine.run.control.stop` (graceful / now),
`r` starts `bmad-loop resume RUN` as a detached process (so the run keeps going when the TUI
exits), `c` runs `bmad-loop cleanup`, `a` attaches the tail pane to the selected story's
session log (the cursor starts on the first story in flight), `j` switches it back to the
journal. Needs the `tui` extra (textual).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Header, RichLog, Static

from ..db.models import Run
from ..engine.journal import event_json, events_after
from ..engine.run.status import run_status
from ..states import STORY_IN_FLIGHT
from .follow import LogTail, format_event
from .history import run_history
from .readonly import Reader
from .status_view import lane_text
from .style import elapsed_text, state_text, story_note

if TYPE_CHECKING:
    from ..engine.project import Project

__all__ = ["BoardApp", "cli_argv"]


def cli_argv(*args: str) -> list[str]:
    """The argv that runs this very bmad-loop's CLI in a child process."""
    return [sys.executable, "-m", "bmad_loop", *args]


class BoardApp(App):
    """The operator's board. `refresh_s` is how often rows are re-read."""

    TITLE = "bmad-loop"
    # The stories panel never collapses: it keeps MIN_STORY_ROWS; on a narrow terminal the runs
    # panel shrinks to the run ids, on a short one the lane and the journal give up lines first.
    CSS = """
    #runs { width: 54; border: round $primary; }
    #right { width: 1fr; }
    #stories { height: 1fr; min-height: 7; border: round $primary; }
    #lane { height: auto; max-height: 16; border: round $secondary; padding: 0 1; }
    #tail { height: 12; border: round $accent; }
    Screen.-narrow #runs { width: 24; }
    Screen.-short #lane { max-height: 5; }
    Screen.-short #tail { height: 6; }
    """
    NARROW_BELOW = 130  # columns: below, the runs panel shows little more than run ids
    SHORT_BELOW = 40  # lines: below, the lane panel and the journal shrink
    BINDINGS = [
        Binding("s", "stop", "Stop"),
        Binding("S", "stop_now", "Stop now"),
        Binding("r", "resume", "Resume"),
        Binding("c", "cleanup", "Clean up"),
        Binding("a", "attach", "Attach"),
        Binding("j", "journal", "Journal"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, project: Project, *, run_ref: str | None = None,
                 refresh_s: float = 1.0) -> None:
        super().__init__()
        self.project = project
        self.run_ref = run_ref
        self.refresh_s = refresh_s
        self.run_id: str | None = None
        self.reader: Reader | None = None
        self.mode = "journal"  # or "attach"
        self.attached: str | None = None
        self.in_flight: list[str] = []  # the shown run's stories in flight, in plan order
        self._auto_row: int | None = None  # where the board put the stories' cursor
        self.tail_lines: list[str] = []  # what the tail pane shows, as plain text
        self.launched: list[subprocess.Popen] = []
        self.last_cleanup: tuple[int, str] | None = None
        self._last_seq = 0
        self._tail: LogTail | None = None
        self._signatures: dict[str, object] = {}

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal():
            yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
            with Vertical(id="right"):
                yield DataTable(id="stories", cursor_type="row", zebra_stripes=True)
                yield Static(id="lane")
        yield RichLog(id="tail", wrap=False, highlight=False, markup=False, max_lines=2000)
        yield Footer()

    def on_mount(self) -> None:
        self.reader = Reader(self.project)
        runs = self.query_one("#runs", DataTable)
        runs.add_columns("run", "state", "outcome")
        runs.border_title = "runs"
        stories = self.query_one("#stories", DataTable)
        stories.add_columns("#", "story", "state", "phase", "elapsed", "attempt", "note")
        stories.border_title = "stories"
        self.query_one("#lane", Static).border_title = "lane"
        self.query_one("#tail", RichLog).border_title = "journal"
        self._fit(self.size.width, self.size.height)
        if self.run_ref is not None:
            from ..engine.run.control import find_run

            with self.reader.session() as s:
                self.run_id = find_run(s, self.project, self.run_ref).id
        self.refresh_data()
        self.set_interval(self.refresh_s, self.refresh_data)

    def on_resize(self, event) -> None:
        self._fit(event.size.width, event.size.height)

    def _fit(self, width: int, height: int) -> None:
        """Compact layout classes for small terminals (80×24 stays usable)."""
        self.screen.set_class(width < self.NARROW_BELOW, "-narrow")
        self.screen.set_class(height < self.SHORT_BELOW, "-short")

    def on_unmount(self) -> None:
        if self.reader is not None:
            self.reader.close()

    # ------------------------------------------------------------------ reading
    def refresh_data(self) -> None:
        assert self.reader is not None  # opened on mount, before the first refresh
        with self.reader.session() as s:
            entries = run_history(s, self.project.key, limit=50)
            if self.run_id is None and entries:
                self.run_id = entries[0]["id"]
            run = s.get(Run, self.run_id) if self.run_id else None
            status = run_status(s, run) if run is not None else None
            events = ([event_json(e) for e in events_after(s, run.id, self._last_seq)]
                      if run is not None and self.mode == "journal" else [])
        self._show_runs(entries)
        if status is not None:
            self._show_stories(status)
            self._show_lane(status)
            self.sub_title = f"run {status['run']['id']} · {status['run']['state']}"
        for line in events:
            self._last_seq = line["seq"]
            self._write_tail(format_event(line))
        if self.mode == "attach" and self._tail is not None:
            self._tail.drain(self._write_tail_text)

    def _changed(self, name: str, signature) -> bool:
        if self._signatures.get(name) == signature:
            return False
        self._signatures[name] = signature
        return True

    def _show_runs(self, entries) -> None:
        rows = [(e["id"], e["state"], e["outcome"]) for e in entries]
        if not self._changed("runs", tuple(rows)):
            return
        table = self.query_one("#runs", DataTable)
        table.clear()
        for row in rows:
            table.add_row(row[0], state_text(row[1]), row[2], key=row[0])
        ids = [r[0] for r in rows]
        if self.run_id in ids:
            table.move_cursor(row=ids.index(self.run_id))

    def _show_stories(self, status) -> None:
        rows = []
        for story in status["stories"]:
            rows.append((str(story["seq"]), story["key"], story["state"], story.get("phase") or "",
                         elapsed_text(story.get("elapsed_s")), str(story.get("attempt") or 0),
                         story_note(story)))
        if not self._changed("stories", (status["run"]["id"], tuple(rows))):
            return
        table = self.query_one("#stories", DataTable)
        picked = self.story_picked()
        cursor = table.cursor_row
        self.in_flight = [s["key"] for s in status["stories"] if s["state"] in STORY_IN_FLIGHT]
        table.clear()
        for row in rows:
            table.add_row(row[0], row[1], state_text(row[2]), *row[3:], key=row[1])
        if rows:
            if picked:  # the person's row stays theirs
                table.move_cursor(row=min(max(cursor, 0), len(rows) - 1))
            else:  # else the first story in flight, so `a` attaches to live work
                keys = [row[1] for row in rows]
                self._auto_row = keys.index(self.in_flight[0]) if self.in_flight else 0
                table.move_cursor(row=self._auto_row)

    def story_picked(self) -> bool:
        """Has the person moved the stories' cursor off the row the board put it on?"""
        if self._auto_row is None:
            return False
        return self.query_one("#stories", DataTable).cursor_row != self._auto_row

    def _show_lane(self, status) -> None:
        text = lane_text(status, self.project.root)
        if self._changed("lane", text.plain):
            self.query_one("#lane", Static).update(text)

    def lane_plain(self) -> str:
        """What the lane panel shows, as plain text."""
        sig = self._signatures.get("lane")
        return sig if isinstance(sig, str) else ""

    def _write_tail(self, line: str) -> None:
        self.tail_lines.append(line)
        self.query_one("#tail", RichLog).write(line)

    def _write_tail_text(self, text: str) -> None:
        for line in text.splitlines():
            self._write_tail(line)

    def _reset_tail(self, title: str) -> None:
        self.tail_lines = []
        log = self.query_one("#tail", RichLog)
        log.clear()
        log.border_title = title

    # ------------------------------------------------------------------ selection
    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id != "runs" or event.row_key is None:
            return
        run_id = event.row_key.value
        if run_id and run_id != self.run_id:
            self.run_id = run_id
            self._last_seq = 0
            self.mode, self._tail, self.attached = "journal", None, None
            self._reset_tail("journal")
            self._signatures.pop("stories", None)
            self._auto_row = None  # a new run: its first story in flight again
            self.refresh_data()

    def selected_story(self) -> str | None:
        table = self.query_one("#stories", DataTable)
        if table.row_count == 0:
            return None
        row = table.get_row_at(max(table.cursor_row, 0))
        return str(row[1])

    # ------------------------------------------------------------------ actions
    def action_journal(self) -> None:
        self.mode, self._tail, self.attached = "journal", None, None
        self._last_seq = 0
        self._reset_tail("journal")
        self.refresh_data()

    def action_attach(self) -> None:
        key = self.selected_story()
        if key is None or self.run_id is None:
            return
        if not self.in_flight and not self.story_picked():
            self.notify("nothing in flight: no story is being worked on (move to a story to "
                        "read its last log)", severity="warning")
            return
        assert self.reader is not None  # opened on mount, before any key is read
        with self.reader.session() as s:
            from ..engine.runrows import stories_of

            row = next((st for st in stories_of(s, self.run_id) if st.key == key), None)
            log = row.log if row else None
        if not log:
            self.notify(f"{key} has no session log yet", severity="warning")
            return
        self.mode, self.attached = "attach", key
        self._reset_tail(f"attached: {key} ({Path(log).name})")
        self._write_tail(f"==> {log} <==")
        self._tail = LogTail(Path(log))
        self._tail.drain(self._write_tail_text)

    def action_stop(self, now: bool = False) -> None:
        from ..engine.run.control import stop
        from ..errors import BmadLoopError
        from ..queue.tasks import Tasks

        if self.run_id is None:
            return
        try:
            run = stop(self.project, Tasks(self.project), self.run_id, now=now)
        except BmadLoopError as exc:
            self.notify(str(exc), severity="error")
            return
        self.notify(f"run {run.id} {run.state}")
        self.refresh_data()

    def action_stop_now(self) -> None:
        self.action_stop(now=True)

    def action_resume(self) -> None:
        """Start `bmad-loop resume RUN` detached: it drives the run and outlives the TUI."""
        if self.run_id is None:
            return
        log_dir = self.project.path("logs", self.run_id)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"tui-resume-{time.strftime('%Y%m%d-%H%M%S')}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(cli_argv("resume", "--project", str(self.project.root),
                                             self.run_id),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=self.project.root)
        self.launched.append(proc)
        self.notify(f"resuming {self.run_id} (pid {proc.pid}, output in {log_path})")

    def action_cleanup(self) -> None:
        if self.run_id is None:
            return
        self.run_worker(self._cleanup, thread=True, exclusive=True,
                        group="cleanup")

    def _cleanup(self) -> None:
        proc = subprocess.run(cli_argv("cleanup", "--project", str(self.project.root)),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              cwd=self.project.root)
        message = (proc.stdout + proc.stderr).strip().splitlines()
        summary = message[-1] if message else f"cleanup exited {proc.returncode}"
        self.last_cleanup = (proc.returncode, summary)
        self.call_from_thread(self.notify, summary,
                              severity="information" if proc.returncode == 0 else "error")
        self.call_from_thread(self.refresh_data)
