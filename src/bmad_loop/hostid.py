"""The name this process goes by in leases, heartbeats and rows: `BMAD_LOOP_HOST` or the hostname.

Hosts fail independently, so everything a host owns carries its name. Set `BMAD_LOOP_HOST`
(or `worker --host`) when several "hosts" share one machine — containers that all report the
same hostname, or the multi-host test — so each one's leases, worktrees and clean-up stay its own.
"""

from __future__ import annotations

import os
import socket

__all__ = ["host_name", "HOST_ENV"]

HOST_ENV = "BMAD_LOOP_HOST"


def host_name() -> str:
    return os.environ.get(HOST_ENV, "").strip() or socket.gethostname()
