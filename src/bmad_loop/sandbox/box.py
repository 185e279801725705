"""A ready box: its mounts, the wrapper that starts a command in it, and its environment.

The environment sends the objects the boxed process's git writes to a quarantine folder in its
scratch (`GIT_OBJECT_DIRECTORY`), with the repository's own store as an alternate: git works
(status, diff, add, even a commit's objects) while the real object store stays read-only.
Nothing in the quarantine reaches the repository: bmad-loop commits the agent's files itself.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .bwrap import bwrap_argv
from .mode import BoxDecision
from .plan import BoxRequest, Mount, home_git_files, plan_mounts, tmux_socket_folder, writable_in
from .programs import box_search_path, placeholder_folders
from .seatbelt import sandbox_exec_argv

__all__ = ["Box", "make_box", "quarantine_has_objects", "clear_quarantine", "QUARANTINE",
           "SANDBOX_VAR"]

QUARANTINE = "objects"  # inside the scratch folder
# In every agent's and verify command's environment: the box it runs in ("bwrap",
# "sandbox-exec"), empty when unboxed; for wrappers that adapt (a CLI's own nested sandbox).
SANDBOX_VAR = "BMAD_LOOP_SANDBOX"


@dataclass(frozen=True)
class Box:
    backend: str  # "bwrap" | "sandbox-exec"
    program: str
    mounts: tuple[Mount, ...]
    cwd: str
    env: dict = field(default_factory=dict)  # added to the boxed process's environment

    def summary(self) -> str:
        """The box in one line for a log's header: its backend and what it may write."""
        writable = [str(m.path) for m in self.mounts if m.kind == "rw"]
        return f"boxed ({self.backend}): writable {', '.join(writable) or 'nothing'}"

    def wrap(self, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """`argv` in the box, started in `cwd` (a folder of the tree; default: the tree), so
        a command runs where it would unboxed (a merge rule's `cwd`)."""
        if self.backend == "bwrap":
            return bwrap_argv(self.program, self.mounts, argv, cwd or self.cwd)
        return sandbox_exec_argv(self.program, self.mounts, argv)


def make_box(decision: BoxDecision, req: BoxRequest) -> Box | None:
    """The box `req` describes, or None when `decision` runs unboxed. Creates the scratch
    folder and its quarantine, and empty placeholders for git's configuration files in the home
    that do not exist yet (a mount needs something to cover; an empty file means no setting)."""
    if not decision.boxed:
        return None
    _own_tmux_folder()
    quarantine = req.scratch / QUARANTINE
    for sub in ("info", "pack"):
        (quarantine / sub).mkdir(parents=True, exist_ok=True)
    _folder_placeholders(plan_mounts(req), placeholder_folders(req.env))
    mounts = plan_mounts(req)  # again: the placeholders may need pins of their own
    _placeholders([m.path for m in mounts if m.kind == "ro"], home_git_files(req.env))
    env = {"GIT_OBJECT_DIRECTORY": str(quarantine),
           "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(Path(req.git_dir) / "objects")}
    if req.env.get("PATH"):
        env["PATH"] = box_search_path(req.env)
    return Box(decision.backend, decision.program, tuple(mounts), str(req.tree), env)


def quarantine_has_objects(scratch: Path) -> bool:
    """Did the boxed git write any object (so the index may name objects the store lacks)?"""
    quarantine = scratch / QUARANTINE
    for _root, _dirs, files in os.walk(quarantine):
        if files:
            return True
    return False


def clear_quarantine(scratch: Path) -> None:
    shutil.rmtree(scratch / QUARANTINE, ignore_errors=True)


def _own_tmux_folder() -> None:
    """tmux's socket folder, made as tmux makes it (0700) when absent, so the box hides it: a
    box that made it first could keep bmad-loop's `[adapter] tmux` server from starting."""
    folder = tmux_socket_folder()
    try:
        folder.mkdir(mode=0o700)
    except OSError:
        pass  # there already (or a /tmp we cannot write: nor can the box)


def _folder_placeholders(mounts: list[Mount], folders: list[Path]) -> None:
    """An empty folder for each absent one of `folders` the box could otherwise create (under
    a writable mount): a folder on PATH, `~/.local/bin`, the user site. Bound read-only, it
    stays empty for the box."""
    for folder in folders:
        real = Path(os.path.realpath(folder))
        if os.path.lexists(folder) or not writable_in(mounts, real.parent):
            continue
        try:
            real.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # a folder we cannot make: the box cannot either


def _placeholders(read_only: list[Path], home_files: list[Path]) -> None:
    for path in home_files:
        if path not in read_only or os.path.lexists(path):
            continue
        try:
            if path.name == "git":  # ~/.config/git: a folder
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
                os.close(fd)
        except OSError:
            pass  # a home we cannot write to: the box cannot write there either
