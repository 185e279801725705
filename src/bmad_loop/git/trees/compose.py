"""Commits, composition, compare-and-swap and checkout sync — everything that moves content.

`compose` builds the integration lane's candidate commit without touching any worktree or ref,
from plumbing alone (``merge-tree --write-tree``, ``commit-tree``). It is deterministic: the lane's
commits take their identity from `Git.identity` and both their dates from the story branch head's
committer date, so composing the same inputs twice yields the same SHA.

The merges and the replay of a story's commits (the ``ff`` strategy on a moved target) are in
merge.py; the merge rules that settle ledgers and derived files in settle.py.

The worker's commit of a story (`commit_worktree`) never holds the session folder
(`.bmad-loop-session/`, bmad-loop's prompt files in a story worktree): `info/exclude` keeps it
out of ``git add -A``, but an agent can still stage it — as a symlink (which
``/.bmad-loop-session/``, a folder pattern, does not match), with ``git add -f``, or in a commit
of its own. A story commit whose tree holds the name in any form is refused.

Globs (`path_matches`, used for lane-owned files) follow gitignore rules from the repository root:
a pattern without a slash (other than a trailing one) matches at any depth; a leading ``/`` or a
slash in the middle anchors it at the root; ``*`` and ``?`` and ``[...]`` never cross ``/``;
``**/`` matches any number of leading folders, ``/**`` everything inside, ``/**/`` zero or more
folders; a trailing ``/`` matches folders only; a pattern that matches a folder matches everything
under it; ``\\`` escapes. ``!`` negation is not supported.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ...errors import GitError
from ..locks import repo_lock
from ..runner import Git, is_full_sha
from ..worktrees import clear_flags
from .settle import Generators, MergeRules, Regeneration, Settled, Sides, settle
from .merge import commit_tree, committed_attributes, merge_base, merge_trees, replay_commits, tree_of
from ...caches import CACHES
from .diff import changed_paths, changed_status, dirty_paths, remember_diff  # noqa: F401 (re-exported)
from .edit import blob_at, blobs_at, replace_blob, replace_blobs  # noqa: F401 (re-exported)

__all__ = [
    "Composition",
    "LaneEdit",
    "Settling",
    "STRATEGIES",
    "dirty_paths",
    "changed_paths",
    "changed_status",
    "blob_at",
    "replace_blob",
    "replace_blobs",
    "blobs_at",
    "path_matches",
    "commit_worktree",
    "clear_operation_state",
    "commit_message",
    "integration_message",
    "compose",
    "cas_advance",
    "overlapping_dirty",
    "SESSION_FOLDER",
    "SessionFolderStaged",
    "refuse_session_folder",
]

STRATEGIES = ("ff", "merge", "squash")
_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}
SESSION_FOLDER = ".bmad-loop-session"


def _lane_text(message: str) -> str:
    return message if message.endswith("\n") else message + "\n"


# -- messages -----------------------------------------------------------------------------------


def commit_message(template: str, *, story_key: str, story_title: str | None, run_id: str,
                   epic: str | None) -> str:
    """`[scm] commit_message_template` filled in for one story: the message of the worker's
    commit, and the title of the lane's. A story without a title uses its key."""
    return template.format(story_key=story_key, story_title=story_title or story_key,
                           run_id=run_id, epic=epic)


def integration_message(title: str, strategy: str, branch: str) -> str:
    """The lane's commit message: `Merge <branch>` then `title` for a merge commit, else `title`."""
    if strategy == "merge":
        return f"Merge {branch}\n\n{title}\n"
    return f"{title}\n"


# -- globs --------------------------------------------------------------------------------------


def path_matches(globs: Iterable[str], path: str, directories: frozenset[str] | None = None) -> bool:
    """True when repository-relative `path` matches any of the gitignore-style `globs`.

    One matcher for the whole project: footprints, drift and lane-owned files agree. With
    `directories` (a tree's), a literal glob covers what is under it only where it names one
    of them (`globs.path_matches`), as admission reads footprints.
    """
    from ...globs import path_matches as matches

    return any(matches(g, path, directories) for g in globs if g.strip())


# -- the worker's commit -----------------------------------------------------------------------


