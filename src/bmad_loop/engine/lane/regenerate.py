"""Derived files regenerated in a candidate: the `regenerate` merge rules (git/trees/settle.py).

Composition left the rule's paths at the target's version. Here the lane checks the candidate
out, runs each rule's command (as verify commands run: one shell, its own log, the timeout,
the whole process tree killed), once per folder of the paths it settles, in that folder (plus
the rule's `cwd`), and commits what it wrote to the rule's paths into the candidate: a merge or
squash candidate is made again with the regenerated tree (same parents, message and dates); an
`ff` candidate gets one lane commit on top. A failing command, or one that changes a tracked
file outside the rules' globs, fails the candidate (the story escalates with the log's tail).
Untracked output outside the globs (`node_modules`) is left in the worktree and not committed.

The command is project code a story may edit, so the lane trusts nothing of the worktree but
its files: changes are found against the composed tree the lane recorded (through an index of
its own), and the commit is that tree plus the files under the rules' globs. A command that
moves the worktree's HEAD, or stages or changes a tracked file outside the globs, fails the
candidate.

A regenerated candidate is as deterministic as its generator: the same command can resolve other
versions tomorrow (a registry changes overnight).
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast


from ...git.trees.compose import Composition
from ...globs import path_matches
from ...policy.mergerule import MergeRuleKind
from ...git.trees.settle import Regeneration, Settled
from ...git.trees.edit import read_objects
from ...git.worktrees import ensure_detached_worktree
from ...agents.process import Limits
from ...sandbox import Box
from ..verification.runner import VerifySite, run_verify
from ...git.runner import Git

__all__ = ["GeneratorInput", "RegenerateRun", "regenerate", "settled_events"]

_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}


@dataclass(frozen=True)
class RegenerateRun:
    """One run of a generator: for the journal and the candidate's evidence."""

    glob: str
    command: str
    cwd: str  # repository-relative
    exit_code: int | None
    timed_out: bool
    log: str

    def to_dict(self) -> dict:
        return {"glob": self.glob, "command": self.command, "cwd": self.cwd,
                "exit_code": self.exit_code, "timed_out": self.timed_out, "log": self.log}


@dataclass(frozen=True)
class _Regenerated:
    sha: str | None  # the regenerated candidate; None: it failed (`reason` says why)
    tree: str | None
    reason: str | None
    runs: tuple[RegenerateRun, ...]
    settled: tuple[Settled, ...]
    output: str = ""  # the failing command's output tail


@dataclass(frozen=True)
class GeneratorInput:
    """What the generators work on: the composed candidate and its three inputs."""

    comp: Composition
    base: str
    target: str
    story: str
    key: str


def regenerate(git: Git, cand: GeneratorInput, *, worktree: Path, log_path: Path,
               env: dict[str, str], run_id: str, box: Box | None = None) -> Composition:
    """The candidate with its generators run: regenerated, or failed (`sha` None, `failure`
    naming why, the rules' paths as its conflicts)."""
    comp = cand.comp
    done = _run_all(git, cand, worktree, _Run(log_path, env, run_id, box))
    if done.sha is None:
        paths = tuple(p for job in comp.regenerate for p in job.paths)
        return replace(comp, sha=None, conflicts=paths, failure=done.reason,
                       failure_output=done.output, regenerated=done.runs)
    return replace(comp, sha=done.sha, tree=done.tree, settled=comp.settled + done.settled,
                   regenerated=done.runs)


def settled_events(comp: Composition) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(journal data, evidence) for a composition that settled paths: one `candidate.settled`
    per path (a regenerated one with its commands), and the evidence file's payload."""
    runs = [r.to_dict() for r in comp.regenerated]
    events = [{**settled.to_dict(),
               **({"commands": [r for r in runs if r["glob"] == settled.glob]}
                  if settled.rule == MergeRuleKind.REGENERATE else {})} for settled in comp.settled]
    evidence = {"kind": "settled", "candidate_sha": comp.sha,
                "settled": [x.to_dict() for x in comp.settled], "regenerated": runs}
    return events, evidence


@dataclass(frozen=True)
class _Run:
    """How each command runs: its log, environment, run and box (None: unboxed)."""

    log_path: Path
    env: dict[str, str]
    run_id: str
    box: Box | None = None


def _run_all(git: Git, cand: GeneratorInput, worktree: Path, how: _Run) -> _Regenerated:
    comp = cand.comp
    composed = cast(str, comp.sha)  # only a composition that is a commit is regenerated
    ensure_detached_worktree(git, worktree, composed)
    runs: list[RegenerateRun] = []
    for job in comp.regenerate:
        for folder in sorted({posixpath.dirname(p) for p in job.paths}):
            run, failed = _run_one(job, folder, worktree, how)
            runs.append(run)
            if failed is not None:
                return _Regenerated(None, None, failed.reason, tuple(runs), (), failed.output)
    globs = [job.glob for job in comp.regenerate]
    head = git.rev("HEAD", cwd=worktree)
    if head != composed:  # the command checked something else out: nothing it left is trusted
        return _Regenerated(None, None, f"regenerating {', '.join(globs)} moved the candidate's HEAD "
                            f"from {composed[:12]} to {(head or 'nothing')[:12]}", tuple(runs), ())
    index = _private_index(how.log_path)
    try:
        tree = comp.tree or git.out("rev-parse", f"{composed}^{{tree}}")
        outside, written = _changes(git, worktree, globs, tree, index)
        if outside:
            return _Regenerated(None, None, f"regenerating {', '.join(globs)} changed tracked files "
                                f"outside the rule: {', '.join(outside[:10])}", tuple(runs), ())
        sha, tree = _commit(git, cand, worktree, written, index) if written else (composed, tree)
    finally:
        index.unlink(missing_ok=True)
    settled = _settled(git, cand, sha, [p for job in comp.regenerate for p in job.paths])
    return _Regenerated(sha, tree, None, tuple(runs), settled)


