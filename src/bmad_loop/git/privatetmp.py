"""Throw-away folders for bmad-loop's own git work, where no box can write.

The system temp folders are writable in every box: a folder bmad-loop made there (the
committed attributes a merge reads, a temporary index) could be filled by a sibling agent
between its creation and its use (a `* merge=union` line planted in the attributes). These
folders live in the repository's git directory instead, which every box binds read-only.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["PRIVATE_TMP", "private_temp"]

PRIVATE_TMP = "bmad-loop-tmp"  # in the git common dir


@contextmanager
def private_temp(git, prefix: str) -> Iterator[Path]:
    """A new empty folder only this user can enter, removed afterwards."""
    base = git.common_dir() / PRIVATE_TMP
    base.mkdir(mode=0o700, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=prefix, dir=base) as folder:
        yield Path(folder)
