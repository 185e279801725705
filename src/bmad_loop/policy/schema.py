"""The policy schema: one frozen dataclass per section of `policy.toml`, and `Policy` over them.

Each field's type says what the key takes and its `setting` metadata holds the checks (enums,
ranges, formats, see `bmad_loop.policy.checks`). Rules that span keys (the `max_parallel` guard,
remote mode, profile-or-command, the redis url, the lane tier) are `check_policy`, run once the
sections are read. `Policy.to_dict` gives the TOML shape back, for the run's snapshot.

`verify_advice` and its kind are warnings `validate` gives about a policy that works but will
disappoint in the morning: `validate` check rows (`name`, `status`, `detail`), never a failure.
"""

from __future__ import annotations

import dataclasses
from collections import abc
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..states import AGENT_PHASES
from ..agents.logcap import MIN_CAP
from .checks import (
    MAX_PARALLEL,
    MAX_VERIFY_PARALLEL,
    argv_template,
    at_least,
    at_most,
    choice,
    commit_template,
    empty_map,
    globs,
    globs_of_keys,
    non_empty,
    parse_ports,
    ports,
    profile,
    repo_paths,
    seconds,
    setting,
    url,
)
from .choices import (BranchPer, CreateMode, Drift, ExtraKeys, FootprintDefault, GateMode,
                      Isolation, MergeClass, MergeStrategy, OnEscalation, OnForeignMove, OnLimit,
                      QueueBackendKind, Sandbox, Verdict)
from .mergerule import MergeRule
from .validate import Context, checked, did_you_mean, error, field_of, name

__all__ = [
    "SECTIONS",
    "identity_keys",
    "AdapterPolicy",
    "CleanupPolicy",
    "DatabasePolicy",
    "FootprintOverride",
    "FootprintsPolicy",
    "GatesPolicy",
    "IntegrationPolicy",
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
    "check_max_parallel",
    "check_policy",
    "verify_advice",
]


@dataclass(frozen=True)
class ScmPolicy:
    isolation: Isolation = choice(Isolation.WORKTREE, identity=True)
    branch_per: BranchPer = choice(BranchPer.STORY, identity=True)
    target_branch: str = setting("", identity=True)
    merge_strategy: MergeStrategy = choice(MergeStrategy.MERGE)
    # One thread, worktree and agent per slot: past MAX_PARALLEL a run would not start, it would
    # try to make that many threads.
    max_parallel: int = setting(1, checks=(at_least(1), at_most(MAX_PARALLEL)))
    keep_failed: bool = True
    delete_branch: bool = True
    rollback_on_failure: bool = False
    worktree_seed: tuple[str, ...] = setting((), checks=(repo_paths,))
    seed_adapter_defaults: bool = True
    # Copy the BMAD install (skills, `_bmad/`, `.bmad-core/`) into each worktree where the
    # checkout has it untracked: a worktree holds only tracked files.
    seed_bmad: bool = True
    commit_message_template: str = setting("{story_key}: {story_title}", checks=(commit_template,))
    author_name: str = "bmad-loop"
    author_email: str = "bmad-loop@localhost"
    lane_owned: tuple[str, ...] = setting((), checks=(globs,))
    remote: str = setting("", identity=True)
    # How long bmad-loop waits for a git lock another process holds before the run pauses.
    lock_wait_s: int = seconds(30, 0)
    # The target moved by anyone but the lane: pause for a human, or accept and recompose on it.
    on_foreign_move: OnForeignMove = choice(OnForeignMove.PAUSE)
    # Hooks bmad-loop's own git runs (pinned, from the project's hooks folder); none by default.
    run_hooks: tuple[str, ...] = ()
    # A landed story's worktree is reset to a new one's state and taken by the next story
    # (engine/workspace/pool.py); false: every story gets a fresh checkout.
    reuse_worktrees: bool = True
    # Ignored folders a reused worktree keeps for the next story (opt-in, e.g. [".venv"]),
    # anchored at the worktree's root: a file planted there runs in the next story's verify.
    reuse_keep: tuple[str, ...] = setting((), checks=(globs,))


