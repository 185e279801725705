"""Merge attributes from the target's committed tree, never from a checkout.

``git merge-tree`` reads ``.gitattributes`` from the working tree it runs in: run from the main
checkout, an uncommitted edit there (a new ``merge=union`` line, a deleted ``binary``) would
change how the same inputs compose. git 2.40 has ``--attr-source``; 2.38 and 2.39 do not, and
``merge-tree --write-tree`` reads no index. So the lane runs it in a throw-away folder that holds
the target tree's ``.gitattributes`` files and nothing else, with ``GIT_DIR`` naming the
repository: git then sees exactly the committed attributes (plus the repository's
``info/attributes`` and the user's ``core.attributesFile``, which are configuration, as merge
drivers in ``.git/config`` are).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..privatetmp import private_temp
from ..runner import Git
from .edit import read_objects

__all__ = ["AttributeRoot", "committed_attributes"]

ATTRIBUTES = ".gitattributes"


class AttributeRoot:
    """Where a merge runs: `cwd` and the `env` that points git at the repository."""

    def __init__(self, cwd: Path, env: dict[str, str]):
        self.cwd, self.env = cwd, env


@contextmanager
def committed_attributes(git: Git, tree: str) -> Iterator[AttributeRoot]:
    """A folder holding `tree`'s `.gitattributes` files (commit or tree), removed afterwards."""
    listing = git.out("ls-tree", "-r", "-z", "--name-only", tree).split("\0")
    names = [p for p in listing if p == ATTRIBUTES or p.endswith("/" + ATTRIBUTES)]
    with private_temp(git, "attrs-") as root:  # never the shared /tmp, which boxes write
        folder = os.fspath(root)
        for name, obj in zip(names, read_objects(git, [f"{tree}:{n}" for n in names])):
            if obj is None or obj[1] != "blob":
                continue
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(obj[2])
        yield AttributeRoot(root, {"GIT_DIR": os.fspath(git.common_dir()), "GIT_WORK_TREE": folder})
