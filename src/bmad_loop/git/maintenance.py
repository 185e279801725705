"""git's automatic maintenance, run once when a run settles instead of after every commit.

``git commit`` (and ``fetch``) start ``git maintenance run --auto`` when they are done: one
more git process per commit (~2 ms here), which mostly finds nothing to do. bmad-loop's own
commits and fetches pass ``-c maintenance.auto=false`` (`NO_AUTO_MAINTENANCE`), and the lane
runs the same check once when the run settles (completed, paused, stopped, failed), so the
repository is still kept as git would keep it. A user who turned ``maintenance.auto`` off gets
none from us either. Older git (before ``git maintenance``, 2.29) runs ``gc --auto`` instead.
"""

from __future__ import annotations

import logging

from ..errors import GitError

__all__ = ["NO_AUTO_MAINTENANCE", "run_deferred_maintenance"]

log = logging.getLogger(__name__)

# Global options for a commit or fetch of ours: no automatic maintenance after it.
NO_AUTO_MAINTENANCE = ("-c", "maintenance.auto=false")


def run_deferred_maintenance(git) -> bool:
    """What ``git commit`` would have started, once: True when maintenance was asked for. Never
    raises: housekeeping must not fail a run."""
    try:
        wanted = git.run("config", "--type=bool", "--get", "maintenance.auto", check=False)
        if wanted.returncode == 0 and wanted.stdout.strip() == "false":
            return False
        proc = git.run("maintenance", "run", "--auto", "--quiet", check=False)
        if proc.returncode != 0 and "maintenance" in (proc.stderr or ""):
            proc = git.run("gc", "--auto", "--quiet", check=False)  # git before 2.29
        return proc.returncode == 0
    except (GitError, OSError) as exc:
        log.warning("git maintenance after the run could not run (%s)", exc)
        return False
