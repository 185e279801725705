"""`--what-if`: experiments that change the engine's behaviour in this process only.

They monkeypatch the engine to show what a change would buy before anyone makes it; the
engine's code is not touched, and a run with a what-if is not a measurement of bmad-loop as
shipped. Each prints a banner.

- ``dispatch-first``: the lane admits pending stories into free slots on every pass, before it
  integrates the next ready story (as shipped, `_Lane.loop` in engine/lane.py integrates every
  ready story first and dispatches only once nothing is left to integrate, so a slot freed while
  the lane integrates a batch stays empty until the batch is done). Escalation still pauses first.
- ``poll=SECONDS``: the huey consumers' maximum poll back-off (`POLL_MAX_S` in queue.py, shipped
  0.5 s), e.g. ``poll=0.05``.
"""

from __future__ import annotations


def apply(spec: str) -> str:
    """Apply one what-if; returns its banner."""
    if spec == "dispatch-first":
        from bmad_loop.engine import lane

        def loop(self) -> None:
            for _ in range(10_000):
                run, stories = self._load()
                if run.state not in lane.LIVE:
                    return
                if self._pause_for_escalation(run, stories):
                    continue
                if run.state == "running":
                    self._dispatch(run, stories)
                    run, stories = self._load()
                if self._integrate_next(run, stories):
                    continue
                self._settle(run, stories)
                return

        lane._Lane.loop = loop
        return "WHAT-IF dispatch-first: the lane dispatches before each integration (monkeypatched)"
    if spec.startswith("poll="):
        from bmad_loop import queue

        value = float(spec.split("=", 1)[1])
        queue.POLL_MAX_S = value
        queue.POLL_INITIAL_S = min(queue.POLL_INITIAL_S, value)
        return f"WHAT-IF poll={value:g}: huey consumers poll at most every {value:g} s (monkeypatched)"
    raise SystemExit(f"--what-if: unknown experiment {spec!r} (dispatch-first, poll=SECONDS)")
