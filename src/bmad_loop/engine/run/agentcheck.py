"""`validate`'s look at the agent CLI and the BMAD install the sessions will meet.

A profile's flags were checked against one release of its CLI (`checked_version`); an older CLI
may lack a flag and fail every story, so `validate` asks the binary for its version (one short
`--version` call) and says how it compares. It also says which BMAD the project has and what
is seeded into each worktree (`bmadinstall`).
"""

from __future__ import annotations

import re
import shutil
import subprocess

from ...bmad.install import bmad_seeds, detect_bmad
from ...agents.profiles import load_profile

__all__ = ["cli_version", "version_checks", "bmad_checks"]

_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def cli_version(binary: str, timeout_s: float = 10.0) -> str | None:
    """The first line `binary --version` prints, or None when it cannot tell."""
    try:
        proc = subprocess.run([binary, "--version"], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0].strip() if proc.returncode == 0 and lines else None


def _number(text: str) -> tuple[int, int, int] | None:
    m = _VERSION_RE.search(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def version_checks(policy) -> list[dict]:
    """One check for the profile's CLI: ok, or a warning when it is older than the release its
    flags were checked against, or when it will not say its version. None without a profile."""
    adapter = policy.adapter
    if not adapter.profile or adapter.command:
        return []
    profile = load_profile(adapter.profile)
    binary = profile.command[0]
    if shutil.which(binary) is None:
        return []  # the agent check says so, as an error
    shown = cli_version(binary)
    checked = profile.checked_version
    if shown is None:
        return [_check("warn", f"{binary} --version printed no version; the {profile.name} "
                               f"profile was checked against {checked or 'a recent release'}")]
    have, want = _number(shown), _number(checked) if checked else None
    if have and want and have < want:
        return [_check("warn", f"{binary} {shown} is older than {checked}, the release the "
                               f"{profile.name} profile's flags were checked against: update it, "
                               "or a flag it lacks fails every session")]
    against = f" (profile checked against {checked})" if checked else ""
    return [_check("ok", f"{binary} {shown}{against}")]


def bmad_checks(project) -> tuple[list[dict], dict]:
    """What BMAD the project has, and what is seeded into worktrees: (checks, the --json part)."""
    root = project.root
    install = detect_bmad(root)
    scm = project.policy.scm
    seeds = bmad_seeds(project.git(), root) if scm.seed_bmad else []
    if install.kind == "skills":
        names = sorted({path.rsplit("/", 1)[-1] for path in install.skills.values()})
        detail = f"BMAD skills: {', '.join(names)}"
    elif install.kind == "workflows":
        folders = sorted({path.rsplit("/", 1)[0] for path in install.workflows.values()})
        detail = f"BMAD workflow folders in {', '.join(folders)}"
    elif install.kind == "v4":
        detail = "BMAD v4 (.bmad-core/)"
    else:
        # Not a warning: a board kept by hand is a fine way to use bmad-loop.
        return ([_check("ok", "no BMAD install found (no bmad-* skills, no workflow folders, no "
                              ".bmad-core/): agents are told to work by hand", name="bmad")],
                {"bmad": {"kind": "none", "skills": {}, "workflows": {}, "seeded": []}})
    if seeds:
        detail += f"; untracked, so seeded into each worktree: {', '.join(seeds)}"
    return ([_check("ok", detail, name="bmad")],
            {"bmad": {"kind": install.kind, "skills": dict(install.skills),
                      "workflows": dict(install.workflows), "seeded": seeds}})


def _check(status: str, detail: str, name: str = "agent") -> dict:
    return {"name": name, "status": status, "detail": detail}