@dataclass(frozen=True)
class LimitsPolicy:
    max_dev_attempts: int = setting(2, checks=(at_least(1),))
    max_create_attempts: int = setting(2, checks=(at_least(1),))  # create sessions per story
    max_review_cycles: int = setting(3, checks=(at_least(0),))
    max_recompose: int = setting(3, checks=(at_least(0),))
    max_recoveries: int = setting(3, checks=(at_least(0),))  # orphan recoveries per story
    # Repair sessions of one story (its candidate failed on the current target, or did not
    # compose) before it escalates; 0: escalate at once, as before repairs existed.
    max_repairs: int = setting(2, checks=(at_least(0),))
    # Budgets from the agent CLIs' own usage reports: crossing one pauses the run (none: no limit).
    max_cost_per_run: float | None = setting(None, checks=(at_least(0),))  # US dollars
    max_tokens_per_story: int | None = setting(None, checks=(at_least(1),))  # input + output
    # One session or verify log: its first half, a marker, its rolling last half (logcap.py).
    max_log_bytes: int = setting(64 * 1024 * 1024, checks=(at_least(MIN_CAP),))


@dataclass(frozen=True)
class VerifyPolicy:
    commands: tuple[str, ...] = ()  # shell strings
    timeout_s: int = seconds(1800, 1)
    # A failing command runs again on the very same (reset) tree this many times before it
    # counts; a pass on a retry is a flake (journaled `verify.flaky`). 0: no retries.
    retries: int = setting(1, checks=(at_least(0), at_most(5)))
    # How many speculative candidates the lane verifies at once; None: the run's max_parallel
    # (at most MAX_VERIFY_PARALLEL either way).
    parallel: int | None = setting(None, checks=(at_least(1), at_most(MAX_VERIFY_PARALLEL)))
    # Run each command in the OS sandbox (bmad_loop.sandbox): "auto" where it works, "on", "off".
    sandbox: Sandbox = choice(Sandbox.AUTO)

    def depth(self, max_parallel: int) -> int:
        """How many candidates the lane verifies at once in a run of `max_parallel`: 1 without
        commands (nothing slow to overlap) and at max_parallel 1, where each story starts on its
        predecessor's integrated result, so nothing could be ready to stack on a candidate."""
        if not self.commands or max_parallel <= 1:
            return 1
        return self.parallel if self.parallel is not None else min(max_parallel, MAX_VERIFY_PARALLEL)


@dataclass(frozen=True)
class GatesPolicy:
    mode: GateMode = choice(GateMode.PER_EPIC)


@dataclass(frozen=True)
class PhaseOverride:
    command: tuple[str, ...] | None = setting(None, checks=(non_empty, argv_template))
    timeout_s: int | None = seconds(None, 1)
    env: Mapping[str, str] = setting(factory=empty_map)


@dataclass(frozen=True)
class TierPolicy:
    model: str = ""
    args: tuple[str, ...] = setting((), checks=(argv_template,))
    timeout_s: int | None = seconds(None, 1)


@dataclass(frozen=True)
class AdapterPolicy:
    profile: str = setting("", checks=(profile,))
    command: tuple[str, ...] = setting((), checks=(argv_template,))
    timeout_s: int = seconds(5400, 1)
    # No output and no CPU in the session's process tree for this long: killed as stalled (0: off).
    stall_s: int = seconds(600, 0)
    env: Mapping[str, str] = setting(factory=empty_map)
    tmux: bool = False
    # How a review says its verdict: "marker" (a printed line) or "exit" (the exit status);
    # empty: the profile's ("marker") for a profile, "exit" for a custom command.
    verdict: Verdict = choice(Verdict.PROFILE)
    extra_args: tuple[str, ...] = setting((), checks=(argv_template,))  # added to the command
    # An environment fault with a reset time (a usage limit): pause the run, or wait and go on.
    on_limit: OnLimit = choice(OnLimit.PAUSE)
    # A custom command writes its tokens and cost to $BMAD_LOOP_USAGE_FILE (engine/usage.py).
    reports_usage: bool = False
    create: PhaseOverride = setting(factory=PhaseOverride)
    dev: PhaseOverride = setting(factory=PhaseOverride)
    review: PhaseOverride = setting(factory=PhaseOverride)
    fix: PhaseOverride = setting(factory=PhaseOverride)
    repair: PhaseOverride = setting(factory=PhaseOverride)
    tiers: Mapping[str, TierPolicy] = setting(factory=empty_map)
    # Run each session in the OS sandbox (bmad_loop.sandbox): "auto" where it works, "on", "off";
    # sandbox_writable: more folders the box may write (absolute, or ~/...), for both boxes.
    sandbox: Sandbox = choice(Sandbox.AUTO)
    sandbox_writable: tuple[str, ...] = ()

    def phase(self, name: str) -> PhaseOverride:
        if name not in AGENT_PHASES:
            raise ValueError(f"unknown phase {name!r}; phases are {', '.join(AGENT_PHASES)}")
        return getattr(self, name)

    def timeout_for(self, phase: str, tier: str = "") -> int:
        """An agent session's timeout, the one place that decides it: the most specific wins,
        tier > phase > adapter. A tier no table defines has no timeout of its own."""
        tier_timeout = self.tiers[tier].timeout_s if tier in self.tiers else None
        for timeout in (tier_timeout, self.phase(phase).timeout_s):
            if timeout is not None:
                return timeout
        return self.timeout_s


