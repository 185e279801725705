"""The merge rules in force for a run (the policy's `[integration] merge` and BMAD's ledger), and
the union ledgers a project keeps out of git.

BMAD's review and build workflows append their deferred findings to
`{implementation_artifacts}/deferred-work.md`; without a rule, two parallel stories that each
append there always conflict. That ledger is `union` by default, wherever the project keeps it:
the folder BMAD's config names `implementation_artifacts` (`locations.implementation_artifacts`,
the layered TOML first), else the board's folder. The policy's rules win for the same glob.

**Ledgers out of git**: seeded, captured at `ready`, appended after landing. Some projects
git-ignore BMAD's `deferred-work.md` (or another `union` ledger). Nothing of an ignored file
travels on a story's branch, so an agent's entries there would die with its worktree. For such
a ledger (a `union` rule naming one file, as the built-in one does):

1. each story worktree is seeded with the checkout's copy, and the seed is kept in the story's
   scratch folder (the checkout's copy moves on while the story works);
2. when the story reaches `ready`, before its worktree is parked or cleaned, the lines it added
   against that seed are captured into its row (`stories.ledger_lines`), so they travel to the
   lane's host in remote mode;
3. after the compare-and-swap that lands the story, before its row says `integrated`, the lane
   appends them to the checkout's copy. Integration is in plan order, so the appends are too.
   Each append is written ahead into `.bmad-loop/ledgers/<run>.json` (the story, each file's
   size before it): a lane killed between the advance and the append, or half-way through
   it, finds the record and completes or skips it, so nothing is lost or doubled. An escalated
   story's lines are never appended.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import os
import posixpath
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..bmad.locations import implementation_artifacts
from ..errors import ConfigError
from ..globs import globs_may_overlap, is_literal, path_matches
from ..git.trees.settle import MergeRules
from ..policy.mergerule import MergeRule, MergeRuleKind
from ..fileio import LinkRefused, read_beneath, write_atomic, write_beneath
from ..git.runner import Git
from ..policy import Policy

if TYPE_CHECKING:
    from .project import Project

__all__ = ["LEDGER_NAME", "bmad_ledger", "check_merge_rules", "merge_rule_checks",
           "run_merge_rules", "StoryLedgers", "append_ledger_lines", "captured_lines",
           "ignored_ledgers", "seed_ledgers"]


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


def run_merge_rules(policy: Policy, root: Path, board_rel: str | None) -> MergeRules:
    """The policy's rules plus the built-in `union` for BMAD's ledger (anchored at its path)."""
    ledger = bmad_ledger(root, board_rel)
    builtin = [("/" + ledger, MergeRule(MergeRuleKind.UNION))] if ledger is not None else []
    return MergeRules.of(policy.integration.merge, builtin)


def check_merge_rules(policy: Policy, board_rel: str | None) -> None:
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


def merge_rule_checks(project: Project, policy: Policy, board_rel: str | None,
                      target_sha: str | None) -> list[tuple[str, str]]:
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
    lines: list[tuple[str, str]] = []
    for glob, rule in rules.rules:
        builtin = glob not in policy.integration.merge
        origin = "built-in (BMAD's deferred-work ledger)" if builtin else "[integration] merge"
        lines.append(("ok", f"{glob} = {rule.kind} ({origin})"))
        if not builtin and tracked is not None and not any(path_matches(glob, p) for p in tracked):
            lines.append(("warn", f"[integration] merge: {glob!r} matches no file on the target"))
    for status, detail in _loose_ledgers(project, rules, tracked):
        lines.append((status, detail))
    return lines


def _tracked(project: Project, target_sha: str | None) -> list[str] | None:
    if not target_sha:
        return None
    git = project.git(project.policy)
    return [p for p in git.out("ls-tree", "-r", "-z", "--name-only", target_sha).split("\0") if p]


def _loose_ledgers(project: Project, rules: MergeRules,
                   tracked: list[str] | None) -> Iterator[tuple[str, str]]:
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


log = logging.getLogger(__name__)

_SEEDS = "ledger-seeds"
_RECORDS = "ledgers"


class LedgerWorkspace(Protocol):
    """What `StoryLedgers` needs of a story's workspace."""

    @property
    def root(self) -> Path: ...

    @property
    def story_worktrees(self) -> bool: ...


class LedgerStory(Protocol):
    """What `StoryLedgers` needs of a story worker's context."""

    @property
    def policy(self) -> Policy: ...

    @property
    def git(self) -> Git: ...

    @property
    def workspace(self) -> LedgerWorkspace: ...

    @property
    def board_rel(self) -> str | None: ...

    @property
    def scratch(self) -> Path: ...


