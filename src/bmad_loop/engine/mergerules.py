"""The merge rules in force for a run: the policy's `[integration] merge` and BMAD's ledger.

BMAD's review and build workflows append their deferred findings to
`{implementation_artifacts}/deferred-work.md`; without a rule, two parallel stories that each
append there always conflict. That ledger is `union` by default, wherever the project keeps it:
the folder BMAD's config names `implementation_artifacts` (`locations.implementation_artifacts`,
the layered TOML first), else the board's folder. The policy's rules win for the same glob.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from ..bmad.locations import implementation_artifacts
from ..errors import ConfigError
from ..globs import globs_may_overlap, is_literal, path_matches
from ..git.trees.settle import MergeRules
from ..policy.mergerule import MergeRule, MergeRuleKind

__all__ = ["LEDGER_NAME", "bmad_ledger", "check_merge_rules", "merge_rule_checks", "run_merge_rules"]

LEDGER_NAME = "deferred-work.md"


def bmad_ledger(root: Path, board_rel: str | None) -> str | None:
    """The repository-relative path of BMAD's deferred-work ledger, or None when neither a BMAD
    config nor a board in the repository places it."""
    try:
        folder = implementation_artifacts(Path(root))
    except ConfigError:
        folder = None  # an unreadable config is reported where the board is found
    if folder is None:
        if board_rel is None:
            return None
        folder = posixpath.dirname(board_rel)
    return posixpath.join(folder, LEDGER_NAME) if folder else LEDGER_NAME


def run_merge_rules(policy, root: Path, board_rel: str | None) -> MergeRules:
    """The policy's rules plus the built-in `union` for BMAD's ledger (anchored at its path)."""
    ledger = bmad_ledger(root, board_rel)
    builtin = [("/" + ledger, MergeRule(MergeRuleKind.UNION))] if ledger is not None else []
    return MergeRules.of(policy.integration.merge, builtin)


def check_merge_rules(policy, board_rel: str | None) -> None:
    """A rule may not cover the board or a `lane_owned` path: the lane writes those itself."""
    for glob in policy.integration.merge:
        where = f"{policy.source}: [integration] merge: {glob!r}"
        if board_rel is not None and path_matches(glob, board_rel):
            raise ConfigError(f"{where} covers the sprint board {board_rel}, which only the "
                              "lane writes: narrow the glob")
        for owned in policy.scm.lane_owned:
            if globs_may_overlap(glob, owned):
                raise ConfigError(f"{where} can match the lane-owned path {owned!r} "
                                  "([scm] lane_owned): narrow one of them")


def merge_rule_checks(project, policy, board_rel: str | None, target_sha: str | None) -> list[tuple[str, str]]:
    """`validate`'s lines: each rule in force, a configured glob that matches nothing on the
    target (the built-in ledger is created lazily by BMAD: never warned about), and a union
    ledger in the checkout that is neither committed nor ignored."""
    try:
        check_merge_rules(policy, board_rel)
    except ConfigError as exc:
        return [("error", str(exc))]
    rules = run_merge_rules(policy, project.root, board_rel)
    if not rules:
        return [("ok", "no merge rules")]
    tracked = _tracked(project, target_sha)
    lines = []
    for glob, rule in rules.rules:
        builtin = glob not in policy.integration.merge
        origin = "built-in (BMAD's deferred-work ledger)" if builtin else "[integration] merge"
        lines.append(("ok", f"{glob} = {rule.kind} ({origin})"))
        if not builtin and tracked is not None and not any(path_matches(glob, p) for p in tracked):
            lines.append(("warn", f"[integration] merge: {glob!r} matches no file on the target"))
    for status, detail in _loose_ledgers(project, rules, tracked):
        lines.append((status, detail))
    return lines


def _tracked(project, target_sha: str | None) -> list[str] | None:
    if not target_sha:
        return None
    git = project.git(project.policy)
    return [p for p in git.out("ls-tree", "-r", "-z", "--name-only", target_sha).split("\0") if p]


def _loose_ledgers(project, rules: MergeRules, tracked: list[str] | None):
    """A union ledger the checkout holds that git neither tracks nor ignores: its entries would
    die with each story's worktree."""
    if tracked is None:
        return
    known = set(tracked)
    git = project.git(project.policy)
    for glob, rule in rules.rules:
        if rule.kind != MergeRuleKind.UNION or not glob.startswith("/") or not is_literal(glob):
            continue
        path = glob[1:]
        if path in known or not (Path(project.root) / path).is_file():
            continue
        ignored = git.run("check-ignore", "-q", "--", path, check=False).returncode == 0
        if not ignored:
            yield ("warn", f"{path}: a union ledger that is neither committed nor ignored: "
                   "commit it, or git-ignore it to keep it in the checkout only")