def commit_worktree(
    git: Git,
    worktree: Path,
    message: str,
    base_sha: str,
    revert_globs: Sequence[str] = (),
    exclude: Sequence[str] = (),
    parents: Sequence[str] | None = None,
) -> tuple[str, list[str]]:
    """Commit what the agent left in `worktree`, after reverting lane-owned files.

    Every path matching `revert_globs` that the agent changed relative to `base_sha` (in its own
    commits or uncommitted) is restored to its `base_sha` content, or deleted if `base_sha` lacks
    it. Index flags that hide edits (skip-worktree, assume-unchanged) are taken off first. Then
    everything else is staged (``add -A``; repository-relative `exclude` paths, e.g.
    seeded untracked files, are left out) and committed with `git.identity`, unsigned and with
    no hook run. Returns (HEAD sha, reverted paths).

    The commit is plumbing (``write-tree``, ``commit-tree``, then ``update-ref`` of HEAD with
    its old value expected): its parents are exactly `parents` (default: HEAD), never what a
    ``MERGE_HEAD`` or ``CHERRY_PICK_HEAD`` in the worktree's admin entry says — the agent can
    write there. Those files are removed first. A commit is made when the tree differs from
    HEAD's, or when `parents` is not just HEAD (a merge, e.g. a repair's, whatever its tree).
    """
    worktree = Path(worktree)
    head, head_tree = clear_operation_state(git, worktree)
    clear_flags(git, worktree)  # an edit hidden behind an index flag is an edit (worktrees.py)
    exclude = _not_ignored(git, worktree, exclude)
    spec = (["--", "."] + [f":(exclude,literal){p}" for p in exclude]) if exclude else []
    git.run("add", "-A", *spec, cwd=worktree)
    reverted, changes = ([], {}) if not revert_globs else \
        _revert_lane_owned(git, worktree, base_sha, revert_globs)
    refuse_session_folder(git, worktree)  # what is staged is what the commit holds
    tree = git.out("write-tree", cwd=worktree)
    chosen = [head] if parents is None else list(parents)
    if chosen != [head] and head != chosen[0] and git.commit_header(head)["parents"] == chosen:
        return head, reverted  # made before a crash cut the step short: not made twice
    if tree != head_tree or chosen != [head]:
        # What git would take; a merge (a repair's) is dated from its inputs, the later of its
        # parents', so that the same inputs make the same commit.
        date = _now() if len(chosen) == 1 else max(
            (git.commit_date(p) for p in chosen), key=lambda d: int(d.split()[0].lstrip("@")))
        text = _cleaned(message)
        made = commit_tree(git, tree, chosen, text, git.identity_env(date))
        subject = text.split("\n", 1)[0]
        git.run("update-ref", "-m", f"commit: {subject}", "HEAD", made, head, cwd=worktree)
        _DATES.put((os.fspath(git.repo_dir), made), date)
        head = made
    if revert_globs:
        # HEAD's tree is the index now, which differs from the base in what the one diff
        # named less what was put back: the story's changes (`changed_paths`) without git.
        put_back = set(reverted)
        remember_diff(git, base_sha, head,
                      {p: letter for p, letter in changes.items() if p not in put_back})
    return head, reverted


class SessionFolderStaged(GitError):
    """The story's work would add the session folder (a symlink, a folder, a file)."""


def refuse_session_folder(git: Git, worktree: Path) -> None:
    """Raise SessionFolderStaged when the index of `worktree` (everything staged: what the
    story commit would hold) names the session folder at the top, in any form."""
    listed = git.run("ls-files", "--cached", "-z", "--", f":(literal){SESSION_FOLDER}",
                     cwd=worktree).stdout
    staged = [entry for entry in listed.split("\0") if entry]
    if staged:
        raise SessionFolderStaged(
            f"the story's work adds bmad-loop's session folder {SESSION_FOLDER} (its prompt "
            f"files, never committed): {staged[0]!r} is staged; refused")


