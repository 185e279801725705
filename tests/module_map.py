"""The module map (docs/modules.md), made from each module's docstring.

    python tests/module_map.py          # print it
    python tests/module_map.py --write  # write docs/modules.md

`tests/test_structure.py` fails when docs/modules.md differs from what this prints, so the map
never drifts from the tree: change a docstring or a module, then run it with `--write`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "bmad_loop"
MAP = ROOT / "docs" / "modules.md"

HEADER = """# Module map

Generated from the modules' docstrings by `python tests/module_map.py --write` (a test fails when
this page is stale). Rooms are listed in the order their layers point: each room imports only the
rooms above it (`tests/test_structure.py` holds that). The overview is
[architecture.md](architecture.md).
"""


def summary(path: Path) -> str:
    """A module's docstring up to its first blank line, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = doc.split("\n\n", 1)[0]
    return " ".join(first.split()).replace("|", "\\|")


def render(layers: list[str]) -> str:
    out = [HEADER]
    for room in layers:
        if room == "__main__":
            continue
        folder = PACKAGE if room == "base" else PACKAGE.joinpath(*room.split("."))
        modules = sorted(p for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
        if not modules:
            continue
        title = "package root" if room == "base" else room.replace(".", "/") + "/"
        out += [f"## `{title}`", "", "| module | what it is |", "| --- | --- |"]
        out += [f"| `{p.name}` | {summary(p)} |" for p in modules]
        out.append("")
    return "\n".join(out)


def layers() -> list[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_structure import LAYERS

    return LAYERS


if __name__ == "__main__":
    text = render(layers())
    if "--write" in sys.argv[1:]:
        MAP.write_text(text)
    else:
        print(text, end="")
