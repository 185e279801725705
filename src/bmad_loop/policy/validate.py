"""The generic validator: one pass over a TOML-shaped table, driven by the schema's type hints.

Each dataclass field's annotated type says what a value must be (`convert`), and its metadata
holds the checks (`checked`, see `bmad_loop.policy.checks`). `read_table` reads one table into its
dataclass, refusing unknown keys with the nearest valid one. Every problem is a one-line
`ConfigError` naming where the value came from (`Context`), the section and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import re
import types
import typing
from collections import abc
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from ..caches import CACHES
from ..errors import ConfigError

__all__ = [
    "Context",
    "checked",
    "convert",
    "describe",
    "did_you_mean",
    "error",
    "field_of",
    "hints",
    "is_table",
    "name",
    "named_fields",
    "read_table",
    "rest_field",
    "where",
]


class Context:
    """Where values came from: the file (or snapshot) `source`, or, for (section, key) pairs
    set from the environment, the variable's name."""

    def __init__(self, source: str, env_origins: Mapping[tuple[str, ...], str] | None = None):
        self.source = source
        self.env_origins = env_origins or {}

    def origin(self, *paths: tuple[str, ...]) -> str:
        for path in paths:
            if path[:2] in self.env_origins:
                return self.env_origins[path[:2]]
        return self.source

    def error(self, path: tuple[str, ...], message: str, *,
              also: tuple[tuple[str, ...], ...] = ()) -> ConfigError:
        return error(f"{self.origin(path, *also)}: {where(path)}: {message}")


def error(message: str) -> ConfigError:
    """A `ConfigError` whose message is one line, whatever `message` holds."""
    return ConfigError(" ".join(message.split("\n")))


_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def name(key: str) -> str:
    """A key as TOML writes it: bare when it can be, quoted otherwise."""
    key = str(key)
    return key if _BARE.fullmatch(key) else '"%s"' % key.replace("\\", "\\\\").replace('"', '\\"')


def where(path: tuple[str, ...]) -> str:
    """("adapter", "tiers", "fast", "timeout_s") -> "[adapter.tiers.fast] timeout_s"."""
    if len(path) == 1:
        return f"[{name(path[0])}]"
    return f"[{'.'.join(map(name, path[:-1]))}] {name(path[-1])}"


def did_you_mean(key: str, candidates: Iterable[str], cutoff: float = 0.6) -> str:
    close = difflib.get_close_matches(str(key).lower(), list(candidates), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(value: Any) -> str:
    """What a value is, for "expected X, got Y": `integer 3`, `string 'a'`, `table`, ..."""
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


_EXPECTED = {bool: "a boolean", int: "an integer", str: "a string", float: "a number"}

# TOML integers are signed 64-bit; a parser (or an override) may hand over more. Past this
# range a value would only fail later, in the database or in time arithmetic.
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def is_table(value: Any) -> bool:
    return isinstance(value, abc.Mapping)


def convert(ctx: Context, path: tuple[str, ...], value: Any, tp: Any) -> Any:
    """Check `value` against the annotated type `tp` and return its immutable form."""
    reader = getattr(tp, "read_toml", None)
    if reader is not None:  # a type with a TOML shape of its own (a merge rule)
        return reader(ctx, path, value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return read_table(ctx, path, value, tp)
    origin = typing.get_origin(tp)
    if origin is types.UnionType:  # `X | None`: TOML has no null, so only X can arrive
        (inner,) = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        return convert(ctx, path, value, inner)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ctx.error(path, f"expected an array of strings, got {describe(value)}")
        for index, item in enumerate(value, 1):
            if not isinstance(item, str):
                raise ctx.error(path, f"expected an array of strings, item {index} is {describe(item)}")
        return tuple(value)
    if origin is abc.Mapping:
        if not is_table(value):
            raise ctx.error(path, f"expected a table, got {describe(value)}")
        item_type = typing.get_args(tp)[1]
        return MappingProxyType({str(k): convert(ctx, path + (str(k),), v, item_type) for k, v in value.items()})
    if is_word(tp):
        tp = str  # a word from `policy.choices`: read as a string, checked by the field's `one_of`
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)  # `max_cost_per_run = 5` means 5.0
    if (tp is int and isinstance(value, bool)) or not isinstance(value, tp):  # bool is not an int
        raise ctx.error(path, f"expected {_EXPECTED[tp]}, got {describe(value)}")
    if tp is int and not INT64_MIN <= value <= INT64_MAX:  # TOML ints are 64-bit; Python's are not
        raise ctx.error(path, f"integer {_short(str(value), 30)} is out of range "
                              f"(a 64-bit integer, at most {INT64_MAX})")
    return value


def is_word(tp: Any) -> bool:
    """Is `tp` one of the word enums of `policy.choices`? Such a key is read as a string."""
    return isinstance(tp, type) and issubclass(tp, enum.StrEnum)


def checked(ctx: Context, path: tuple[str, ...], value: Any, tp: Any, spec: dataclasses.Field) -> Any:
    """`convert`, then the field's own checks (on every value of a mapping when `each`)."""
    value = convert(ctx, path, value, tp)
    checks = spec.metadata.get("checks", ())
    items: list[tuple[tuple[str, ...], Any]] = (
        [((key,), item) for key, item in value.items()] if spec.metadata.get("each")
        else [((), value)])
    for suffix, item in items:
        item_path = path + suffix
        for check in checks:
            message = None if item is None else check(item)
            if message:
                raise ctx.error(item_path, message)
    return value


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


CACHES.register("policy.type_hints", hints.cache_clear, bound="one per schema class",
                holds="a policy section's class -> its fields' types")


def field_of(cls: type, key: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == key)


def named_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("rest")}


def rest_field(cls: type) -> dataclasses.Field | None:
    return next((f for f in dataclasses.fields(cls) if f.metadata.get("rest")), None)


def read_table(ctx: Context, path: tuple[str, ...], value: Any, cls: type) -> Any:
    """The dataclass `cls` read from table `value`; unknown keys name the nearest known one."""
    if not is_table(value):
        raise ctx.error(path, f"expected a table, got {describe(value)}")
    types_, named, rest = hints(cls), named_fields(cls), rest_field(cls)
    rest_takes_tables_only = rest is not None and dataclasses.is_dataclass(typing.get_args(types_[rest.name])[1])
    kwargs: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for key, raw in value.items():
        if key in named:
            kwargs[key] = checked(ctx, path + (key,), raw, types_[key], named[key])
        elif rest is not None and (is_table(raw) or not rest_takes_tables_only):
            others[key] = raw
        else:
            raise ctx.error(path + (key,), "unknown key" + did_you_mean(key, named))
    if rest is not None:
        kwargs[rest.name] = checked(ctx, path, others, types_[rest.name], rest)
    return cls(**kwargs)