# What a half-done merge, cherry-pick or revert leaves in a worktree's admin entry: a porcelain
# commit would take parents (and a message) from them.
_OPERATION_STATE = ("MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "CHERRY_PICK_HEAD", "REVERT_HEAD")


def clear_operation_state(git: Git, worktree: Path) -> tuple[str, str]:
    """Remove `_OPERATION_STATE` from `worktree`'s own admin entry; (HEAD, HEAD's tree)."""
    argv = ["rev-parse"]
    for name in _OPERATION_STATE:
        argv += ["--git-path", name]
    proc = git.run(*argv, "HEAD", "HEAD^{tree}", cwd=worktree, check=False)
    *paths, head, tree = proc.stdout.splitlines() or [""]
    if proc.returncode != 0 or len(paths) != len(_OPERATION_STATE) \
            or not (is_full_sha(head) and is_full_sha(tree)):
        raise GitError(f"{worktree} has no HEAD commit", returncode=proc.returncode,
                       stderr=proc.stderr)
    for rel in paths:
        path = worktree / rel  # `--git-path` answers relative to the worktree
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)  # planted as a folder: a person's `git commit` would fail
        elif os.path.lexists(path):
            os.unlink(path)
    return head, tree


def _cleaned(message: str) -> str:
    """`message` as ``git commit -m`` stores it (its ``whitespace`` clean-up): trailing spaces
    off each line, blank lines at both ends dropped and runs of them made one, one final
    newline."""
    out: list[str] = []
    for line in message.splitlines():
        line = line.rstrip()
        if line or (out and out[-1]):
            out.append(line)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


