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


def docstring_positions(tree: ast.AST) -> set[tuple[int, int]]:
    """Where the docstrings of a module, its classes and its functions start."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add((body[0].value.lineno, body[0].value.col_offset))
    return found


def string_kinds(root: Path = ROOT / "src" / "bmad_loop") -> list[str]:
    """Each string constant in code that equals an event kind, outside `EventKind`'s own body:
    the journal's vocabulary is spoken in members (`EventKind.STORY_LANDED`), never spelled.
    Docstrings do not count, nor text that only contains a kind (SQL, a help line)."""
    kinds = {kind.value for kind in EventKind}
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = docstring_positions(tree)
        registry = {id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                    and c.name == "EventKind" for n in ast.walk(c)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value in kinds and id(node) not in registry
                    and (node.lineno, node.col_offset) not in docs):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    return found


def test_the_docs_event_table_lists_exactly_the_registered_kinds():
    registered = {kind.value for kind in EventKind}
    documented = documented_kinds()
    assert sorted(registered - documented) == [], "registered but not in docs/cli.md"
    assert sorted(documented - registered) == [], "in docs/cli.md but not registered"


def test_no_event_kind_is_spelled_as_a_string_in_the_source():
    assert string_kinds() == []


def test_the_check_finds_a_spelled_kind_and_spares_a_docstring_and_the_registry(tmp_path):
    (tmp_path / "m.py").write_text(
        '"""Records `story.started`: that is "story.started"."""\n'
        'class EventKind:\n    X = "story.started", "meaning"\n'
        'def f(record, s):\n    """story.started"""\n    record(s, "r", "story.started")\n'
        '    return "SELECT kind FROM events WHERE kind = \'story.started\'"\n')
    assert string_kinds(tmp_path) == ["m.py:6: 'story.started'"]


def test_the_run_states_journaled_by_name_are_registered():
    # The lane and the retry path record f"run.{state}" for the state a run settles in.
    for state in set(RunState) - {RunState.RUNNING}:
        assert EventKind(f"run.{state}")


def test_each_kind_says_what_it_means_in_one_line():
    for kind in EventKind:
        assert kind.meaning and "\n" not in kind.meaning and len(kind.meaning) < 100, kind
