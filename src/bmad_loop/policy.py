"""The run policy: `.bmad-loop/policy.toml`, validated once into an immutable `Policy`.

Config, validation and running are three steps: this module only turns TOML (or a snapshot dict
of the same shape, see `Policy.to_dict`) into frozen dataclasses, and every problem it finds is a
one-line `ConfigError` naming the file (or environment variable), the section and the key.

The dataclasses below are the schema. Each field's type drives one generic validator
(`_convert`), and its metadata holds the checks (enums, ranges, formats). Cross-key rules
(the `max_parallel` guard, profile-or-command, the redis url, the lane tier) live in
`_check_policy`.

Environment overrides
---------------------
Any variable named `BMAD_LOOP_<SECTION>_<KEY>` overrides the file and wins over it, where
SECTION is one of `SECTIONS` upper-cased and KEY a key of that section upper-cased, e.g.
`BMAD_LOOP_SCM_MAX_PARALLEL=3`, `BMAD_LOOP_DATABASE_URL=postgresql+psycopg://db/loop`.

- Only top-level keys of top-level sections are reachable: `BMAD_LOOP_ADAPTER_TIMEOUT_S` works,
  `[adapter.dev] timeout_s` or `[footprints."1-2-auth"]` cannot be addressed key by key. A
  table-valued key may be replaced whole with an inline table, e.g.
  `BMAD_LOOP_ADAPTER_ENV='{ API_KEY = "x" }'`. In `[resources]` every KEY is a capacity
  (`BMAD_LOOP_RESOURCES_GPU=2` means `gpu = 2`) except `PORTS`; names that are not valid in an
  environment variable (`"service:db"`) need the file.
- The value is read as a TOML value (`3`, `true`, `["pytest -q", "ruff check"]`); a key that
  expects a string takes the raw text as is, and so does any value that is not valid TOML.
- A variable whose SECTION part is not a section is not ours and is ignored: the agent's own
  environment (`BMAD_LOOP_RUN_ID`, `BMAD_LOOP_STORY_KEY`, `BMAD_LOOP_PHASE`, ...) never errors.
  The SECTION must be followed by `_`, so `BMAD_LOOP_STORY_KEY` is not section `stories`.
- A known section with an unknown key is an error naming the variable, and so is a bad value.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import string
import tomllib
import types
import typing
from collections import abc
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from .errors import ConfigError

__all__ = [
    "KNOWN_PROFILES",
    "SECTIONS",
    "ENV_PREFIX",
    "AdapterPolicy",
    "CleanupPolicy",
    "DatabasePolicy",
    "FootprintOverride",
    "FootprintsPolicy",
    "GatesPolicy",
    "LeasesPolicy",
    "LimitsPolicy",
    "NotifyPolicy",
    "ParallelPolicy",
    "PhaseOverride",
    "Policy",
    "QueuePolicy",
    "ResourcesPolicy",
    "ReviewPolicy",
    "ScmPolicy",
    "StoriesPolicy",
    "TierPolicy",
    "VerifyPolicy",
    "default_policy_text",
    "load_policy",
    "policy_from_dict",
    "policy_path",
]

KNOWN_PROFILES = ("claude", "codex", "gemini")
ENV_PREFIX = "BMAD_LOOP_"
PHASES = ("dev", "review", "fix")
COMMIT_PLACEHOLDERS = ("story_key", "story_title", "run_id", "epic")

Check = Callable[[Any], "str | None"]  # returns an error message, or None when the value is fine


# --- checks: each returns the part of the message after "[section] key: " -------------------


def _one_of(*choices: str) -> Check:
    def check(value):
        if value not in choices:
            return f"must be one of {', '.join(map(repr, choices))}, got {value!r}"
        return None

    return check


def _at_least(low: int) -> Check:
    def check(value):
        return f"must be >= {low}, got {value}" if value < low else None

    return check


def _profile(value: str) -> str | None:
    if value and value not in KNOWN_PROFILES:
        return _one_of(*KNOWN_PROFILES)(value)
    return None


def _non_empty(value) -> str | None:
    return "must not be empty (leave the key out to inherit [adapter] command)" if not value else None


def _commit_template(value: str) -> str | None:
    allowed = ", ".join("{%s}" % name for name in COMMIT_PLACEHOLDERS)
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
    except ValueError as exc:
        return f"not a valid template ({exc}); placeholders are {allowed}"
    for name in names:
        if name not in COMMIT_PLACEHOLDERS:
            return f"unknown placeholder {{{name}}}; allowed: {allowed}"
    return None


_PORTS = re.compile(r"(\d+)-(\d+)")


def _parse_ports(value: str) -> tuple[int, int] | None:
    match = _PORTS.fullmatch(value.strip())
    if not match:
        return None
    low, high = int(match[1]), int(match[2])
    return (low, high) if 1 <= low <= high <= 65535 else None


def _ports(value: str) -> str | None:
    if value and _parse_ports(value) is None:
        return f'must be "LOW-HIGH" with 1 <= LOW <= HIGH <= 65535, got {value!r}'
    return None


def _url(*schemes: str, example: str) -> Check:
    pattern = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")

    def check(value):
        if not value:
            return None
        scheme_ok = value.startswith(schemes) if schemes else pattern.match(value)
        return None if scheme_ok else f"must be a URL like {example!r}, got {value!r}"

    return check


def _setting(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING,
             checks: tuple[Check, ...] = (), each: bool = False, rest: bool = False) -> Any:
    """A schema field: its default, its checks (`each`: run on every value of a mapping) and
    `rest`: this mapping collects the section's other keys (capacities, footprint overrides)."""
    meta = {"checks": checks, "each": each, "rest": rest}
    return field(default=default, default_factory=factory, metadata=meta)


