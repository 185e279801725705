"""Match concrete repository paths against gitignore-style globs (footprints, lane-owned files).

A pattern without a slash (ignoring a trailing one) matches at any depth; a leading `/`
anchors it at the root; `*` and `?` stay within one segment, `**` spans segments; a pattern
that names a directory also covers everything below it.
"""

from __future__ import annotations

import functools
import re

__all__ = ["path_matches", "path_matches_any"]


@functools.lru_cache(maxsize=4096)
def _compile(pattern: str) -> re.Pattern:
    pat = pattern.strip()
    anchored = pat.startswith("/")
    pat = pat.strip("/")
    if not anchored and "/" not in pat:
        pat = "**/" + pat
    out = []
    parts = pat.split("/")
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            out.append("(?:.*/)?" if not last else ".*")
            continue
        out.append(_segment(part) + ("" if last else "/"))
    # A match may be the path itself or a directory above it.
    return re.compile("^" + "".join(out) + "(?:/.*)?$")


def _segment(part: str) -> str:
    result, i = [], 0
    while i < len(part):
        ch = part[i]
        if ch == "*":
            result.append("[^/]*")
        elif ch == "?":
            result.append("[^/]")
        elif ch == "[":
            end = part.find("]", i + 1)
            if end == -1:
                result.append(re.escape(ch))
            else:
                body = part[i + 1:end].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                result.append(f"[{body}]")
                i = end
        else:
            result.append(re.escape(ch))
        i += 1
    return "".join(result)


def path_matches(path: str, pattern: str) -> bool:
    return bool(_compile(pattern).match(path.strip("/")))


def path_matches_any(path: str, patterns) -> bool:
    return any(path_matches(path, p) for p in patterns)
