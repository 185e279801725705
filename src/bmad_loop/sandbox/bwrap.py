"""A box plan as a bubblewrap command line (Linux)."""

from __future__ import annotations

from typing import Sequence

from .plan import Mount
from .probe import BWRAP_ALWAYS

__all__ = ["bwrap_argv"]

_FLAG = {"rw": "--bind", "ro": "--ro-bind", "pin": "--bind"}  # a pin: bound onto itself


def bwrap_argv(program: str, mounts: Sequence[Mount], argv: Sequence[str], cwd: str) -> list[str]:
    """`argv` run by `program` (bwrap) in a box made of `mounts`, in order, over a read-only
    root with a fresh /dev and /proc; the process starts in `cwd`. Paths that do not exist are
    left out (`*-try`): what is not there stays as the read-only root shows it."""
    out = [program, *BWRAP_ALWAYS, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for mount in mounts:
        path = str(mount.path)
        if mount.kind == "hide":
            out += ["--tmpfs", path]
        elif mount.kind == "mask":  # a socket: connecting to /dev/null is refused
            out += ["--ro-bind-try", "/dev/null", path]
        else:
            out += [_FLAG[mount.kind] + "-try", path, path]
    # A hidden folder is an empty, read-only tmpfs once everything shown inside it is mounted:
    # writing there fails instead of landing in memory where nobody looks.
    for mount in mounts:
        if mount.kind == "hide":
            out += ["--remount-ro", str(mount.path)]
    out += ["--chdir", cwd, "--", *argv]
    return out
