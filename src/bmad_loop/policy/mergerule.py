"""`[integration] merge`: how the lane settles a path two stories both changed.

A rule is either the string ``"union"`` (an append-only ledger: the target's text, then each
story's appended suffix, in plan order) or a table ``{ regenerate = …, timeout_s, cwd,
always }`` (a derived file such as a lockfile: the lane takes the target's version and runs the
command in the candidate); its kind is a `MergeRuleKind` member. The table's keys are read
here, one line per problem, like every other key of the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any

from .checks import MAX_SECONDS
from .validate import Context, describe, did_you_mean, is_table

__all__ = ["MergeRule", "MergeRuleKind", "read_merge_rule"]


class MergeRuleKind(StrEnum):
    """How a rule settles a path (a member equals its string, as written in the policy)."""

    UNION = "union"  # an append-only ledger: the target's text, then each story's suffix
    REGENERATE = "regenerate"  # a derived file: the target's version, then the command


_TABLE_KEYS = (MergeRuleKind.REGENERATE.value, "timeout_s", "cwd", "always")


@dataclass(frozen=True)
class MergeRule:
    kind: MergeRuleKind
    # REGENERATE: an argv (a tuple) or a shell string, as `[verify] commands` are.
    command: tuple[str, ...] | str = ()
    timeout_s: int = 600
    cwd: str = ""  # relative to the matched file's folder ("" = that folder)
    always: bool = False  # run even when composition is clean

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", MergeRuleKind(self.kind))  # "union" is UNION

    @property
    def name(self) -> str:
        return self.kind.value

    def to_toml(self) -> Any:
        if self.kind == MergeRuleKind.UNION:
            return MergeRuleKind.UNION.value
        out: dict[str, Any] = {"regenerate": list(self.command) if isinstance(self.command, tuple)
                               else self.command, "timeout_s": self.timeout_s, "always": self.always}
        if self.cwd:
            out["cwd"] = self.cwd
        return out

    @classmethod
    def read_toml(cls, ctx: Context, path: tuple[str, ...], value: Any) -> "MergeRule":
        return read_merge_rule(ctx, path, value)


def read_merge_rule(ctx: Context, path: tuple[str, ...], value: Any) -> MergeRule:
    if isinstance(value, str):
        if value != MergeRuleKind.UNION:
            raise ctx.error(path, f'must be "union" or a table {{ regenerate = ... }}, got {value!r}')
        return MergeRule(MergeRuleKind.UNION)
    if not is_table(value):
        raise ctx.error(path, f'must be "union" or a table {{ regenerate = ... }}, got {describe(value)}')
    for key in value:
        if key not in _TABLE_KEYS:
            raise ctx.error(path + (key,), "unknown key" + did_you_mean(key, _TABLE_KEYS))
    if "regenerate" not in value:
        raise ctx.error(path, "a table rule needs regenerate = [argv] or \"shell command\"")
    return MergeRule(MergeRuleKind.REGENERATE, _command(ctx, path + ("regenerate",), value["regenerate"]),
                     timeout_s=_timeout(ctx, path + ("timeout_s",), value.get("timeout_s", 600)),
                     cwd=_cwd(ctx, path + ("cwd",), value.get("cwd", ""), glob=path[-1]),
                     always=_flag(ctx, path + ("always",), value.get("always", False)))


def _command(ctx: Context, path: tuple[str, ...], raw: Any) -> tuple[str, ...] | str:
    if isinstance(raw, str):
        if not raw.strip():
            raise ctx.error(path, "must not be empty")
        return raw
    if isinstance(raw, list) and raw and all(isinstance(a, str) for a in raw) and raw[0].strip():
        return tuple(raw)
    raise ctx.error(path, f"expected a non-empty array of strings or a string, got {describe(raw)}")


def _timeout(ctx: Context, path: tuple[str, ...], raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ctx.error(path, f"expected an integer, got {describe(raw)}")
    if not 1 <= raw <= MAX_SECONDS:
        raise ctx.error(path, f"must be from 1 to {MAX_SECONDS}, got {raw}")
    return raw


def _cwd(ctx: Context, path: tuple[str, ...], raw: Any, glob: str) -> str:
    if not isinstance(raw, str):
        raise ctx.error(path, f"expected a string, got {describe(raw)}")
    if PurePosixPath(raw).is_absolute() or raw.startswith("~"):
        raise ctx.error(path, f"{raw!r} must be relative to the matched file's folder")
    # Relative to the matched file's folder: refused here when it climbs above the repository
    # from the shallowest folder the glob can match (the lane checks the real folder again).
    level = _least_depth(glob)
    for part in raw.split("/"):
        if part in ("", "."):
            continue
        level += -1 if part == ".." else 1
        if level < 0:
            raise ctx.error(path, f"{raw!r} leads outside the repository from the folder of "
                                  f"{glob!r} (at least {_least_depth(glob)} deep)")
    return raw


def _least_depth(glob: str) -> int:
    """How many folders deep, at least, the folder of a file `glob` matches is (`**` may
    match none; a glob ending in "/" names a folder, whose files lie inside it)."""
    parts = [p for p in glob.strip("/").split("/") if p]
    folders = parts if glob.endswith("/") else parts[:-1]
    return sum(1 for p in folders if p != "**")


def _flag(ctx: Context, path: tuple[str, ...], raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise ctx.error(path, f"expected a boolean, got {describe(raw)}")
    return raw
