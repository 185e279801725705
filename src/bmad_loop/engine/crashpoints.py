"""Named crash points: a documented way to kill bmad-loop with SIGKILL at an exact step.

Set `BMAD_LOOP_CRASH_AT=<point>[,<point>…]` in a consumer's environment; with
`BMAD_LOOP_CRASH_ONCE=<file>` the crash happens only while that file does not exist (it is
created just before the kill), so a restarted consumer with the same environment carries on.
The crash matrix tests and `bench/chaos.py` use this; it costs one dict lookup when unset.

Named delay points hold a step instead of killing it, for tests of slow steps: with
`BMAD_LOOP_DELAY_AT=<point>[,<point>…]` and `BMAD_LOOP_DELAY_DIR=<dir>`, the step writes
`<dir>/<point>.reached` (its pid) and blocks until `<dir>/<point>.go` exists — a file barrier
the test controls, never a timed sleep. Also one dict lookup when unset.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

__all__ = ["crash_point", "CRASH_POINTS", "REPAIR_CRASH_POINTS", "CRASH_ENV", "ONCE_ENV", "delay_point", "DELAY_POINTS",
           "DELAY_ENV", "DELAY_DIR_ENV"]

CRASH_ENV = "BMAD_LOOP_CRASH_AT"
ONCE_ENV = "BMAD_LOOP_CRASH_ONCE"
DELAY_ENV = "BMAD_LOOP_DELAY_AT"
DELAY_DIR_ENV = "BMAD_LOOP_DELAY_DIR"

DELAY_POINTS = (
    "worker.in_prepare",       # the worktree is made, the row does not name it yet
    "worker.in_commit",        # the story's commit is made, its footprint not yet checked
    "lane.in_compose",         # a quick candidate is composed, its row (and integrating) not written
    "run.enqueued",            # `run` enqueued its run and counts Ctrl+C, the driver not started
)

CRASH_POINTS = (
    "worker.after_worktree",   # worktree and branch exist, nothing else done
    "worker.in_agent",         # the agent session is running
    "worker.after_agent",      # the session ended, its outcome not yet written
    "worker.after_commit",     # the branch is committed, the story not yet ready
    "worker.after_ready",      # the story is ready; the lane not yet woken, its worktree not parked
    "lane.after_compose",      # the candidate commit exists, not yet verified
    "lane.after_verify",       # verified, not yet advanced
    "lane.after_cas",          # the target moved; its checkout and the row not yet
    "lane.after_sync",         # the target and its checkout moved, the row does not say so yet
    "lane.during_cleanup",     # integrated; worktree/branch clean-up half done
)

# The points of the repair path: a sprint that needs a flake retry, a target check and a repair
# reaches them (tests/test_repairs.py holds each), the plain matrix above does not.
REPAIR_CRASH_POINTS = (
    "verify.before_retry",       # a verify command failed; its retry not yet started
    "lane.before_blame",         # a candidate failed; nothing decided about its story yet
    "lane.in_target_check",      # the target check's row says running; the check not run yet
    "worker.after_repair_merge", # the repair's merge is recorded in the row, not yet checked out
    "worker.in_repair",          # the repair session is running
    "worker.after_repair_commit",  # the two-parent merge is committed, the story not yet ready
)


def crash_point(name: str) -> None:
    wanted = os.environ.get(CRASH_ENV)
    if not wanted or name not in wanted.split(","):
        return
    marker = os.environ.get(ONCE_ENV)
    if marker:
        path = Path(marker)
        if path.exists():
            return
        path.write_text(name)
    os.kill(os.getpid(), signal.SIGKILL)


def delay_point(name: str) -> None:
    wanted = os.environ.get(DELAY_ENV)
    if not wanted or name not in wanted.split(","):
        return
    folder = Path(os.environ.get(DELAY_DIR_ENV) or ".")
    (folder / f"{name}.reached").write_text(str(os.getpid()))
    go = folder / f"{name}.go"
    while not go.exists():
        time.sleep(0.02)
