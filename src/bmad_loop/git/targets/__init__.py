"""Where the target branch lives and how it moves: one seam, two implementations.

`LocalTarget`: the project's own repository; the target advances by `update-ref NEW OLD` and
the checkout that has it checked out follows. `RemoteTarget`: a shared git remote that every
consumer reaches from its own clone; the target advances by a leased push. The engine talks
to a `Target` only, so the mode is chosen once, here, by `make_target`.
"""

from __future__ import annotations

from pathlib import Path

from ..runner import Git
from .base import Target
from .local import LocalTarget
from .remote import RemoteTarget

__all__ = ["Target", "LocalTarget", "RemoteTarget", "make_target"]


def make_target(git: Git, branch: str, remote_url: str | None, *,
                checkout: Path | None = None) -> Target:
    """The target `branch` as this process sees it: on `remote_url`, or in `git`'s repository.

    `checkout` is the folder the run was planned from (local mode reads story files there)."""
    if remote_url:
        return RemoteTarget(git, branch, remote_url)
    return LocalTarget(git, branch, checkout=checkout)