def _empty_map() -> Mapping:
    return MappingProxyType({})


# --- the schema ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ScmPolicy:
    isolation: str = _setting("worktree", checks=(_one_of("none", "worktree"),))
    branch_per: str = _setting("story", checks=(_one_of("story", "run"),))
    target_branch: str = ""
    merge_strategy: str = _setting("merge", checks=(_one_of("ff", "merge", "squash"),))
    max_parallel: int = _setting(1, checks=(_at_least(1),))
    keep_failed: bool = True
    delete_branch: bool = True
    rollback_on_failure: bool = False
    worktree_seed: tuple[str, ...] = ()
    seed_adapter_defaults: bool = True
    commit_message_template: str = _setting("{story_key}: {story_title}", checks=(_commit_template,))
    author_name: str = "bmad-loop"
    author_email: str = "bmad-loop@localhost"
    lane_owned: tuple[str, ...] = ()
    remote: str = ""


@dataclass(frozen=True)
class LimitsPolicy:
    max_dev_attempts: int = _setting(2, checks=(_at_least(1),))
    max_review_cycles: int = _setting(3, checks=(_at_least(0),))
    max_recompose: int = _setting(3, checks=(_at_least(0),))


@dataclass(frozen=True)
class VerifyPolicy:
    commands: tuple[str, ...] = ()  # shell strings
    timeout_s: int = _setting(1800, checks=(_at_least(1),))


@dataclass(frozen=True)
class GatesPolicy:
    mode: str = _setting("per-epic", checks=(_one_of("none", "per-epic", "per-story-spec-approval"),))


@dataclass(frozen=True)
class PhaseOverride:
    command: tuple[str, ...] | None = _setting(None, checks=(_non_empty,))
    timeout_s: int | None = _setting(None, checks=(_at_least(1),))
    env: Mapping[str, str] = _setting(factory=_empty_map)


@dataclass(frozen=True)
class TierPolicy:
    model: str = ""
    args: tuple[str, ...] = ()
    timeout_s: int | None = _setting(None, checks=(_at_least(1),))


