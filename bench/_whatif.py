"""`--what-if`: experiments that change the engine's behaviour in this process only.

They monkeypatch the engine to show what a change would buy before anyone makes it; the
engine's code is not touched, and a run with a what-if is not a measurement of bmad-loop as
shipped. Each prints a banner.

- ``dispatch-first``: at ``max_parallel > 1`` the lane admits pending stories into free slots
  before each integration (the shipped lane now does this itself: `LanePass._dispatch_first`
  in engine/lane/tick.py; the experiment is kept to compare with the lane that integrated every
  ready story first, so a slot freed while it integrated a batch stayed empty until the batch
  was done). Not at N = 1 (the sequential
  loop must keep its bases and history), and not once a story is parked.
- ``poll=SECONDS``: the huey consumers' maximum poll back-off (`POLL_MAX_S` in queue/queues.py, shipped
  0.05 s), e.g. ``poll=0.02``.
- ``switch=SECONDS``: the interpreter's thread switch interval (``sys.setswitchinterval``, 0.005 s
  by default), to see whether the lane and the workers wait on each other for the GIL.
"""

from __future__ import annotations


def apply(spec: str) -> str:
    """Apply one what-if; returns its banner."""
    if spec == "dispatch-first":
        from bmad_loop.engine.lane import tick as lane

        original = lane.LanePass._integrate_next
        stopping = ("escalated", "blocked", "held", "failed")

        def integrate_next(self, run, stories):
            # Fill free slots first; not at max_parallel = 1 (the sequential loop integrates a
            # story before it starts the next one: same bases, same history), and not once a
            # story is parked (escalation must stop dispatching).
            if (run.state == "running" and run.max_parallel > 1
                    and not any(x.state in stopping for x in stories)):
                if self._dispatch(run, stories):
                    run, stories = self._load()
            return original(self, run, stories)

        lane.LanePass._integrate_next = integrate_next
        return ("WHAT-IF dispatch-first: at max_parallel > 1 the lane dispatches into free "
                "slots before each integration (monkeypatched)")
    if spec.startswith("poll="):
        from bmad_loop.queue import queues as queue

        value = float(spec.split("=", 1)[1])
        queue.POLL_MAX_S = value
        queue.POLL_INITIAL_S = min(queue.POLL_INITIAL_S, value)
        return f"WHAT-IF poll={value:g}: huey consumers poll at most every {value:g} s (monkeypatched)"
    if spec.startswith("switch="):
        import sys

        value = float(spec.split("=", 1)[1])
        sys.setswitchinterval(value)
        return f"WHAT-IF switch={value:g}: the interpreter's thread switch interval is {value:g} s"
    raise SystemExit(f"--what-if: unknown experiment {spec!r} "
                     "(dispatch-first, poll=SECONDS, switch=SECONDS)")