@dataclass(frozen=True)
class LeasesPolicy:
    ttl_s: int = seconds(60, 3)


@dataclass(frozen=True)
class StoriesPolicy:
    sprint_status: str = ""
    story_dir: str = ""
    # A selected backlog story without a story file: the agent writes it (create phase), the
    # story is left out of the plan, or the plan is refused.
    create: CreateMode = choice(CreateMode.AGENT)
    # Board keys outside the story grammar (`hotfix-login`): listed by validate, or run as stories.
    extra_keys: ExtraKeys = choice(ExtraKeys.IGNORE)


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
    default: FootprintDefault = choice(FootprintDefault.EXCLUSIVE)
    drift: Drift = choice(Drift.WARN)
    overrides: Mapping[str, FootprintOverride] = setting(factory=empty_map, rest=True)


@dataclass(frozen=True)
class ResourcesPolicy:
    capacities: Mapping[str, int] = setting(factory=empty_map, checks=(at_least(1),),
                                            each=True, rest=True)
    ports: str = setting("", checks=(ports,))

    def capacity(self, name: str) -> int:
        """A resource no key names has capacity 1."""
        return self.capacities.get(name, 1)

    @property
    def port_range(self) -> tuple[int, int] | None:
        """`ports` as (low, high), both inclusive; None when unset."""
        return parse_ports(self.ports) if self.ports else None


@dataclass(frozen=True)
class NotifyPolicy:
    command: tuple[str, ...] = ()
    webhook: str = setting("", checks=(url("http://", "https://", example="https://host/hook"),))
    timeout_s: int = seconds(10, 1)


@dataclass(frozen=True)
class QueuePolicy:
    backend: QueueBackendKind = choice(QueueBackendKind.SQLITE, identity=True)
    url: str = setting("", identity=True)


@dataclass(frozen=True)
class DatabasePolicy:
    url: str = setting("", checks=(url(example="postgresql+psycopg://host/db"),), identity=True)
    # SQLite: how long a command waits for a lock another process holds before it gives up.
    lock_wait_s: int = seconds(30, 0, identity=True)


@dataclass(frozen=True)
class ParallelPolicy:
    on_escalation: OnEscalation = choice(OnEscalation.PAUSE)
    merge_class: MergeClass = choice(MergeClass.SELF)
    tier: str = ""


@dataclass(frozen=True)
class IntegrationPolicy:
    # glob -> how the lane settles that path when composing (see policy/mergerule.py); the
    # built-in BMAD ledger rule is added where the project is known (engine/mergerules.py).
    merge: Mapping[str, MergeRule] = setting(factory=empty_map, checks=(globs_of_keys,))


