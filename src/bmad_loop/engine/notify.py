"""Notifications on pause, escalation and run end: a command (JSON on stdin) and/or a webhook.

A notifier that fails or hangs is recorded in the journal and never stops the run.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Sequence
from typing import Any

from .journal import EventKind, record
from ..db.database import Database
from ..policy import Policy

__all__ = ["notify"]


def notify(db: Database, policy: Policy, run_id: str, event: str, **payload: Any) -> None:
    cfg = policy.notify
    if not cfg.command and not cfg.webhook:
        return
    body = json.dumps({"event": event, "run": run_id, **payload}, default=str)
    outcomes = []
    if cfg.command:
        outcomes.append(("command", _run_command(list(cfg.command), body, cfg.timeout_s)))
    if cfg.webhook:
        outcomes.append(("webhook", _post(cfg.webhook, body, cfg.timeout_s)))
    with db.transaction() as s:
        for channel, error in outcomes:
            if error:
                record(s, run_id, EventKind.NOTIFY_FAILED, payload.get("story"), channel=channel,
                       event=event, error=error)
            else:
                record(s, run_id, EventKind.NOTIFY_SENT, payload.get("story"), channel=channel, event=event)


def _run_command(argv: Sequence[str], body: str, timeout_s: float) -> str | None:
    """Run the notifier in its own process group; on timeout the whole group is killed."""
    import os
    import signal

    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError as exc:
        return str(exc)
    try:
        _, err = proc.communicate(body, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        return f"timed out after {timeout_s}s"
    if proc.returncode != 0:
        return f"exited {proc.returncode}: {(err or '').strip()[-500:]}"
    return None


def _post(url: str, body: str, timeout_s: float) -> str | None:
    request = urllib.request.Request(url, data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            if response.status >= 400:
                return f"HTTP {response.status}"
    except Exception as exc:  # any network failure is only journaled
        return str(exc)
    return None
