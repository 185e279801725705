"""Reading a policy: `policy.toml` (or a snapshot dict), the environment overrides, the template.

`policy_from_dict` validates a TOML-shaped dict into a `Policy`; `load_policy` reads the project's
file first. With an environment, every `BMAD_LOOP_<SECTION>_<KEY>` variable wins over the file
(the rules are in the `bmad_loop.policy` docstring). Every problem is one line naming the file or
the variable, the section and the key.

**Which project a folder belongs to** (`find_project_root`), so bmad-loop works from any folder
of a repository: from the folder given (`--project`, default the current one) upwards, the
nearest folder that holds `.bmad-loop/policy.toml` is the project; else the top of the git
working tree (the first folder holding `.git`, a folder in a clone and a file in a linked
worktree). A folder in no repository and under no policy is taken as it is, so the commands' own
messages name it. The walk never climbs above the repository: a policy in a folder that holds
the repository is not this project's.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from .schema import SECTIONS, Policy, check_policy
from .validate import (
    Context,
    describe,
    did_you_mean,
    error,
    hints,
    is_table,
    is_word,
    named_fields,
    read_table,
    rest_field,
    where,
)

__all__ = ["ENV_PREFIX", "default_policy_text", "env_override", "find_project_root", "load_policy",
           "policy_from_dict", "policy_path"]

ENV_PREFIX = "BMAD_LOOP_"


def _read_policy(ctx: Context, data: Any) -> Policy:
    if not is_table(data):
        raise error(f"{ctx.source}: expected a table of sections, got {describe(data)}")
    sections_of = hints(Policy)
    sections: dict[str, Any] = {}
    for section, value in data.items():
        if section not in SECTIONS:
            raise ctx.error((section,), "unknown section" + _section_hint(section))
        sections[section] = read_table(ctx, (section,), value, sections_of[section])
    policy = Policy(**sections, source=ctx.source)
    check_policy(ctx, policy)
    return policy


def _section_hint(key: str) -> str:
    sections_of = hints(Policy)  # a key written outside its section
    homes = [f"[{section}] {key}" for section in SECTIONS if key in named_fields(sections_of[section])]
    return f" (did you mean {' or '.join(homes)}?)" if homes else did_you_mean(key, SECTIONS)


# --- environment overrides -----------------------------------------------------------------

# Keys whose value is a table of globs: an environment variable cannot address one glob, and a
# whole table in one variable is easy to get wrong silently.
_FILE_ONLY = {("integration", "merge"): "is a table of globs to merge rules"}


def _key_type(section: str, key: str) -> Any | None:
    """The type a top-level key of `section` expects, or None for an unknown key."""
    cls = hints(Policy)[section]
    types_ = hints(cls)
    if key in named_fields(cls):
        return types_[key]
    rest = rest_field(cls)
    if rest is not None:
        item_type = typing.get_args(types_[rest.name])[1]
        if not dataclasses.is_dataclass(item_type):  # [resources]: any other key is a capacity
            return item_type
    return None


def _env_value(raw: str, tp: Any) -> Any:
    if tp is str or is_word(tp):  # a word is taken as it is
        return raw
    try:
        parsed = tomllib.loads("v = " + raw)
    except tomllib.TOMLDecodeError:
        return raw
    return parsed["v"] if list(parsed) == ["v"] else raw


def _apply_env(data: Mapping[str, Any],
               env: Mapping[str, str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    merged = {section: (dict(value) if is_table(value) else value) for section, value in data.items()}
    origins: dict[tuple[str, ...], str] = {}
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        rest = var[len(ENV_PREFIX):]
        section = next((s for s in SECTIONS if rest.startswith(s.upper() + "_")), None)
        if section is None:
            continue
        key = rest[len(section) + 1:].lower()
        tp = _key_type(section, key)
        if (section, key) in _FILE_ONLY:
            raise error(f"{var}: {where((section, key))} {_FILE_ONLY[section, key]}: set it in "
                        ".bmad-loop/policy.toml (the environment overrides scalar keys only)")
        if tp is None:
            named = named_fields(hints(Policy)[section])
            raise error(f"{var}: {where((section, key))}: unknown key{did_you_mean(key, named)}")
        table = merged.setdefault(section, {})
        if is_table(table):  # a non-table section is reported against the file
            table[key] = _env_value(env[var], tp)
            origins[(section, key)] = var
    return merged, origins


# --- public entry points -------------------------------------------------------------------


def policy_from_dict(data: Mapping, source: str = "<snapshot>", env: Mapping[str, str] | None = None) -> Policy:
    """Validate a TOML-shaped dict; with `env`, `BMAD_LOOP_<SECTION>_<KEY>` variables win over it."""
    origins: dict[tuple[str, ...], str] = {}
    if env is not None and is_table(data):
        data, origins = _apply_env(data, env)
    return _read_policy(Context(source, origins), data)


def policy_path(project_dir: str | os.PathLike) -> Path:
    return Path(project_dir) / ".bmad-loop" / "policy.toml"


def find_project_root(start: str | os.PathLike) -> Path:
    """The project `start` belongs to (see the module docstring)."""
    start = Path(start).resolve()
    for folder in (start, *start.parents):
        if policy_path(folder).is_file() or (folder / ".git").exists():
            return folder
    return start


def load_policy(project_dir: str | os.PathLike, env: Mapping[str, str] | None = None) -> Policy:
    """Read `<project_dir>/.bmad-loop/policy.toml` (absent: the defaults) plus the environment
    overrides (`env` defaults to `os.environ`)."""
    path = policy_path(project_dir)
    env = os.environ if env is None else env
    if not path.exists():
        return policy_from_dict({}, source="<defaults>", env=env)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: invalid TOML: {exc}") from exc
    return policy_from_dict(data, source=str(path), env=env)


def env_override(section: str, key: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable that sets `[section] key` (it wins over the file), or None: for a message
    about the value to name where it came from."""
    var = f"{ENV_PREFIX}{section.upper()}_{key.upper()}"
    return var if var in (os.environ if env is None else env) else None


def default_policy_text() -> str:
    """The commented template `bmad-loop init` writes; loading it yields the defaults."""
    return resources.files("bmad_loop").joinpath("policy_template.toml").read_text(encoding="utf-8")