def _revert_lane_owned(git: Git, worktree: Path, base_sha: str,
                       revert_globs: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Put the lane-owned paths the story changed back to `base_sha` (everything is staged):
    (the reverted paths, the story's changes by path)."""
    # Once everything is staged, one diff of the index against the base names every path the
    # story changed, in its own commits or not (and says which the base lacks).
    changes = _index_changes(git, worktree, base_sha)
    reverted = sorted(p for p in changes if path_matches(revert_globs, p))
    restore = [p for p in reverted if changes[p] != "A"]
    added = [p for p in reverted if changes[p] == "A"]
    if restore:
        git.run(
            "checkout", "--quiet", base_sha, "--pathspec-from-file=-", "--pathspec-file-nul",
            input="\0".join(restore), cwd=worktree, env=_LITERAL,
        )
    if added:
        git.run("rm", "-q", "--cached", "--pathspec-from-file=-", "--pathspec-file-nul",
                input="\0".join(added), cwd=worktree, env=_LITERAL)
        for p in added:
            if os.path.lexists(worktree / p):
                os.unlink(worktree / p)
    return reverted, changes


# (repository, commit) -> "@<unix> <tz>" of commits `commit_worktree` made in this process:
# composing the story reads its date, and a worker and the lane often share a process. Sized
# for the stories that wait as ready for the lane: with fast agents and a long sprint that queue
# grows well past the workers, and a date forgotten before its story is composed costs a git
# process (`cat-file commit`) on the lane, the run's one serial path.
_DATES = CACHES.memo("git.trees.commit_dates", 1024,
                     holds="(repository, commit) -> the date of a commit commit_worktree made")


def _now() -> str:
    return f"@{int(time.time())} {time.strftime('%z')}"


def _commit_date(git: Git, commit: str) -> str:
    return _DATES.get((os.fspath(git.repo_dir), commit)) or git.commit_date(commit)


def _index_changes(git: Git, worktree: Path, base_sha: str) -> dict[str, str]:
    """{path: status letter} of the index of `worktree` against commit `base_sha` (renames as a
    deletion and an addition)."""
    raw = git.run("diff-index", "--cached", "-z", "--name-status", "--no-renames", base_sha,
                  "--", cwd=worktree).stdout
    fields = raw.split("\0")
    return {fields[i + 1]: fields[i][:1] for i in range(0, len(fields) - 1, 2) if fields[i + 1]}


def _not_ignored(git: Git, worktree: Path, paths: Sequence[str]) -> list[str]:
    """`paths` less those git ignores: `add -A` leaves an ignored path out anyway, and an
    exclude pathspec naming one makes `git add` fail ("paths are ignored")."""
    if not paths:
        return []
    proc = git.run("check-ignore", "-z", "--stdin", input="\0".join(paths), cwd=worktree,
                   check=False)
    if proc.returncode not in (0, 1):
        raise GitError(f"cannot tell which seeded paths {worktree} ignores",
                       returncode=proc.returncode, stderr=proc.stderr)
    ignored = {p for p in proc.stdout.split("\0") if p}
    return [p for p in paths if p not in ignored]


# -- composition --------------------------------------------------------------------------------


class JournalRecord(Protocol):
    """What a composition keeps of a run it did not make itself: how the journal records it."""

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Composition:
    """A candidate: `sha` None means a conflict, `tree` is then the tree with conflict markers."""

    sha: str | None
    tree: str | None
    conflicts: tuple[str, ...]
    strategy: str
    rebased: bool  # ff only: the story's commits were replayed onto a moved target
    settled: tuple[Settled, ...] = ()  # paths a merge rule settled (settle.py)
    regenerate: tuple[Regeneration, ...] = ()  # generators the lane runs in the candidate
    failure: str | None = None  # why a candidate with no conflict failed (a generator did)
    failure_output: str = ""  # the failing generator's output tail
    regenerated: tuple[JournalRecord, ...] = ()  # the generators' runs (engine/lane/regenerate.py), for the journal

    @property
    def ok(self) -> bool:
        return self.sha is not None


@dataclass(frozen=True)
class LaneEdit:
    """The lane's own change to a candidate: `tree_edit` (tree sha -> tree sha, e.g. the board
    update) and, for `ff`, the `message` of the commit that carries it."""

    tree_edit: Callable[[str], str]
    message: str = ""


@dataclass(frozen=True)
class Settling:
    """How a merge settles the paths its rules cover: the `rules`, and the story's own `base`
    (None: the merge base), and which `generators` run (settle.Generators)."""

    rules: MergeRules
    base: str | None = None
    generators: Generators = Generators.AS_RULED


def compose(
    git: Git,
    strategy: str,
    target_sha: str,
    branch_sha: str,
    message: str,
    *,
    edit: LaneEdit | None = None,
    settling: Settling | None = None,
) -> Composition:
    """Build the candidate for integrating `branch_sha` onto `target_sha`; touches no ref.

    `merge`: a merge commit (parents target, branch) of the merged tree; `squash`: one commit on
    target with that tree; `ff`: the branch itself when target is its ancestor, else the story's
    commits replayed onto target. `edit`'s tree edit is folded into the merge or squash commit;
    for `ff` it becomes one lane commit with `edit.message` on top (none when the edit changes
    nothing). `settling.rules` settle the paths they cover (git/trees/settle.py);
    `settling.base` is the story's own base (default: the merge base). Merges read attributes
    from the target's committed tree only (git/trees/merge.py, `committed_attributes`).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown merge strategy {strategy!r} (expected one of {STRATEGIES})")
    settling = settling or Settling(MergeRules())
    # A full SHA names itself; a missing one fails the commands below with git's own message.
    target = target_sha if is_full_sha(target_sha) else _commit(git, target_sha)
    branch = branch_sha if is_full_sha(branch_sha) else _commit(git, branch_sha)
    env = git.identity_env(_commit_date(git, branch))  # the branch commit must exist
    if strategy in ("merge", "squash"):
        return _merged(git, strategy, (target, branch), _lane_text(message), edit, settling, env)
    return _fast_forward(git, (target, branch), message, edit, settling.rules, env)


def _merged(git: Git, strategy: str, shas: tuple[str, str], message: str,
            edit: LaneEdit | None, settling: Settling, env: Mapping[str, str]) -> Composition:
    """`merge` or `squash` of `shas` (target, branch): the merged tree, settled by the rules,
    the lane's edit folded in, one commit."""
    target, branch = shas
    with committed_attributes(git, target) as at:
        tree, conflicts = merge_trees(git, target, branch, at)
    rules = settling.rules
    settled = None
    if rules:
        sides = Sides(settling.base or merge_base(git, target, branch), target, branch)
        settled = settle(git, rules, sides, tree, conflicts, generators=settling.generators)
    if settled is not None:
        tree, conflicts = settled.tree, settled.conflicts
    done = (settled.settled, settled.regenerate) if settled is not None else ((), ())
    if conflicts:
        return Composition(None, tree, conflicts, strategy, False, *done)
    parents = [target, branch] if strategy == "merge" else [target]
    if edit is not None:
        tree = edit.tree_edit(tree)
    return Composition(commit_tree(git, tree, parents, message, env), tree, (), strategy, False,
                       *done)


def _fast_forward(git: Git, shas: tuple[str, str], message: str, edit: LaneEdit | None,
                  rules: MergeRules, env: Mapping[str, str]) -> Composition:
    """`ff` of `shas` (target, branch): the branch itself, or its commits replayed onto the
    target, with the lane's edit as one commit on top."""
    target, branch = shas
    rebased = not git.is_ancestor(target, branch)
    done: tuple[tuple[Settled, ...], tuple[Regeneration, ...]] = ((), ())
    if rebased:
        replayed = replay_commits(git, target, merge_base(git, target, branch), branch, rules)
        tip, tree, conflicts = replayed.tip, replayed.tree, replayed.conflicts
        done = (replayed.settled, replayed.regenerate)
        if conflicts:
            return Composition(None, tree, conflicts, "ff", True, *done)
        assert tip is not None  # a replay without conflicts names its tip
    else:
        tip, tree = branch, tree_of(git, branch)
    if edit is not None:
        edited = edit.tree_edit(tree)
        if edited != tree:
            tip = commit_tree(git, edited, [tip], _lane_text(edit.message or message), env)
            tree = edited
    return Composition(tip, tree, (), "ff", rebased, *done)


def _commit(git: Git, rev: str) -> str:
    sha = git.rev(rev)
    if sha is None:
        raise GitError(f"no such commit {rev}")
    return sha


# -- advancing the target -----------------------------------------------------------------------


def cas_advance(git: Git, branch: str, new: str, old: str) -> bool:
    """Move ``refs/heads/<branch>`` from `old` to `new` atomically.

    True when it moved (or already was `new`: an advance is idempotent); False when it is no
    longer `old` (someone else moved it — never force it). Any other failure is a `GitError`.
    """
    ref = f"refs/heads/{branch.removeprefix('refs/heads/')}"
    new = new if is_full_sha(new) else _commit(git, new)
    old = old if is_full_sha(old) else _commit(git, old)
    with repo_lock(git):
        # update-ref checks `old` itself; the ref is read only when it refused.
        proc = git.run("update-ref", "-m", "bmad-loop: advance", ref, new, old, check=False)
        if proc.returncode == 0:
            return True
        current = git.rev(ref)
        if current == new:
            return True
        if current != old:
            return False
        raise GitError(
            f"cannot advance {ref} to {new}: {proc.stderr.strip()}",
            returncode=proc.returncode, stderr=proc.stderr,
        )


def overlapping_dirty(git: Git, checkout: Path, old: str, new: str) -> list[str]:
    """Local changes in `checkout` (at `old`) that advancing it to `new` would touch, sorted.

    Call it before the target moves. Counts modified, staged, deleted and untracked paths that the
    advance changes, or that sit inside or above one (a file where a folder must go, or the
    reverse), and also files on disk — even ignored ones, which ``read-tree -u`` would overwrite
    without a word — where the advance creates a file.
    """
    status = changed_status(git, old, new)  # one diff: what changes, and what is created
    touched = set(status)
    if not touched:
        return []
    above = {str(parent) for t in touched for parent in Path(t).parents if str(parent) != "."}
    hits: set[str] = set()
    # git looks only at the touched paths (and under them); a file where one of their folders
    # must go is looked for on disk instead: anything there but a folder is in the way.
    for d in dirty_paths(git, checkout, within=sorted(touched)):
        if d in touched or any(str(p) in touched for p in Path(d).parents):
            hits.add(d)
    for p in above - touched:
        try:
            if not stat.S_ISDIR(os.lstat(checkout / p).st_mode):
                hits.add(p)
        except (FileNotFoundError, NotADirectoryError):
            pass  # nothing there, or a file higher up (itself one of `above`)
    for t in sorted(p for p, letter in status.items() if letter == "A"):
        if t in hits:
            continue
        if os.path.lexists(checkout / t):
            hits.add(t)
            continue
        for parent in Path(t).parents:
            p = str(parent)
            if p == "." or p in touched:
                continue
            full = checkout / p
            if os.path.lexists(full) and not full.is_dir():
                hits.add(p)
    return sorted(hits)