def _private_index(log_path: Path) -> Path:
    """An index file of the lane's own, beside the command's log (under `.bmad-loop/`, hidden
    from the box): the candidate worktree's own index is the command's to change."""
    index = log_path.with_name(log_path.name + ".index")
    index.unlink(missing_ok=True)
    return index


@dataclass(frozen=True)
class _Failure:
    reason: str
    output: str


def _run_one(job: Regeneration, folder: str, worktree: Path,
             how: _Run) -> tuple[RegenerateRun, _Failure | None]:
    rule = job.rule
    command = rule.command if isinstance(rule.command, str) else shlex.join(rule.command)
    rel = posixpath.normpath(posixpath.join(folder, rule.cwd)) if rule.cwd else (folder or ".")
    cwd = (worktree / rel).resolve()
    if not (cwd == worktree.resolve() or worktree.resolve() in cwd.parents):
        run = RegenerateRun(job.glob, command, rel, None, False, str(how.log_path))
        return run, _Failure(f"regenerate cwd {rule.cwd!r} for {folder or '.'} leads outside the "
                             "repository", "")
    cwd.mkdir(parents=True, exist_ok=True)
    result = run_verify([command], VerifySite(cwd, how.log_path, how.env, how.box, how.run_id),
                        Limits(timeout_s=rule.timeout_s))
    run = RegenerateRun(job.glob, command, rel, result.exit_code, result.timed_out,
                        str(how.log_path))
    if result.ok:
        return run, None
    ended = "timed out" if result.timed_out else f"exited {result.exit_code}"
    return run, _Failure(f"regenerating {', '.join(job.paths)} failed: {command} {ended} "
                         f"(log: {how.log_path})", result.output)


def _changes(git: Git, worktree: Path, globs: list[str], tree: str,
             index: Path) -> tuple[list[str], list[str]]:
    """(tracked paths changed outside `globs`, paths under `globs` changed or created), both
    against the composed `tree` the lane recorded, never the worktree's HEAD or index: the files
    through a private `index` read from `tree`, and the worktree's own index, which a command
    may have staged into (`git rm --cached`, `read-tree`), against `tree` too."""
    env = {"GIT_INDEX_FILE": str(index)}
    git.run("read-tree", tree, env=env)
    raw = git.run("status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=all",
                  cwd=worktree, env=env).stdout
    staged = git.run("diff-index", "--cached", "-z", "--name-only", "--no-renames", tree,
                     cwd=worktree).stdout
    outside, written = set(), set()
    for code, path in [(e[:2], e[3:]) for e in filter(None, raw.split("\0"))] + \
            [("S ", p) for p in filter(None, staged.split("\0"))]:
        if not any(path_matches(g, path, frozenset()) for g in globs):
            if code != "??":
                outside.add(path)
        elif code != "S ":  # the worktree's own staging never decides what is committed
            written.add(path)
    return sorted(outside), sorted(written)


def _commit(git: Git, cand: GeneratorInput, worktree: Path, paths: list[str],
            index: Path) -> tuple[str, str]:
    """The regenerated candidate: the composed tree (in the private `index`) with `paths`
    taken from the worktree's files."""
    env = {**_LITERAL, "GIT_INDEX_FILE": str(index)}
    git.run("add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul", input="\0".join(paths),
            cwd=worktree, env=env)
    tree = git.out("write-tree", cwd=worktree, env=env)
    composed = cast(str, cand.comp.sha)  # (see `_run_all`)
    info = git.commit_header(composed)
    env = git.identity_env(info["committer"][2])
    if cand.comp.strategy == "ff":  # the story's commits stay as they are: one lane commit on top
        parents, message = [composed], (f"bmad-loop: regenerate {', '.join(paths)} "
                                             f"for {cand.key}\n")
    else:
        parents, message = info["parents"], info["message"]
    argv = ["commit-tree", "--no-gpg-sign", tree]
    for p in parents:
        argv += ["-p", p]
    return git.out(*argv, input=message, env=env), tree


def _settled(git: Git, cand: GeneratorInput, sha: str, paths: list[str]) -> tuple[Settled, ...]:
    revs = (cand.base, cand.target, cand.story, sha)
    found = read_objects(git, [f"{rev}:{p}" for p in paths for rev in revs])
    out = []
    for i, path in enumerate(paths):
        shas = [o[0] if o is not None and o[1] == "blob" else None for o in found[4 * i:4 * i + 4]]
        glob = next(job.glob for job in cand.comp.regenerate if path in job.paths)
        out.append(Settled(path, MergeRuleKind.REGENERATE, glob, *shas))
    return tuple(out)
