"""Is the OS sandbox usable on this host? Asked by running it once on `true`.

bubblewrap is often installed but refused (Ubuntu 24.04+'s AppArmor rule on user namespaces,
Docker's default seccomp profile), so being on PATH proves nothing: the probe starts a trivial
box with the same namespace options every session uses. The executable is the trusted one
(`programs.trusted_program`: looked up once per process, never a file others may write), and
the answer is kept for the life of the process (one probe per run, not one per session).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from ..caches import CACHES
from .programs import trusted_program, untrusted_reason

__all__ = ["BWRAP_ALWAYS", "Probe", "probe_bwrap", "probe_sandbox_exec"]

# Every bubblewrap box: a user namespace (as root, no real capability reaches the host), its own
# pid namespace and session (no TIOCSTI, no signals or /proc/<pid>/root into the host), dies
# with bmad-loop, may not create namespaces of its own (no nested box), and holds no capability
# even inside its namespace (so root inside cannot mount or remount).
BWRAP_ALWAYS = ("--unshare-user", "--unshare-pid", "--new-session", "--die-with-parent",
                "--disable-userns", "--cap-drop", "ALL")
_PROBE_TIMEOUT_S = 20
_cache: dict[str, "Probe"] = {}
CACHES.register("sandbox.probes", _cache.clear, bound="one per kind of box asked for",
               holds="program -> whether that sandbox starts on this machine")


@dataclass(frozen=True)
class Probe:
    ok: bool
    program: str  # the executable's path ("" when none was found)
    detail: str  # why not, in one line (empty when ok)


def probe_bwrap() -> Probe:
    program = trusted_program("bwrap")  # once per process; never one planted in the home
    if not program:
        planted = shutil.which("bwrap")
        if planted:
            return Probe(False, "", f"no trusted bubblewrap (bwrap) on PATH: "
                                    f"{untrusted_reason(planted)}")
        return Probe(False, "", "bubblewrap (bwrap) is not installed")
    argv = [program, *BWRAP_ALWAYS, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "true"]
    return _cached(program, argv)


def probe_sandbox_exec() -> Probe:
    program = shutil.which("sandbox-exec") or ""
    if not program:
        return Probe(False, "", "sandbox-exec is not available")
    return _cached(program, [program, "-p", "(version 1)(allow default)", "/usr/bin/true"])


def _cached(program: str, argv: list[str]) -> Probe:
    if program not in _cache:
        _cache[program] = _run(program, argv)
    return _cache[program]


def _run(program: str, argv: list[str]) -> Probe:
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Probe(False, program, f"{os.path.basename(program)} could not run: {exc}")
    if proc.returncode != 0:
        words = (proc.stderr or proc.stdout).strip().splitlines()
        why = words[-1] if words else f"exited {proc.returncode}"
        return Probe(False, program, f"{os.path.basename(program)} is installed but refused: {why}")
    return Probe(True, program, "")
