"""A box plan as a sandbox-exec profile (macOS).

Not run here: CI has no Mac. The profile is generated from the same mounts as the Linux box and
unit-tested as text. SBPL applies the last rule that matches, so the mounts' order carries over:
writes are denied everywhere, then allowed or denied again folder by folder; a hidden folder
denies reads too; a pinned folder denies writes of the folder itself (renaming or removing
it), not of what is inside. Unlike the Linux box there is no pid or user namespace: the agent sees the
host's processes, and a nested sandbox-exec is refused by macOS itself.
"""

from __future__ import annotations

from typing import Sequence

from .plan import Mount

__all__ = ["seatbelt_profile", "sandbox_exec_argv"]


def seatbelt_profile(mounts: Sequence[Mount]) -> str:
    lines = ["(version 1)", "(allow default)", "(deny file-write*)",
             '(allow file-write* (literal "/dev/null") (literal "/dev/tty") (regex #"^/dev/fd/"))']
    for mount in mounts:
        path = _quote(str(mount.path))
        if mount.kind == "rw":
            lines.append(f"(allow file-read* file-write* (subpath {path}))")
        elif mount.kind == "pin":  # the folder itself (a rename, a removal), not what is in it
            lines.append(f"(deny file-write* (literal {path}))")
        elif mount.kind == "ro":
            lines.append(f"(deny file-write* (subpath {path}))")
        else:  # hidden or masked: not read, not written, no socket in it connected to
            lines.append(f"(deny file-read* file-write* (subpath {path}))")
            lines.append(f"(deny network-outbound (subpath {path}))")
    return "\n".join(lines) + "\n"


def sandbox_exec_argv(program: str, mounts: Sequence[Mount], argv: Sequence[str]) -> list[str]:
    return [program, "-p", seatbelt_profile(mounts), *argv]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
