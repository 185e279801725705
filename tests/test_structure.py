"""The shape of the source tree: no import cycle, small modules, one base class per seam."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "bmad_loop"
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports, at module level or inside functions."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            candidates = [root] + [f"{root}.{alias.name}" for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = [p for p in PACKAGE.rglob("*.py")]
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imports_of(p, modules) for p in paths}
    # A package importing its own submodules is how Python builds a package, not a cycle.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not d.startswith(name + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_source_tree_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_over_the_size_limit():
    big = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_each_seam_has_one_base_class_and_two_implementations():
    from bmad_loop.engine.inplace import InPlaceWorkspace
    from bmad_loop.engine.workspace import Workspace
    from bmad_loop.engine.worktree_workspace import WorktreeWorkspace
    from bmad_loop.targets import LocalTarget, RemoteTarget, Target

    assert issubclass(LocalTarget, Target) and issubclass(RemoteTarget, Target)
    assert issubclass(WorktreeWorkspace, Workspace) and issubclass(InPlaceWorkspace, Workspace)
    for base in (Target, Workspace):
        assert base.__abstractmethods__  # the base cannot be used on its own


def test_the_engine_chooses_modes_only_inside_the_seams():
    """Remote vs local and worktree vs in place are decided by `make_target` and
    `make_workspace`; the rest of the engine asks the seam."""
    engine = PACKAGE / "engine"
    allowed = {"context.py", "planning.py", "project.py"}  # the factories; validation at enqueue
    offenders = []
    for path in sorted(engine.glob("*.py")):
        if path.name in allowed:
            continue
        text = path.read_text()
        for needle in ("isolation ==", "isolation !=", "remote is None", "remote is not None",
                       ".remote_url", "in_place"):
            if needle in text:
                offenders.append(f"{path.name}: {needle}")
    assert offenders == []