@dataclass(frozen=True)
class AdapterPolicy:
    profile: str = _setting("", checks=(_profile,))
    command: tuple[str, ...] = ()
    timeout_s: int = _setting(5400, checks=(_at_least(1),))
    env: Mapping[str, str] = _setting(factory=_empty_map)
    tmux: bool = False
    dev: PhaseOverride = _setting(factory=PhaseOverride)
    review: PhaseOverride = _setting(factory=PhaseOverride)
    fix: PhaseOverride = _setting(factory=PhaseOverride)
    tiers: Mapping[str, TierPolicy] = _setting(factory=_empty_map)

    def phase(self, name: str) -> PhaseOverride:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
        return getattr(self, name)

    def timeout_for(self, phase: str, tier: str = "") -> int:
        """The most specific timeout wins: tier > phase > adapter."""
        tier_timeout = self.tiers[tier].timeout_s if tier in self.tiers else None
        for timeout in (tier_timeout, self.phase(phase).timeout_s):
            if timeout is not None:
                return timeout
        return self.timeout_s


@dataclass(frozen=True)
class LeasesPolicy:
    ttl_s: int = _setting(60, checks=(_at_least(3),))


@dataclass(frozen=True)
class StoriesPolicy:
    sprint_status: str = ""
    story_dir: str = ""


@dataclass(frozen=True)
class ReviewPolicy:
    enabled: bool = True


@dataclass(frozen=True)
class FootprintOverride:
    files: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()


@dataclass(frozen=True)
class FootprintsPolicy:
    default: str = _setting("exclusive", checks=(_one_of("exclusive"),))
    drift: str = _setting("warn", checks=(_one_of("warn", "escalate"),))
    overrides: Mapping[str, FootprintOverride] = _setting(factory=_empty_map, rest=True)


@dataclass(frozen=True)
class ResourcesPolicy:
    capacities: Mapping[str, int] = _setting(factory=_empty_map, checks=(_at_least(1),),
                                             each=True, rest=True)
    ports: str = _setting("", checks=(_ports,))

    def capacity(self, name: str) -> int:
        """A resource no key names has capacity 1."""
        return self.capacities.get(name, 1)

    @property
    def port_range(self) -> tuple[int, int] | None:
        """`ports` as (low, high), both inclusive; None when unset."""
        return _parse_ports(self.ports) if self.ports else None


@dataclass(frozen=True)
class NotifyPolicy:
    command: tuple[str, ...] = ()
    webhook: str = _setting("", checks=(_url("http://", "https://", example="https://host/hook"),))
    timeout_s: int = _setting(10, checks=(_at_least(1),))


@dataclass(frozen=True)
class QueuePolicy:
    backend: str = _setting("sqlite", checks=(_one_of("sqlite", "redis"),))
    url: str = ""


@dataclass(frozen=True)
class DatabasePolicy:
    url: str = _setting("", checks=(_url(example="postgresql+psycopg://host/db"),))


@dataclass(frozen=True)
class ParallelPolicy:
    on_escalation: str = _setting("pause", checks=(_one_of("pause", "continue"),))
    merge_class: str = _setting("self", checks=(_one_of("self", "operator"),))
    tier: str = ""


@dataclass(frozen=True)
class CleanupPolicy:
    keep_runs: int = _setting(10, checks=(_at_least(0),))