class StoryLedgers:
    """A story worker's view: the run's merge rules, and the git-ignored union ledgers its
    worktree is seeded with (none in place, where the agent writes the checkout's copy)."""

    def __init__(self, ctx: LedgerStory) -> None:
        self.ctx = ctx
        self.rules = run_merge_rules(ctx.policy, ctx.workspace.root, ctx.board_rel)

    @functools.cached_property
    def paths(self) -> list[str]:
        if not self.ctx.workspace.story_worktrees:
            return []
        return ignored_ledgers(self.ctx.git, self.ctx.workspace.root, self.rules)

    def seed(self, worktree: Path) -> None:
        if self.paths:
            seed_ledgers(self.ctx.workspace.root, worktree, self.ctx.scratch, self.paths)

    def captured(self, worktree: str | None) -> dict[str, dict[str, str]]:
        """{"ledger_lines": …} for the story row at `ready`, or {} when nothing was added."""
        lines = captured_lines(Path(worktree), self.ctx.scratch, self.paths) if worktree else {}
        return {"ledger_lines": lines} if lines else {}


def ignored_ledgers(git: Git, root: Path, rules: MergeRules) -> list[str]:
    """The `union` ledgers (rules naming one file) that git ignores in the checkout at `root`."""
    named = [_literal_path(glob) for glob, rule in rules.rules if rule.kind == MergeRuleKind.UNION]
    paths = [p for p in named if p is not None]
    if not paths:
        return []
    # Tracked files are never reported: a committed ledger travels on the branches.
    proc = git.run("check-ignore", "-z", "--stdin", input="\0".join(paths), cwd=root, check=False)
    return sorted({p for p in proc.stdout.split("\0") if p} & set(paths))


def _literal_path(glob: str) -> str | None:
    """The one root-level path a glob names, or None (a wildcard, or a name at any depth)."""
    if any(c in glob for c in "*?[") or glob.endswith("/"):
        return None
    if glob.startswith("/"):
        return glob[1:]
    return glob if "/" in glob else None


def seed_ledgers(root: Path, worktree: Path, scratch: Path, paths: list[str]) -> None:
    """Copy the checkout's copy of each ledger into the worktree, and keep it as the seed.
    Nothing is written through a link (a ledger, or a folder on its way, made a symlink)."""
    Path(scratch).mkdir(parents=True, exist_ok=True)  # bmad-loop's own (its parents hidden)
    for path in paths:
        source = Path(root) / path
        text = source.read_bytes() if source.is_file() else b""
        try:
            write_beneath(Path(worktree), path, text)
            write_beneath(Path(scratch), f"{_SEEDS}/{path}", text)
        except LinkRefused as exc:
            log.warning("ledger %s not seeded in %s: %s", path, worktree, exc)


def captured_lines(worktree: Path, scratch: Path, paths: list[str]) -> dict[str, str]:
    """{path: the text the story added against its seed}, for the ledgers it added to. The
    worktree and the scratch are the box's to write: a ledger (or its seed) that is a symlink
    is never read (it could name the policy), and yields nothing."""
    captured = {}
    for path in paths:
        try:
            seed = read_beneath(Path(scratch), f"{_SEEDS}/{path}")
            if seed is None:
                continue  # seeded by an older bmad-loop, or not a story of this kind
            now = read_beneath(Path(worktree), path) or b""
        except LinkRefused as exc:
            log.warning("ledger %s of %s not captured: %s", path, worktree, exc)
            continue
        added = _added(seed.decode("utf-8", errors="surrogateescape"),
                       now.decode("utf-8", errors="surrogateescape"))
        if added:
            captured[path] = added
    return captured


def _added(seed: str, text: str) -> str:
    """The lines `text` adds to `seed`, in order (a pure append: exactly its suffix)."""
    if text.startswith(seed):
        return text[len(seed):]
    old, new = seed.splitlines(keepends=True), text.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    return "".join("".join(new[j1:j2]) for op, _i1, _i2, j1, j2 in matcher.get_opcodes()
                   if op in ("insert", "replace"))


def append_ledger_lines(root: Path, state_dir: Path, run_id: str, story_key: str,
                        lines: dict[str, str]) -> bool:
    """Append a landed story's captured lines to the checkout's ledgers, once: True when this
    call wrote them (False: nothing to append, or done before)."""
    if not lines:
        return False
    record_path = Path(state_dir) / _RECORDS / f"{run_id}.json"
    record = _read(record_path)
    key = story_key
    entry = record.get(key)
    if entry is not None and entry.get("done"):
        return False
    if entry is None:  # written ahead: where each file stood before this story's bytes
        entry = {"files": {path: _size(Path(root) / path) for path in sorted(lines)}, "done": False}
        record[key] = entry
        _write(record_path, record)
    for path, before in entry["files"].items():
        _append_once(Path(root) / path, before, lines[path].encode("utf-8", "surrogateescape"))
    entry["done"] = True
    _write(record_path, record)
    return True


def _append_once(file: Path, before: int, data: bytes) -> None:
    """Append `data` at offset `before`, unless a killed earlier call already did."""
    size = _size(file)
    if size >= before + len(data):
        with open(file, "rb") as handle:
            handle.seek(before)
            if handle.read(len(data)) == data:
                return  # appended before the kill
    file.parent.mkdir(parents=True, exist_ok=True)
    with open(file, "r+b" if file.exists() else "wb") as handle:
        handle.truncate(min(size, before) if size < before + len(data) else size)
        handle.seek(0, os.SEEK_END)
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _size(file: Path) -> int:
    try:
        return file.stat().st_size
    except FileNotFoundError:
        return 0


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=1, sort_keys=True))
