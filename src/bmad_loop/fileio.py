"""Small file helpers shared across bmad-loop."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

__all__ = ["shown", "write_atomic"]

# A lone surrogate: how Python holds a byte of a file name that is not UTF-8 (`surrogateescape`).
_SURROGATE = re.compile("[\ud800-\udfff]")


def shown(text: str) -> str:
    """`text` fit to print or to store as text: each byte of a name that is not UTF-8 (held as
    a surrogate) written `\\xff`, any other lone surrogate `\\udXXX`. Anything else is kept as is.
    git accepts any bytes in a name; JSON keeps them exactly (`\\udcff`), text shows them so."""
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(lambda m: (f"\\x{ord(m[0]) - 0xDC00:02x}" if 0xDC80 <= ord(m[0]) <= 0xDCFF
                                     else f"\\u{ord(m[0]):04x}"), text)


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