@dataclass(frozen=True)
class Policy:
    scm: ScmPolicy = field(default_factory=ScmPolicy)
    limits: LimitsPolicy = field(default_factory=LimitsPolicy)
    verify: VerifyPolicy = field(default_factory=VerifyPolicy)
    gates: GatesPolicy = field(default_factory=GatesPolicy)
    adapter: AdapterPolicy = field(default_factory=AdapterPolicy)
    leases: LeasesPolicy = field(default_factory=LeasesPolicy)
    stories: StoriesPolicy = field(default_factory=StoriesPolicy)
    review: ReviewPolicy = field(default_factory=ReviewPolicy)
    footprints: FootprintsPolicy = field(default_factory=FootprintsPolicy)
    resources: ResourcesPolicy = field(default_factory=ResourcesPolicy)
    notify: NotifyPolicy = field(default_factory=NotifyPolicy)
    queue: QueuePolicy = field(default_factory=QueuePolicy)
    database: DatabasePolicy = field(default_factory=DatabasePolicy)
    parallel: ParallelPolicy = field(default_factory=ParallelPolicy)
    cleanup: CleanupPolicy = field(default_factory=CleanupPolicy)
    # Where the policy came from; provenance, not content, so it takes no part in ==.
    source: str = field(default="<defaults>", compare=False)

    def to_dict(self) -> dict:
        """A plain JSON-able dict in the TOML shape; `policy_from_dict` reads it back."""
        return {section: _dump(getattr(self, section)) for section in SECTIONS}

    def with_max_parallel(self, n: Any, source: str = "--parallel") -> Policy:
        """This policy with `[scm] max_parallel = n`, validated like the key; errors name `source`."""
        ctx = _Context(source)
        path = ("scm", "max_parallel")
        n = _checked(ctx, path, n, int, _field(ScmPolicy, "max_parallel"))
        scm = dataclasses.replace(self.scm, max_parallel=n)
        _check_max_parallel(ctx, scm)
        return dataclasses.replace(self, scm=scm)


SECTIONS = tuple(f.name for f in dataclasses.fields(Policy) if f.name != "source")


# --- the generic validator -----------------------------------------------------------------


class _Context:
    """Where values came from: the file (or snapshot) `source`, or, for (section, key) pairs
    set from the environment, the variable's name."""

    def __init__(self, source: str, env_origins: Mapping[tuple[str, str], str] | None = None):
        self.source = source
        self.env_origins = env_origins or {}

    def origin(self, *paths: tuple[str, ...]) -> str:
        for path in paths:
            if path[:2] in self.env_origins:
                return self.env_origins[path[:2]]
        return self.source

    def error(self, path: tuple[str, ...], message: str, *, also: tuple[tuple[str, ...], ...] = ()):
        return _error(f"{self.origin(path, *also)}: {_where(path)}: {message}")


def _error(message: str) -> ConfigError:
    return ConfigError(" ".join(message.split("\n")))


_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _name(name: str) -> str:
    name = str(name)
    return name if _BARE.fullmatch(name) else '"%s"' % name.replace("\\", "\\\\").replace('"', '\\"')


def _where(path: tuple[str, ...]) -> str:
    """("adapter", "tiers", "fast", "timeout_s") -> "[adapter.tiers.fast] timeout_s"."""
    if len(path) == 1:
        return f"[{_name(path[0])}]"
    return f"[{'.'.join(map(_name, path[:-1]))}] {_name(path[-1])}"


