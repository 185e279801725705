"""The journal's vocabulary is one registry (`EventKind`): docs/cli.md's event table lists
exactly its kinds, and every kind the source records by name is in it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from bmad_loop.engine.journal import EventKind
from bmad_loop.states import RunState

ROOT = Path(__file__).resolve().parents[1]
KIND = re.compile(r"[a-z_]+\.[a-z_]+")


def documented_kinds() -> set[str]:
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("The event kinds:"):]
    table = table[:table.index("\n## ")]
    kinds = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            first_column = line.split("|")[1]
            kinds |= {k for k in re.findall(r"`([^`]+)`", first_column) if KIND.fullmatch(k)}
    return kinds


# The functions that journal a kind given to them: `record` and the wrappers around it.
JOURNALING = {"record", "_journal", "_journal_live_runs"}


def recorded_literals() -> dict[str, str]:
    """Each literal kind passed to a journaling call in the package, with where."""
    found = {}
    for path in sorted((ROOT / "src" / "bmad_loop").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "func", None)
            name = getattr(name, "id", None) or getattr(name, "attr", None)
            if not isinstance(node, ast.Call) or name not in JOURNALING:
                continue
            for arg in node.args:
                if isinstance(arg, ast.Constant) and KIND.fullmatch(str(arg.value)):
                    found[arg.value] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def test_the_docs_event_table_lists_exactly_the_registered_kinds():
    registered = {kind.value for kind in EventKind}
    documented = documented_kinds()
    assert sorted(registered - documented) == [], "registered but not in docs/cli.md"
    assert sorted(documented - registered) == [], "in docs/cli.md but not registered"


def test_every_kind_recorded_by_name_is_registered():
    literals = recorded_literals()
    assert len(literals) > 40  # the scan sees the call sites
    assert {k: where for k, where in literals.items() if k not in set(EventKind)} == {}


def test_the_run_states_journaled_by_name_are_registered():
    # The lane and the retry path record f"run.{state}" for the state a run settles in.
    for state in set(RunState) - {RunState.RUNNING}:
        assert EventKind(f"run.{state}")


def test_each_kind_says_what_it_means_in_one_line():
    for kind in EventKind:
        assert kind.meaning and "\n" not in kind.meaning and len(kind.meaning) < 100, kind
