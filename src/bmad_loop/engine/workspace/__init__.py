"""Where a story's work happens: the `Workspace` seam, worktrees per story (with a pool of
parked ones), the project's own checkout, and the guard that keeps agents off the target.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...bmad.install import bmad_seeds
from .base import Workspace
from .inplace import InPlaceWorkspace
from .worktree import WorktreeWorkspace
from ...git.runner import Git
from ..runpaths import Layout
from ...policy import Policy
from ...git.targets import Target

if TYPE_CHECKING:
    from ...agents.profiles import Profile

__all__ = ["Workspace", "make_workspace"]


def make_workspace(policy: Policy, git: Git, layout: Layout, target: Target, *, root: Path,
                   profile: Profile | None = None) -> Workspace:
    """The workspace the policy's `[scm] isolation` asks for."""
    scm = policy.scm
    fixed = list(scm.worktree_seed)
    if scm.seed_adapter_defaults and profile is not None:
        fixed += list(profile.seed_files)

    def seeds() -> list[str]:  # listed on first use: it costs a git process
        if not scm.seed_bmad or scm.isolation == "none":
            return fixed
        return fixed + [p for p in bmad_seeds(git, root) if p not in fixed]

    kind = InPlaceWorkspace if scm.isolation == "none" else WorktreeWorkspace
    return kind(git, layout, target, scm, root=root, seeds=seeds)