def _did_you_mean(name: str, candidates) -> str:
    close = difflib.get_close_matches(str(name).lower(), list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"float {value}"
    if isinstance(value, str):
        return f"string {_short(repr(value))}"
    if isinstance(value, (list, tuple)):
        return f"array {_short(repr(list(value)))}"
    if isinstance(value, abc.Mapping):
        return "table"
    return f"{type(value).__name__} {_short(str(value))}"


_EXPECTED = {bool: "a boolean", int: "an integer", str: "a string"}


def _is_table(value: Any) -> bool:
    return isinstance(value, abc.Mapping)


def _convert(ctx: _Context, path: tuple[str, ...], value: Any, tp: Any) -> Any:
    """Check `value` against the annotated type `tp` and return its immutable form."""
    if dataclasses.is_dataclass(tp):
        return _read_table(ctx, path, value, tp)
    origin = typing.get_origin(tp)
    if origin is types.UnionType:  # `X | None`: TOML has no null, so only X can arrive
        (inner,) = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        return _convert(ctx, path, value, inner)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ctx.error(path, f"expected an array of strings, got {_describe(value)}")
        for index, item in enumerate(value, 1):
            if not isinstance(item, str):
                raise ctx.error(path, f"expected an array of strings, item {index} is {_describe(item)}")
        return tuple(value)
    if origin is abc.Mapping:
        if not _is_table(value):
            raise ctx.error(path, f"expected a table, got {_describe(value)}")
        item_type = typing.get_args(tp)[1]
        return MappingProxyType({str(k): _convert(ctx, path + (str(k),), v, item_type) for k, v in value.items()})
    if (tp is int and isinstance(value, bool)) or not isinstance(value, tp):  # bool is not an int
        raise ctx.error(path, f"expected {_EXPECTED[tp]}, got {_describe(value)}")
    return value


def _checked(ctx: _Context, path: tuple[str, ...], value: Any, tp: Any, spec: dataclasses.Field) -> Any:
    value = _convert(ctx, path, value, tp)
    checks = spec.metadata.get("checks", ())
    items = value.items() if spec.metadata.get("each") else [((), value)]
    for key, item in items:
        item_path = path + ((key,) if spec.metadata.get("each") else ())
        for check in checks:
            message = None if item is None else check(item)
            if message:
                raise ctx.error(item_path, message)
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _field(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def _named_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("rest")}


def _rest_field(cls: type) -> dataclasses.Field | None:
    return next((f for f in dataclasses.fields(cls) if f.metadata.get("rest")), None)


def _read_table(ctx: _Context, path: tuple[str, ...], value: Any, cls: type) -> Any:
    if not _is_table(value):
        raise ctx.error(path, f"expected a table, got {_describe(value)}")
    hints, named, rest = _hints(cls), _named_fields(cls), _rest_field(cls)
    rest_takes_tables_only = rest is not None and dataclasses.is_dataclass(typing.get_args(hints[rest.name])[1])
    kwargs: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for key, raw in value.items():
        if key in named:
            kwargs[key] = _checked(ctx, path + (key,), raw, hints[key], named[key])
        elif rest is not None and (_is_table(raw) or not rest_takes_tables_only):
            others[key] = raw
        else:
            raise ctx.error(path + (key,), "unknown key" + _did_you_mean(key, named))
    if rest is not None:
        kwargs[rest.name] = _checked(ctx, path, others, hints[rest.name], rest)
    return cls(**kwargs)


def _read_policy(ctx: _Context, data: Any) -> Policy:
    if not _is_table(data):
        raise _error(f"{ctx.source}: expected a table of sections, got {_describe(data)}")
    hints = _hints(Policy)
    sections: dict[str, Any] = {}
    for name, value in data.items():
        if name not in SECTIONS:
            raise ctx.error((name,), "unknown section" + _section_hint(name))
        sections[name] = _read_table(ctx, (name,), value, hints[name])
    policy = Policy(**sections, source=ctx.source)
    _check_policy(ctx, policy)
    return policy


def _section_hint(name: str) -> str:
    hints = _hints(Policy)  # a key written outside its section
    homes = [f"[{section}] {name}" for section in SECTIONS if name in _named_fields(hints[section])]
    return f" (did you mean {' or '.join(homes)}?)" if homes else _did_you_mean(name, SECTIONS)


# --- rules that span keys ------------------------------------------------------------------


def _check_max_parallel(ctx: _Context, scm: ScmPolicy) -> None:
    if scm.max_parallel > 1 and (scm.isolation, scm.branch_per) != ("worktree", "story"):
        origin = ctx.origin(("scm", "max_parallel"), ("scm", "isolation"), ("scm", "branch_per"))
        raise _error(f'{origin}: [scm] max_parallel = {scm.max_parallel} needs [scm] isolation = "worktree"'
                     f' and [scm] branch_per = "story"')


def _check_policy(ctx: _Context, policy: Policy) -> None:
    _check_max_parallel(ctx, policy.scm)
    scm = policy.scm
    if scm.remote.strip() and (scm.isolation, scm.branch_per) != ("worktree", "story"):
        origin = ctx.origin(("scm", "remote"), ("scm", "isolation"), ("scm", "branch_per"))
        raise _error(f'{origin}: [scm] remote = "{scm.remote}" (remote mode) needs [scm] isolation = '
                     '"worktree" and [scm] branch_per = "story"')
    adapter = policy.adapter
    if adapter.profile and adapter.command:
        raise ctx.error(("adapter", "command"), "set either [adapter] profile or [adapter] command, not both",
                        also=(("adapter", "profile"),))
    queue = policy.queue
    if queue.backend == "redis" and not queue.url.startswith(("redis://", "rediss://")):
        raise ctx.error(("queue", "url"), f'backend "redis" needs a redis:// or rediss:// url, got {queue.url!r}',
                        also=(("queue", "backend"),))
    tier = policy.parallel.tier
    if tier and tier not in adapter.tiers:
        known = _did_you_mean(tier, adapter.tiers) or (
            f" (tiers: {', '.join(map(repr, adapter.tiers))})" if adapter.tiers else " (no tiers are defined)")
        raise ctx.error(("parallel", "tier"), f"{tier!r} is not a table [adapter.tiers.{_name(tier)}]{known}",
                        also=(("adapter", "tiers"),))


# --- environment overrides -----------------------------------------------------------------


def _key_type(section: str, key: str) -> Any | None:
    """The type a top-level key of `section` expects, or None for an unknown key."""
    cls = _hints(Policy)[section]
    hints = _hints(cls)
    if key in _named_fields(cls):
        return hints[key]
    rest = _rest_field(cls)
    if rest is not None:
        item_type = typing.get_args(hints[rest.name])[1]
        if not dataclasses.is_dataclass(item_type):  # [resources]: any other key is a capacity
            return item_type
    return None


def _env_value(raw: str, tp: Any) -> Any:
    if tp is str:
        return raw
    try:
        parsed = tomllib.loads("v = " + raw)
    except tomllib.TOMLDecodeError:
        return raw
    return parsed["v"] if list(parsed) == ["v"] else raw


def _apply_env(data: Mapping, env: Mapping[str, str]) -> tuple[dict, dict[tuple[str, str], str]]:
    merged = {name: (dict(value) if _is_table(value) else value) for name, value in data.items()}
    origins: dict[tuple[str, str], str] = {}
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        rest = var[len(ENV_PREFIX):]
        section = next((s for s in SECTIONS if rest.startswith(s.upper() + "_")), None)
        if section is None:
            continue
        key = rest[len(section) + 1:].lower()
        tp = _key_type(section, key)
        if tp is None:
            named = _named_fields(_hints(Policy)[section])
            raise _error(f"{var}: {_where((section, key))}: unknown key{_did_you_mean(key, named)}")
        table = merged.setdefault(section, {})
        if _is_table(table):  # a non-table section is reported against the file
            table[key] = _env_value(env[var], tp)
            origins[(section, key)] = var
    return merged, origins


# --- public entry points -------------------------------------------------------------------


def policy_from_dict(data: Mapping, source: str = "<snapshot>", env: Mapping[str, str] | None = None) -> Policy:
    """Validate a TOML-shaped dict; with `env`, `BMAD_LOOP_<SECTION>_<KEY>` variables win over it."""
    origins: dict[tuple[str, str], str] = {}
    if env is not None and _is_table(data):
        data, origins = _apply_env(data, env)
    return _read_policy(_Context(source, origins), data)


def policy_path(project_dir: str | os.PathLike) -> Path:
    return Path(project_dir) / ".bmad-loop" / "policy.toml"


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
        raise _error(f"{path}: not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise _error(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _error(f"{path}: invalid TOML: {exc}") from exc
    return policy_from_dict(data, source=str(path), env=env)


def default_policy_text() -> str:
    """The commented template `bmad-loop init` writes; loading it yields the defaults."""
    return resources.files("bmad_loop").joinpath("policy_template.toml").read_text(encoding="utf-8")


def _dump(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("rest"):
                out.update({k: _dump(v) for k, v in item.items()})
            elif item is not None:  # TOML has no null: an unset optional key is left out
                out[f.name] = _dump(item)
        return out
    if isinstance(value, abc.Mapping):
        return {k: _dump(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_dump(v) for v in value]
    return value
