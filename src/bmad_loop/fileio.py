"""Small file helpers shared across bmad-loop."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` so readers see the old file or the new one, never half of it.

    The file's mode follows the umask, as a plain `open` would (a report is an artifact CI
    publishes; `mkstemp` would make every file 0600 whatever the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
