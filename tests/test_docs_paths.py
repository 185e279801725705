"""No doc, docstring or comment names a module that does not exist.

What is read: every page of docs/ and README.md (all of it, code blocks too), the markdown files
shipped in src/, and every docstring (any string statement) and comment in src/.

What counts as naming a module, and when that name is stale:

1. A path ending in `.py` with a folder in it (`engine/lane/tick.py`, `git/trees/compose.py`,
   `src/bmad_loop/db/models.py`): after `src/bmad_loop/` or `bmad_loop/` is taken off, a path
   whose first folder is a package name of the tree (or one the git history knows) must be the
   end of a module's path (`lane/tick.py` is enough). A path under `tests/`, `bench/`, `.ci/` or
   `migrations/` must exist in the repository, but for the few that stand for a user's project
   in examples (`EXAMPLE_PATHS`). Any other path (`src/greet.py`, `newdir/x.py`) is an example
   of a user's project and is not checked. A path with a glob in it is not a name.
2. A bare `name.py` (lowercase, not followed by `/`: `x.py/` is a folder): must be the file name
   of a module, or of a file in tests/, bench/, .ci/, migrations/ or the repository's root.
3. A dotted `bmad_loop.x.y…`: its longest prefix that is a module or package must be followed by
   at most a name that module defines at top level (or a submodule of a package).
4. A name that was once a module of the package and is none now (its file is in the git
   history of src/bmad_loop, its name is no module's or package's today): stale when written as
   `name.attr` (but for a journal event kind, `rows.contradicted`), or alone in backticks
   (`` `gitcmd` ``) unless the docs' prose uses it as a plain word (`rows`). Without git history
   (a shallow copy) this rule finds nothing.
5. In src/, `docs/<page>.md` must exist (in the docs a page is a link, checked by
   test_docs_links, and `docs/x.md` is an example of a user's project).

docs/modules.md is made from the docstrings, so it is checked through them, with src/.

Plain prose words are never taken for module names, so "see gitcmd" without backticks is not
found, and `module.attr` of a module that exists is not checked for its attribute.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import subprocess
import tokenize
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "bmad_loop"
REPO_FOLDERS = ("tests", "bench", ".ci", "migrations")
# Names that stand for a user's project in examples (a footprint, a folder named `x.py`), not
# for a file of this repository.
EXAMPLE_PATHS = {"tests/test_auth.py", "x.py"}
# Where the package's non-Python parts live when installed (pyproject.toml's package-dir).
MAPPED_PACKAGES = {"bmad_loop._migrations": ROOT / "migrations"}

SLASH_PATH = re.compile(r"(?<![\w./*-])((?:[\w.-]+/)+[\w-]+\.py)(?![\w/])")
BARE_NAME = re.compile(r"(?<![\w./*-])([a-z_][a-z0-9_]*\.py)(?![\w/])")
DOTTED = re.compile(r"(?<![\w.])bmad_loop(?:\.\w+)+")
MODULE_MAP = ROOT / "docs" / "modules.md"
DOC_PAGE = re.compile(r"(?<![\w./-])docs/([\w-]+\.md)")


# ------------------------------------------------------------------- what the tree holds

@lru_cache(maxsize=None)
def module_paths() -> tuple[str, ...]:
    """Every module's path relative to the package, e.g. `engine/lane/tick.py`."""
    return tuple(sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")))


@lru_cache(maxsize=None)
def package_names() -> frozenset[str]:
    return frozenset(p.name for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").exists())


@lru_cache(maxsize=None)
def current_names() -> frozenset[str]:
    """Every module's and package's name today."""
    return frozenset(Path(m).stem for m in module_paths()) | package_names()


@lru_cache(maxsize=None)
def repository_file_names() -> frozenset[str]:
    names = {Path(m).name for m in module_paths()} | {p.name for p in ROOT.glob("*.py")}
    for folder in REPO_FOLDERS:
        names |= {p.name for p in (ROOT / folder).rglob("*") if p.is_file()}
    return frozenset(names)


@lru_cache(maxsize=None)
def former_module_paths() -> tuple[str, ...]:
    """Every path under src/bmad_loop the git history knows (empty without history)."""
    try:
        out = subprocess.run(["git", "log", "--format=", "--name-only", "--", "src/bmad_loop"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ()
    return tuple(sorted({line for line in out.splitlines() if line.endswith(".py")}))


@lru_cache(maxsize=None)
def former_names() -> frozenset[str]:
    """Names that were modules or packages once and are neither now."""
    names = set()
    for path in former_module_paths():
        parts = Path(path).relative_to("src/bmad_loop").parts
        names |= {Path(p).stem for p in parts if Path(p).stem != "__init__"}
    return frozenset(names - current_names())


@lru_cache(maxsize=None)
def former_package_names() -> frozenset[str]:
    return frozenset(part for path in former_module_paths()
                     for part in Path(path).relative_to("src/bmad_loop").parts[:-1])


@lru_cache(maxsize=None)
def event_kinds() -> frozenset[str]:
    """The journal's event kinds, read from the `EventKind` class wherever it lives."""
    kinds = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name == "EventKind":
                for item in node.body:
                    value = getattr(item, "value", None)
                    first = value.elts[0] if isinstance(value, ast.Tuple) and value.elts else value
                    if isinstance(item, ast.Assign) and isinstance(first, ast.Constant):
                        kinds.add(str(first.value))
    return frozenset(kinds)


@lru_cache(maxsize=None)
def prose_words() -> frozenset[str]:
    """The words the docs use in prose: outside code blocks and code spans."""
    words = set()
    for page in doc_pages():
        text = re.sub(r"^(`{3,}|~{3,}).*?^\1", "", page.read_text(), flags=re.M | re.S)
        text = re.sub(r"`[^`\n]*`", "", text)
        words |= set(re.findall(r"(?<![\w./-])([a-z_][a-z0-9_]*)(?![\w/.-]\w)", text))
    return frozenset(words)


@lru_cache(maxsize=None)
def top_level_names(module: Path) -> frozenset[str]:
    tree = ast.parse(module.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if module.name == "__init__.py":
        names |= {p.stem for p in module.parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    return frozenset(names)


# ------------------------------------------------------------------------------- the rules

def stale_slash_path(token: str) -> bool:
    for prefix in ("src/bmad_loop/", "bmad_loop/"):
        if token.startswith(prefix):
            token = token[len(prefix):]
            break
    else:
        first = token.split("/", 1)[0]
        if first in REPO_FOLDERS:
            return token not in EXAMPLE_PATHS and not (ROOT / token).exists()
        if first not in package_names() | former_package_names():
            return False  # a user's project in an example
    return not any(m == token or m.endswith("/" + token) for m in module_paths())


def stale_dotted(token: str) -> bool:
    parts = token.split(".")
    for mapped, folder in MAPPED_PACKAGES.items():
        if token == mapped or token.startswith(mapped + "."):
            return not folder.exists()
    module, at = PACKAGE / "__init__.py", 1
    for i in range(1, len(parts)):
        base = PACKAGE.joinpath(*parts[1:i + 1])
        if (base / "__init__.py").exists():
            module, at = base / "__init__.py", i + 1
        elif base.with_suffix(".py").exists():
            module, at = base.with_suffix(".py"), i + 1
            break
        else:
            break
    rest = parts[at:]
    return bool(rest) and rest[0] not in top_level_names(module)


# File names of git's own that read like `module.attr`.
GIT_FILES = frozenset({"index.lock", "HEAD.lock", "config.lock", "packed-refs.lock"})


# git configuration sections (`maintenance.auto`) that share a name with a former module.
GIT_CONFIG_SECTIONS = frozenset({"maintenance", "gc", "core", "extensions"})
# Entries of a story row's feedback that share a name with a former module.
FEEDBACK_KEYS = frozenset({"verify_record", "session_record"})
FILE_SUFFIXES = frozenset({"html", "lock", "md", "json", "toml", "log", "txt", "yaml", "db"})


@lru_cache(maxsize=None)
def not_modules() -> frozenset[str]:
    """Words that are written `word.name` and are no module: the state database's tables (a
    column) and the policy's sections (a key)."""
    from bmad_loop.db.models import Base
    from bmad_loop.policy.schema import Policy

    tables = set(Base.metadata.tables)
    sections = {f.name for f in dataclasses.fields(Policy)}
    return frozenset(tables | sections | FEEDBACK_KEYS | GIT_CONFIG_SECTIONS)


def stale_former_name(text: str, start: int, end: int, name: str) -> bool:
    after = text[end:end + 1]
    if after == "." and re.match(r"\.[A-Za-z_]", text[end:end + 2]):
        dotted = re.match(r"[\w.]*\w", text[start:]).group(0)
        if dotted in GIT_FILES or dotted.rsplit(".", 1)[-1] in FILE_SUFFIXES:
            return False  # a file's name (git's own `index.lock`, a report's `index.html`)
        if dotted.split(".", 1)[0] in not_modules():
            return False  # a column (`runs.board_rel`) or a policy key (`verify.commands`)
        return not any(dotted == k or dotted.startswith(k + ".") for k in event_kinds())
    backticked = text[start - 1:start] == "`" and after == "`"
    return backticked and name not in prose_words() and name not in not_modules()


def stale_names(text: str, pages: bool = True) -> list[tuple[int, str]]:
    """(offset, what) for every stale module name in `text`; `pages`: `docs/<page>.md` too (in
    the docs themselves a page is a link, which test_docs_links checks, and `docs/x.md` is an
    example of a user's project)."""
    found = []
    for m in SLASH_PATH.finditer(text):
        if stale_slash_path(m.group(1)):
            found.append((m.start(), m.group(1)))
    for m in BARE_NAME.finditer(text):
        if m.group(1) not in repository_file_names() | EXAMPLE_PATHS:
            found.append((m.start(), m.group(1)))
    for m in DOTTED.finditer(text):
        if stale_dotted(m.group(0)):
            found.append((m.start(), m.group(0)))
    for m in DOC_PAGE.finditer(text) if pages else ():
        if not (ROOT / "docs" / m.group(1)).exists():
            found.append((m.start(), m.group(0)))
    names = former_names()
    if names:
        former = re.compile(r"(?<![\w./-])(" + "|".join(sorted(names, key=len, reverse=True)) + r")(?![\w/-])")
        for m in former.finditer(text):
            if text[m.end():m.end() + 3] != ".py" and stale_former_name(text, m.start(), m.end(), m.group(1)):
                found.append((m.start(), re.match(r"[\w.]*\w", text[m.start():]).group(0)))
    return sorted(found)


# ------------------------------------------------------------------------------ the texts

def doc_pages() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"] + sorted(PACKAGE.rglob("*.md"))


def source_texts(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of every docstring or other string statement and every comment."""
    source = path.read_text()
    texts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            texts.append((node.lineno, node.value.value))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            texts.append((tok.start[0], tok.string))
    return texts


def findings(texts: list[tuple[Path, int, str]], pages: bool) -> list[str]:
    out = []
    for path, line, text in texts:
        for offset, what in stale_names(text, pages):
            out.append(f"{path.relative_to(ROOT)}:{line + text.count(chr(10), 0, offset)}: {what}")
    return out


def stale_in_docs() -> list[str]:
    """docs/modules.md is left out: it is made from the docstrings, which the next test reads."""
    return findings([(page, 1, page.read_text()) for page in doc_pages() if page != MODULE_MAP],
                    pages=False)


def stale_in_source() -> list[str]:
    return findings([(path, line, text) for path in sorted(PACKAGE.rglob("*.py"))
                     for line, text in source_texts(path)], pages=True)


# ------------------------------------------------------------------------------- the tests

def test_no_doc_names_a_module_that_does_not_exist():
    assert stale_in_docs() == []


def test_no_docstring_or_comment_names_a_module_that_does_not_exist():
    assert stale_in_source() == []


def test_the_rules_find_stale_names_and_spare_examples_and_prose():
    stale = [what for _, what in stale_names(
        "see engine/lane/nosuch.py, `git/trees/compose.py`, nosuchmodule.py and states.py; "
        "bmad_loop.engine.nosuch, bmad_loop.caches.CACHES, bmad_loop.caches.NOSUCH, "
        "docs/nosuch.md and docs/cli.md; tests/test_nosuch.py; tests/test_auth.py")]
    assert stale == ["engine/lane/nosuch.py", "nosuchmodule.py", "bmad_loop.engine.nosuch",
                     "bmad_loop.caches.NOSUCH", "docs/nosuch.md", "tests/test_nosuch.py"]
    spared = ("`src/greet.py`, `newdir/x.py`, `*.py`, `x.py/notes.md`, `src/a/*.py`, OLD.py, "
              "lane/tick.py, bmad_loop.queue.tasks, bmad_loop._migrations, story.queued")
    assert stale_names(spared) == []


def test_a_former_module_is_found_dotted_or_in_backticks_but_not_as_a_prose_word():
    names = former_names()
    if not names:
        pytest.skip("no git history here: former module names are unknown")
    name = next(n for n in sorted(names) if n not in prose_words())
    assert [w for _, w in stale_names(f"`{name}` and {name}.Thing")] == [name, f"{name}.Thing"]
    assert stale_names(f"plain {name} in prose") == []
    worded = sorted(names & prose_words())
    if worded:
        assert stale_names(f"`{worded[0]}`") == []
