"""The values a policy key may choose from, one enum per key that takes a word.

The schema declares each such key with `choice(Enum, default)`: the enum is the list of
allowed values that the check, the error message and the docs all use. Values stay plain
strings once loaded (a StrEnum member compares equal to its string), so snapshots written by
earlier versions read the same."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Isolation", "BranchPer", "MergeStrategy", "OnForeignMove", "Sandbox", "GateMode",
           "Verdict", "OnLimit", "CreateMode", "ExtraKeys", "FootprintDefault", "Drift",
           "QueueBackendKind", "OnEscalation", "MergeClass"]


class Isolation(StrEnum):
    NONE = "none"  # the agent works in the checkout itself
    WORKTREE = "worktree"  # a git worktree per story (or per run)


class BranchPer(StrEnum):
    STORY = "story"
    RUN = "run"


class MergeStrategy(StrEnum):
    FF = "ff"
    MERGE = "merge"
    SQUASH = "squash"


class OnForeignMove(StrEnum):
    PAUSE = "pause"  # the target moved outside bmad-loop: a human looks
    ACCEPT = "accept"  # take the new target and compose on it


class Sandbox(StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


class GateMode(StrEnum):
    NONE = "none"
    PER_EPIC = "per-epic"
    PER_STORY_SPEC_APPROVAL = "per-story-spec-approval"


class Verdict(StrEnum):
    PROFILE = ""  # the profile's own way
    MARKER = "marker"
    EXIT = "exit"


class OnLimit(StrEnum):
    PAUSE = "pause"
    WAIT = "wait"


class CreateMode(StrEnum):
    AGENT = "agent"
    SKIP = "skip"
    REQUIRE = "require"


class ExtraKeys(StrEnum):
    IGNORE = "ignore"
    RUN = "run"


class FootprintDefault(StrEnum):
    EXCLUSIVE = "exclusive"


class Drift(StrEnum):
    WARN = "warn"
    ESCALATE = "escalate"


class QueueBackendKind(StrEnum):
    """The kinds of queue storage (queue/backends.py has one class per kind)."""
    SQLITE = "sqlite"
    REDIS = "redis"


class OnEscalation(StrEnum):
    PAUSE = "pause"
    CONTINUE = "continue"


class MergeClass(StrEnum):
    SELF = "self"  # the lane integrates the story on its own
    OPERATOR = "operator"  # an operator signs it off first
