"""Run an agent inside a detached tmux session, so `bmad-loop attach` can watch it live.

Used when `[adapter] tmux = true`: the worker runs

    python -m bmad_loop.agents.tmux_session SESSION LOG -- ARGV…

as the agent process. This wrapper starts `ARGV` in a new detached tmux session (same cwd and
environment), mirrors the pane into its own output through a FIFO (so the session log, which
bmad-loop writes from that output, keeps its `[limits] max_log_bytes` cap), waits for the
agent to exit and exits with its code. A SIGTERM (timeout, `stop --now`) kills the tmux session and with it the agent,
so the process-tree kill still reaches an agent that lives under the tmux server.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["session_name", "tmux_available", "main", "TMUX", "SOCKET"]

# A server of bmad-loop's own, so sessions never mix with the user's tmux.
SOCKET = "bmad-loop"
TMUX = ["tmux", "-L", SOCKET]
# The adapter finds an agent's stray processes by this variable; the tmux server must not carry
# it, or ending one session would end the server and every other agent's session with it.
PRIVATE = ("BMAD_LOOP_SESSION_TOKEN",)


def session_name(run_id: str, key: str, phase: str, number: int) -> str:
    """tmux refuses '.' and ':' in session names."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", f"bmad-{run_id}-{key}-{phase}-{number}")


def tmux_available() -> bool:
    from shutil import which

    return which("tmux") is not None


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m bmad_loop.agents.tmux_session SESSION LOG -- ARGV…", file=sys.stderr)
        return 2
    name, command = argv[0], argv[3:]  # argv[1], the log, is written by bmad-loop from our output
    # Beside the log, in the state folder no box can see (a sibling agent could write a
    # shared /tmp folder: a false exit status, a fake pane).
    exit_file = Path(tempfile.mkdtemp(prefix="tmux-", dir=Path(argv[1]).parent)) / "exit"
    ready = exit_file.with_name("ready")
    # The command waits until the pane is mirrored into the log, so no output is lost.
    script = (f"while [ ! -f {shlex.quote(str(ready))} ]; do sleep 0.02; done; "
              f"{shlex.join(command)}; echo $? > {shlex.quote(str(exit_file))}")
    clean = {k: v for k, v in os.environ.items() if k not in PRIVATE}
    env_args = []
    for key, value in clean.items():
        if key.startswith(("BMAD_LOOP_", "GIT_CONFIG_")) or key in ("TMPDIR", "PATH", "HOME"):
            env_args += ["-e", f"{key}={value}"]
    subprocess.run([*TMUX, "new-session", "-d", "-s", name, "-x", "200", "-y", "50",
                    "-c", os.getcwd(), *env_args, "sh", "-c", script], check=True, env=clean)
    mirror = exit_file.with_name("pane")
    os.mkfifo(mirror, 0o600)
    copier = threading.Thread(target=_copy_to_stdout, args=(mirror,), daemon=True)
    copier.start()
    subprocess.run([*TMUX, "pipe-pane", "-t", name, "-o", f"cat >> {shlex.quote(str(mirror))}"],
                   check=False, env=clean)
    ready.write_text("")

    def end(signum, frame):
        subprocess.run([*TMUX, "kill-session", "-t", name], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGINT, end)
    while not exit_file.exists():
        alive = subprocess.run([*TMUX, "has-session", "-t", name], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL).returncode == 0
        if not alive and not exit_file.exists():
            return 125  # the session vanished without an exit status (killed by hand)
        time.sleep(0.1)
    code = int(exit_file.read_text().strip() or 1)
    subprocess.run([*TMUX, "kill-session", "-t", name], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    copier.join(timeout=5)  # the pane's last output, once its mirror ends with the session
    shutil.rmtree(exit_file.parent, ignore_errors=True)
    return code


def _copy_to_stdout(fifo: Path) -> None:
    """The pane's mirror, as it comes, onto this process's output (the session log's pipe)."""
    try:
        with open(fifo, "rb", buffering=0) as source:
            while chunk := source.read(65536):
                os.write(1, chunk)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