@dataclass(frozen=True)
class CleanupPolicy:
    keep_runs: int = setting(10, checks=(at_least(0),))


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
    integration: IntegrationPolicy = field(default_factory=IntegrationPolicy)
    cleanup: CleanupPolicy = field(default_factory=CleanupPolicy)
    # Where the policy came from; provenance, not content, so it takes no part in ==.
    source: str = field(default="<defaults>", compare=False)

    def to_dict(self) -> dict:
        """A plain JSON-able dict in the TOML shape; `policy_from_dict` reads it back."""
        return {section: _dump(getattr(self, section)) for section in SECTIONS}

    def with_max_parallel(self, n: Any, source: str = "--parallel") -> Policy:
        """This policy with `[scm] max_parallel = n`, validated like the key; errors name `source`."""
        ctx = Context(source)
        path = ("scm", "max_parallel")
        n = checked(ctx, path, n, int, field_of(ScmPolicy, "max_parallel"))
        scm = dataclasses.replace(self.scm, max_parallel=n)
        check_max_parallel(ctx, scm)
        return dataclasses.replace(self, scm=scm)

    def with_gates_mode(self, mode: Any, source: str = "--gates") -> Policy:
        """This policy with `[gates] mode = mode`, validated like the key; errors name `source`."""
        ctx = Context(source)
        mode = checked(ctx, ("gates", "mode"), mode, str, field_of(GatesPolicy, "mode"))
        return dataclasses.replace(self, gates=dataclasses.replace(self.gates, mode=mode))


SECTIONS = tuple(f.name for f in dataclasses.fields(Policy) if f.name != "source")


def identity_keys() -> dict[str, tuple[str, ...]]:
    """Section -> the keys marked `identity=True`: what a run is, which `resume
    --reload-policy` never changes."""
    found = {}
    for section in SECTIONS:
        cls = type(getattr(Policy(), section))
        keys = tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("identity"))
        if keys:
            found[section] = keys
    return found


# --- rules that span keys ------------------------------------------------------------------


def check_max_parallel(ctx: Context, scm: ScmPolicy) -> None:
    if scm.max_parallel > 1 and (scm.isolation, scm.branch_per) != ("worktree", "story"):
        origin = ctx.origin(("scm", "max_parallel"), ("scm", "isolation"), ("scm", "branch_per"))
        raise error(f'{origin}: [scm] max_parallel = {scm.max_parallel} needs [scm] isolation = "worktree"'
                    f' and [scm] branch_per = "story"')


def check_policy(ctx: Context, policy: Policy) -> None:
    """The rules no single key can check; a `ConfigError` naming the keys involved."""
    check_max_parallel(ctx, policy.scm)
    scm = policy.scm
    if scm.remote.strip() and (scm.isolation, scm.branch_per) != ("worktree", "story"):
        origin = ctx.origin(("scm", "remote"), ("scm", "isolation"), ("scm", "branch_per"))
        raise error(f'{origin}: [scm] remote = "{scm.remote}" (remote mode) needs [scm] isolation = '
                    '"worktree" and [scm] branch_per = "story"')
    adapter = policy.adapter
    if adapter.profile and adapter.command:
        raise ctx.error(("adapter", "command"), "set either [adapter] profile or [adapter] command, not both",
                        also=(("adapter", "profile"),))
    queue = policy.queue
    if queue.backend == QueueBackendKind.REDIS and not queue.url.startswith(("redis://", "rediss://")):
        raise ctx.error(("queue", "url"), f'backend "redis" needs a redis:// or rediss:// url, got {queue.url!r}',
                        also=(("queue", "backend"),))
    tier = policy.parallel.tier
    if tier and tier not in adapter.tiers:
        known = did_you_mean(tier, adapter.tiers) or (
            f" (tiers: {', '.join(map(repr, adapter.tiers))})" if adapter.tiers else " (no tiers are defined)")
        raise ctx.error(("parallel", "tier"), f"{tier!r} is not a table [adapter.tiers.{name(tier)}]{known}",
                        also=(("adapter", "tiers"),))


# --- advice: a valid policy that probably does less than a person expects -------------------


def verify_advice(policy: Policy) -> list[dict[str, str]]:
    """With no `[verify] commands`, nothing checks a story's work or the combined candidate:
    every story an agent finishes is integrated as it stands."""
    if policy.verify.commands:
        return []
    return [{"name": "verify", "status": "warn",
             "detail": f"{policy.source}: [verify] commands is empty: stories and candidates are "
                       "integrated without any check (add your test command)"}]


def _dump(value: Any) -> Any:
    if hasattr(value, "to_toml"):  # a value with a TOML shape of its own (a merge rule)
        return value.to_toml()
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
