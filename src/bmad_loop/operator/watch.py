"""`bmad-loop status --watch`: the live board, re-drawn in place until the run settles.

The frames come from `board_view.render_board`; this module only reads the rows through a
read-only `Reader` and hands each frame to a rich `Live` display.
"""

from __future__ import annotations

import threading

__all__ = ["BoardWatch"]


class BoardWatch:
    """The run `run_ref` names (newest by default), watched with the limits of its own policy."""

    def __init__(self, project, run_ref: str | None):
        from ..engine.run.control import find_run
        from ..engine.runrows import run_policy
        from .reader import Reader

        self.reader = Reader(project)
        with self.reader.session() as s:
            run = find_run(s, project, run_ref)
            self.run_id = run.id
            policy = run_policy(run)
        self.stale_after = float(policy.leases.ttl_s)
        self.escalation_blocks = policy.parallel.on_escalation == "pause"

    def show(self, interval: float, stop: threading.Event) -> None:
        """Draw a frame every `interval` seconds until the run settles or `stop` is set."""
        from rich.console import Console
        from rich.live import Live

        from ..db.models import Run, utcnow
        from ..engine.run.status import run_status
        from ..states import RUN_SETTLED
        from .board_view import render_board

        previous = None
        with Live(console=Console(), refresh_per_second=4, auto_refresh=False,
                  redirect_stdout=False, redirect_stderr=False) as live:
            while True:
                with self.reader.session() as s:
                    row = s.get(Run, self.run_id)
                    data = run_status(s, row)
                    settled = row.state in RUN_SETTLED
                frame = render_board(data, previous, utcnow(), stale_after_s=self.stale_after,
                                     escalation_blocks=self.escalation_blocks)
                live.update(frame.renderable, refresh=True)
                previous = frame
                if settled or stop.wait(interval):
                    return

    def close(self) -> None:
        self.reader.close()
