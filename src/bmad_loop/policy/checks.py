"""The value checks of the policy schema, and `setting`, the field that carries them.

A check takes a value already of the right type and returns the part of the error message after
"[section] key: ", or None when the value is fine. `setting` puts a default and its checks on a
dataclass field of `bmad_loop.policy.schema`; the validator (`bmad_loop.policy.validate`) runs them.
"""

from __future__ import annotations

import dataclasses
import re
import string
from dataclasses import field
from pathlib import PurePosixPath
from types import MappingProxyType
from enum import StrEnum
from typing import Any, Callable, Mapping

from ..agents.profiles import known_profiles

__all__ = [
    "choice",
    "COMMIT_PLACEHOLDERS",
    "MAX_PARALLEL",
    "MAX_VERIFY_PARALLEL",
    "MAX_SECONDS",
    "Check",
    "argv_template",
    "at_least",
    "at_most",
    "commit_template",
    "globs",
    "globs_of_keys",
    "empty_map",
    "non_empty",
    "one_of",
    "parse_ports",
    "ports",
    "profile",
    "repo_paths",
    "seconds",
    "setting",
    "url",
]

COMMIT_PLACEHOLDERS = ("story_key", "story_title", "run_id", "epic")

Check = Callable[[Any], "str | None"]  # returns an error message, or None when the value is fine


def one_of(*choices: str) -> Check:
    def check(value: str) -> str | None:
        if value not in choices:
            return f"must be one of {', '.join(map(repr, choices))}, got {value!r}"
        return None

    return check


def at_least(low: int) -> Check:
    def check(value: int) -> str | None:
        return f"must be >= {low}, got {value}" if value < low else None

    return check


def at_most(high: int, why: str = "") -> Check:
    def check(value: int) -> str | None:
        return f"must be <= {high}{why}, got {value}" if value > high else None

    return check


# Parallel slots: each is a consumer thread, a worktree and an agent process.
MAX_PARALLEL = 1024
# Speculative candidates verified at once (`[verify] parallel`, and its default): each is a
# candidate worktree and a verification; the one bound the key, its default and the docs share.
MAX_VERIFY_PARALLEL = 64

# Durations: far beyond any real timeout, and still within what datetime arithmetic and the
# platform's timed waits accept (a larger value would overflow later, deep in a run).
MAX_SECONDS = 1_000_000_000


def seconds(default: Any, low: int, *, identity: bool = False) -> Any:
    """A `setting` for a duration in seconds: an integer from `low` to `MAX_SECONDS`."""
    return setting(default, checks=(at_least(low), at_most(MAX_SECONDS, " (about 31 years)")),
                   identity=identity)


def profile(value: str) -> str | None:
    known = known_profiles()  # the profile files shipped in agents/profiles/
    if value and value not in known:
        return one_of(*known)(value)
    return None


def non_empty(value: object) -> str | None:
    return "must not be empty (leave the key out to inherit [adapter] command)" if not value else None


def commit_template(value: str) -> str | None:
    allowed = ", ".join("{%s}" % name for name in COMMIT_PLACEHOLDERS)
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
    except ValueError as exc:
        return f"not a valid template ({exc}); placeholders are {allowed}"
    for name in names:
        if name not in COMMIT_PLACEHOLDERS:
            return f"unknown placeholder {{{name}}}; allowed: {allowed}"
    return None


# The agent argv's placeholders, as `bmad_loop.agents.adapter.render_argv` finds them: `{identifier}`;
# other text in braces (JSON, `{}`) is left alone there, so it is here.
_ARGV_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def argv_template(value: tuple[str, ...]) -> str | None:
    """An agent argv (or tier args) whose `{placeholders}` are all known to the adapter."""
    from ..agents.adapter import PLACEHOLDERS

    for element in value:
        for name in _ARGV_PLACEHOLDER.findall(element):
            if name not in PLACEHOLDERS:
                known = ", ".join("{%s}" % p for p in PLACEHOLDERS)
                return f"unknown placeholder {{{name}}} in {element!r} (known: {known})"
    return None


