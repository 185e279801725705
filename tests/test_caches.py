"""Every per-process cache has one owner (`bmad_loop.caches.CACHES`): each is registered with
what it holds and how far it grows, and `CACHES.clear()` empties them all."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import bmad_loop
from bmad_loop.caches import CACHES, Memo, ProcessCaches

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "bmad_loop"
# Module-level containers that are process *state*, not caches: emptying them would be a bug.
STATE = {
    "agents/thaw.py": {"_open"},  # the steps the thaw helper watches
    "db/dialects.py": {"_writers"},  # one writer lock per SQLite file
    "db/sqlitefile.py": {"_checked"},  # files this process holds SQLite connections on
}
_CONTAINERS = {"dict", "set", "list", "OrderedDict"}


def _module_containers(path: Path) -> set[str]:
    found = set()
    for node in ast.parse(path.read_text()).body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if not isinstance(target, ast.Name) or value is None:
            continue
        empty = isinstance(value, (ast.Dict, ast.Set, ast.List)) and not (
            getattr(value, "keys", None) or getattr(value, "elts", None))
        made = isinstance(value, ast.Call) and getattr(value.func, "id", None) in _CONTAINERS \
            and not value.args
        if empty or made:
            found.add(target.id)
    return found


def _all_modules():
    for info in pkgutil.walk_packages(bmad_loop.__path__, "bmad_loop."):
        # The packaged alembic scripts only run inside alembic (env.py reads its context).
        if not info.name.endswith("__main__") and "._migrations" not in info.name:
            importlib.import_module(info.name)


def test_every_module_level_cache_is_registered_with_its_owner():
    _all_modules()
    registered = " ".join(f"{e.name} {e.holds}" for e in CACHES.entries())
    unowned = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        text = path.read_text()
        for name in _module_containers(path) - STATE.get(rel, set()):
            # registered: its clear is handed to CACHES in the same module
            if f"CACHES.register(" not in text or f"{name}.clear" not in text:
                unowned.setdefault(rel, []).append(name)
    assert unowned == {}
    assert len(CACHES.entries()) >= 15 and "git.trees.diffs" in registered


def test_each_registered_cache_says_what_it_holds_and_how_far_it_grows():
    _all_modules()
    for entry in CACHES.entries():
        assert entry.holds and entry.bound and "." in entry.name, entry


def test_clear_empties_every_cache():
    from bmad_loop.engine.runrows import _policies
    from bmad_loop.git.trees.diff import _DIFFS

    _DIFFS.put(("repo", "a", "b"), ["x"])
    _policies[("r", "{}")] = object()
    CACHES.clear()
    assert len(_DIFFS) == 0 and not _policies


def test_a_cache_name_is_registered_once_and_a_memo_forgets_its_oldest():
    caches = ProcessCaches()
    memo = caches.memo("t.memo", 2, holds="test")
    for key in "abc":
        memo.put(key, key)
    assert (memo.get("a"), memo.get("c")) == (None, "c") and len(memo) == 2
    try:
        caches.register("t.memo", memo.clear, holds="again", bound="2")
    except ValueError as exc:
        assert "twice" in str(exc)
    else:
        raise AssertionError("a second registration of one name was accepted")
    assert isinstance(memo, Memo)


def test_the_recovery_doc_lists_exactly_the_registered_caches():
    import re

    _all_modules()
    doc = (ROOT / "docs" / "recovery.md").read_text()
    section = doc[doc.index("\n## Per-process caches\n"):]
    end = section.find("\n## ", 1)
    section = section[:end if end > 0 else None]
    listed = set(re.findall(r"^\| `([a-z_.]+)` \|", section, re.M))
    assert listed == {e.name for e in CACHES.entries()}
