"""git's rules for ref names, in pure Python (git's refs.c `check_refname_format`, flags 0,
plus `--branch`), so a story key or a branch name is judged without starting git.
"""

from __future__ import annotations

import re


_REF_BAD_CHARS = frozenset(" ~^:?*[\\\x7f") | frozenset(chr(c) for c in range(0x20))
_REF_BAD_RE = re.compile("[" + re.escape("".join(sorted(_REF_BAD_CHARS))) + "]")


def _component_problem(component: str) -> str | None:
    if component == "":
        return "empty path component (leading, trailing or double '/')"
    if component.startswith("."):
        return f"component '{component}' starts with '.'"
    if component.endswith(".lock"):
        return f"component '{component}' ends with '.lock'"
    if ".." in component:
        return "contains '..'"
    if "@{" in component:
        return "contains '@{'"
    bad = _REF_BAD_RE.search(component)  # the first one, as a loop over the characters would
    if bad is not None:
        return f"contains the forbidden character {bad.group()!r}"
    return None


def branch_name_problem(name: str) -> str | None:
    """Why git would refuse `name` as a branch name (`git check-ref-format --branch`), or None.

    Names git would expand rather than judge (`@{-1}`, `@{upstream}`) are refused too: any `@{`.
    """
    if name.startswith("-"):
        return "starts with '-'"
    if name == "HEAD":
        return "is 'HEAD'"
    if name.endswith("."):
        return "ends with '.'"
    for component in name.split("/"):
        problem = _component_problem(component)
        if problem is not None:
            return problem
    return None


def branch_name_ok(name: str) -> bool:
    """True when git accepts `name` as a new branch name; checked without running git."""
    return branch_name_problem(name) is None