def globs(value: tuple[str, ...]) -> str | None:
    """Repository globs with the footprint rules (gitignore syntax; no `!` negation)."""
    from ..globs import pattern_problem

    for pattern in value:
        problem = pattern_problem(pattern)
        if problem:
            return f"invalid glob: {problem}"
    return None


def globs_of_keys(value: Mapping[str, Any]) -> str | None:
    """A table keyed by repository globs: each key is a valid glob, and no two keys with
    literal prefixes of one length can match one path (which rule wins would be a tie)."""
    from ..globs import globs_may_overlap, literal_prefix_length, pattern_problem

    keys = list(value)
    for pattern in keys:
        problem = pattern_problem(pattern)
        if problem:
            return f"invalid glob {pattern!r}: {problem}"
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if literal_prefix_length(a) == literal_prefix_length(b) and globs_may_overlap(a, b):
                return (f"{a!r} and {b!r} can match the same path and neither is more specific "
                        "(longest literal prefix wins): make one of them narrower")
    return None


# Top-level folders a seed may not name: git's own, and bmad-loop's state (which holds the
# worktrees themselves).
_NOT_SEEDS = (".git", ".bmad-loop")


def repo_paths(value: tuple[str, ...]) -> str | None:
    """Repository-relative paths that stay inside the repository (no absolute path, no `..`)."""
    for entry in value:
        path = PurePosixPath(entry)
        if not entry.strip():
            return "an empty path"
        if path.is_absolute() or entry.startswith("~"):
            return f"{entry!r} is outside the repository (give a repository-relative path)"
        if ".." in path.parts:
            return f"{entry!r} is outside the repository ('..' is not allowed)"
        if not path.parts:
            return f"{entry!r} names the repository itself"
        if path.parts[0] in _NOT_SEEDS:
            return f"{entry!r} is inside {path.parts[0]}/, which cannot be seeded"
    return None


_PORTS = re.compile(r"(\d+)-(\d+)")


def parse_ports(value: str) -> tuple[int, int] | None:
    """`"LOW-HIGH"` as (low, high), or None when it is not a valid port range."""
    match = _PORTS.fullmatch(value.strip())
    if not match:
        return None
    low, high = int(match[1]), int(match[2])
    return (low, high) if 1 <= low <= high <= 65535 else None


def ports(value: str) -> str | None:
    if value and parse_ports(value) is None:
        return f'must be "LOW-HIGH" with 1 <= LOW <= HIGH <= 65535, got {value!r}'
    return None


def url(*schemes: str, example: str) -> Check:
    pattern = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")

    def check(value: str) -> str | None:
        if not value:
            return None
        scheme_ok = value.startswith(schemes) if schemes else pattern.match(value)
        return None if scheme_ok else f"must be a URL like {example!r}, got {value!r}"

    return check


def setting(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING,
            checks: tuple[Check, ...] = (), each: bool = False, rest: bool = False,
            identity: bool = False, choices: type[StrEnum] | None = None) -> Any:
    """A schema field: its default, its checks (`each`: run on every value of a mapping),
    `rest`: this mapping collects the section's other keys (capacities, footprint overrides),
    `identity`: the key says what a run *is* (where its target and rows live, how its branches
    are laid out), so `resume --reload-policy` never changes it, and `choices`: the enum of
    the values a word-valued key may take."""
    meta = {"checks": checks, "each": each, "rest": rest, "identity": identity, "choices": choices}
    return field(default=default, default_factory=factory, metadata=meta)


def choice(default: StrEnum, *, identity: bool = False) -> Any:
    """A `setting` that takes one of its enum's values; the default is a member of it."""
    options = type(default)
    return setting(default.value, checks=(one_of(*(m.value for m in options)),),
                   identity=identity, choices=options)


def empty_map() -> Mapping:
    return MappingProxyType({})
