"""The shape of the source tree: layers that point down, no import cycle, modules under a
reader's size (800 lines; folders hold what their idea needs), one base class per seam."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "bmad_loop"
MAX_LINES = 800


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


# The rooms of the package, lowest first: a room may import itself and the rooms before it,
# never one after it. `base` is the package's own top-level modules (errors, states, ...);
# `__main__` is the entry point. The flow: cli -> operator -> engine (run -> lane -> worker
# -> verification -> workspace -> engine's shared rows) -> queue -> db -> bmad -> git -> policy
# -> agents. Verification is a service below both the worker and the lane.
LAYERS = [
    "base", "sandbox", "agents", "agents.profiles", "policy",
    "git", "git.trees", "git.targets", "bmad", "db", "queue",
    "engine", "engine.workspace", "engine.verification", "engine.worker", "engine.lane",
    "engine.run",
    "operator", "operator.report", "cli", "__main__",
]


def room_of(module: str) -> str:
    """The room a module belongs to: its package's path below `bmad_loop`, or `base`."""
    if module == "bmad_loop.__main__":
        return "__main__"
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    if not (path / "__init__.py").exists():
        parts = parts[:-1]
    return ".".join(parts) or "base"


def layer_breaks(graph: dict[str, set[str]]) -> list[str]:
    rank = {room: n for n, room in enumerate(LAYERS)}
    found = []
    for module, deps in sorted(graph.items()):
        for dep in sorted(deps):
            here, there = room_of(module), room_of(dep)
            if rank[there] > rank[here]:
                found.append(f"{module} ({here}) imports {dep} ({there})")
    return found


def test_every_room_of_the_package_has_a_place_in_the_layers():
    rooms = {room_of(m) for m in import_graph()}
    assert rooms - set(LAYERS) == set()


def test_layers_only_point_down():
    """Nothing outside engine/, operator/ and cli/ imports them; engine/ imports neither
    operator/ nor cli/; operator/ does not import cli/; and so on down the list, room by room
    (a subpackage is a room of its own, so engine/lane/ cannot import engine/run/)."""
    assert layer_breaks(import_graph()) == []


def test_the_layer_check_finds_an_upward_import():
    graph = {"bmad_loop.git.runner": {"bmad_loop.engine.journal"},
             "bmad_loop.engine.journal": {"bmad_loop.errors"}}
    assert layer_breaks(graph) == ["bmad_loop.git.runner (git) imports bmad_loop.engine.journal (engine)"]


def test_the_rooms_form_no_cycle():
    rooms: dict[str, set[str]] = {}
    for module, deps in import_graph().items():
        here = room_of(module)
        rooms.setdefault(here, set()).update(room_of(d) for d in deps if room_of(d) != here)
    assert cycles(rooms) == []


def test_no_module_is_over_the_size_limit():
    big = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_each_seam_has_one_base_class_and_two_implementations():
    from bmad_loop.engine.workspace.inplace import InPlaceWorkspace
    from bmad_loop.engine.workspace.base import Workspace
    from bmad_loop.engine.workspace.worktree import WorktreeWorkspace
    from bmad_loop.git.targets import LocalTarget, RemoteTarget, Target

    assert issubclass(LocalTarget, Target) and issubclass(RemoteTarget, Target)
    assert issubclass(WorktreeWorkspace, Workspace) and issubclass(InPlaceWorkspace, Workspace)
    for base in (Target, Workspace):
        assert base.__abstractmethods__  # the base cannot be used on its own


def test_the_engine_chooses_modes_only_inside_the_seams():
    """Remote vs local and worktree vs in place are decided by `make_target` and
    `make_workspace`; the rest of the engine asks the seam."""
    engine = PACKAGE / "engine"
    # the factories; validation at enqueue
    allowed = {"workspace/__init__.py", "run/planning.py", "project.py"}
    offenders = []
    for path in sorted(engine.rglob("*.py")):
        if str(path.relative_to(engine)) in allowed:
            continue
        text = path.read_text()
        for needle in ("isolation ==", "isolation !=", "remote is None", "remote is not None",
                       ".remote_url", "in_place"):
            if needle in text:
                offenders.append(f"{path.relative_to(engine)}: {needle}")
    assert offenders == []


MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 7
# Functions still over a limit, by "module:function" (module relative to the package, with
# dots). Each entry is a debt; the regroup paid the last one, so a new one needs a reason.
FUNCTION_SIZE_EXCEPTIONS: set[str] = set()


def _is_click_command(node: ast.FunctionDef) -> bool:
    """Click commands take one parameter per option; their size is the CLI's, not the reader's."""
    return any(ast.unparse(d).split("(")[0].endswith((".command", ".group", "command", "group"))
               for d in node.decorator_list)


def _parameter_count(node: ast.FunctionDef) -> int:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    count = len(names) + bool(args.vararg) + bool(args.kwarg)
    return count - (1 if names[:1] in (["self"], ["cls"]) else 0)


def oversized_functions(root: Path = PACKAGE) -> dict[str, str]:
    """Each function over MAX_FUNCTION_LINES lines or MAX_PARAMETERS parameters, click commands
    aside, keyed "module:function" with what is over."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _is_click_command(node):
                continue
            lines = node.end_lineno - node.lineno + 1
            params = _parameter_count(node)
            if lines > MAX_FUNCTION_LINES or params > MAX_PARAMETERS:
                found[f"{module}:{node.name}"] = f"{lines} lines, {params} parameters"
    return found


def test_no_function_is_too_long_or_takes_too_many_parameters():
    found = oversized_functions()
    new = {name: size for name, size in found.items() if name not in FUNCTION_SIZE_EXCEPTIONS}
    assert new == {}
    paid = FUNCTION_SIZE_EXCEPTIONS - set(found)
    assert paid == set(), "split already; drop from FUNCTION_SIZE_EXCEPTIONS"


def test_the_function_check_finds_a_long_function_and_spares_a_click_command(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n")
    (tmp_path / "wide.py").write_text("def wide(a, b, c, d, e, f, g, h):\n    pass\n")
    (tmp_path / "cmd.py").write_text(
        f"import click\n@click.command()\ndef cmd(a, b, c, d, e, f, g, h):\n{body}\n")
    (tmp_path / "meth.py").write_text(
        "class K:\n    def m(self, a, b, c, d, e, f, g):\n        pass\n")
    assert set(oversized_functions(tmp_path)) == {"long:long", "wide:wide"}


def test_the_module_map_is_made_from_the_docstrings_of_todays_tree():
    import module_map

    assert module_map.MAP.read_text() == module_map.render(LAYERS), \
        "docs/modules.md is stale: run python tests/module_map.py --write"


def test_every_module_says_what_it_is_in_a_docstring():
    import module_map

    bare = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
            if p.name != "__init__.py" and not module_map.summary(p)]
    assert bare == []


# A named tuple's own methods and fields carry an underscore so they never clash with a field;
# an Enum's `_value_` is how a member with extra attributes is made. Neither is private.
_PUBLIC_UNDERSCORED = {"_replace", "_make", "_asdict", "_fields", "_value_"}


def private_reaches(root: Path = PACKAGE) -> list[str]:
    """Every place code reaches into another object's or module's private names: `x._name`
    where x is not `self`, `cls` or `super()`, and `from m import _name`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if "_migrations" in path.parts:
            continue
        rel = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found += [f"{rel}:{node.lineno}: import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") or node.attr in _PUBLIC_UNDERSCORED:
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                    and owner.func.id == "super"):
                continue
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_calls_another_ones_private_names():
    assert private_reaches() == []


def test_the_private_check_finds_a_reach_and_spares_self_and_named_tuples(tmp_path):
    (tmp_path / "a.py").write_text(
        "from b import _hidden\n"
        "class K:\n"
        "    def m(self, other, row):\n"
        "        self._mine()\n"
        "        row._replace(x=1)\n"
        "        return other._theirs()\n")
    assert private_reaches(tmp_path) == ["a.py:1: import _hidden", "a.py:6: other._theirs"]


def test_the_lane_uses_verification_as_a_service_not_the_worker():
    """Verification (engine/verification/) sits below both the worker and the lane: the lane
    runs its checks through it and never reaches into the worker."""
    reaches = sorted(f"{module} imports {dep}" for module, deps in import_graph().items()
                     if room_of(module) == "engine.lane"
                     for dep in deps if room_of(dep) == "engine.worker")
    assert reaches == []
