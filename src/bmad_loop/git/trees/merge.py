"""Merges and history in plumbing: three-way merges of trees, commits replayed onto another
tip, the attributes a merge reads, and a story's place in history.

No worktree, index or ref is touched: ``merge-tree --write-tree`` merges two commits,
``commit-tree`` makes commits. git 2.39 has no ``merge-tree --merge-base``, so replaying a
commit C with parent P is a cherry-pick through synthetic commits: a root B' (tree of P), X'
(tree of C, parent B') and T' (tree of the current tip, parent B'); ``merge-tree --write-tree T'
X'`` then merges with P's tree as the base. The synthetic commits are never referenced and are
collected by ``git gc``. Merge rules (settle.py) settle what they cover at each pick.

Merge attributes come from the target's committed tree, never from a checkout
(`committed_attributes`). ``git merge-tree`` reads ``.gitattributes`` from the working tree it
runs in: run from the main checkout, an uncommitted edit there (a new ``merge=union`` line, a
deleted ``binary``) would change how the same inputs compose. git 2.40 has ``--attr-source``;
2.38 and 2.39 do not, and ``merge-tree --write-tree`` reads no index. So the lane runs it in a
throw-away folder that holds the target tree's ``.gitattributes`` files and nothing else, with
``GIT_DIR`` naming the repository: git then sees exactly the committed attributes (plus the
repository's ``info/attributes`` and the user's ``core.attributesFile``, which are
configuration, as merge drivers in ``.git/config`` are).

A story's place in history: `current_base` is the story's base once its branch contains a newer
target: a person merged or rebased the target into it after an escalation, or bmad-loop merged
it in for a repair. From then on the lane-owned-ledger guard, drift and composition measure the
story's changes from there, so the target's own changes (the board marks of stories that landed
meanwhile) are never taken for the story's and reverted. `foreign_parents` is the lane's check
before it composes a story: walking the story's commits along first parents from its head down
to its base, every parent must be one of those commits or already in the base's history. A
merge of the target (which moved the base) passes; a commit that took a sibling story's tip as
a parent — through a ``MERGE_HEAD`` an agent wrote, or a merge it made itself — does not, since
the sibling's work is on no base of this story.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...caches import CACHES
from ...errors import GitError
from ..runner import Git
from .settle import MergeRules, Regeneration, Settled, Settlement, Sides, settle
from .edit import private_temp, read_objects, remember_commit

__all__ = ["Replayed", "commit_tree", "empty_tree", "merge_base", "merge_trees", "replay_commits",
           "tree_of", "AttributeRoot", "committed_attributes", "current_base", "foreign_parents"]


# -- merges -------------------------------------------------------------------------------------


def tree_of(git: Git, rev: str) -> str:
    return git.out("rev-parse", "--verify", "--end-of-options", f"{rev}^{{tree}}")


def commit_tree(git: Git, tree: str, parents: Iterable[str], message: str,
                env: Mapping[str, str]) -> str:
    argv = ["commit-tree", "--no-gpg-sign", tree]
    for p in parents:
        argv += ["-p", p]
    sha = git.out(*argv, input=message, env=env)
    remember_commit(git, sha, tree)
    return sha


def merge_trees(git: Git, ours: str, theirs: str,
                 at: AttributeRoot | None = None) -> tuple[str, tuple[str, ...]]:
    """``merge-tree --write-tree``: (tree, conflicted paths); no paths means a clean merge.
    `at`: where it runs, so that only the target's committed attributes apply."""
    proc = git.run("merge-tree", "--write-tree", "-z", "--name-only", ours, theirs, check=False,
                   cwd=at.cwd if at is not None else None, env=at.env if at is not None else None)
    fields = proc.stdout.split("\0")
    if proc.returncode == 0:
        return fields[0], ()
    if proc.returncode != 1 or not fields[0]:
        raise GitError(
            f"git merge-tree {ours} {theirs} failed (exit {proc.returncode}): "
            f"{proc.stderr.strip()}",
            returncode=proc.returncode, stderr=proc.stderr,
        )
    conflicts: list[str] = []
    i = 1
    while i < len(fields) and fields[i]:  # conflicted file info, up to an empty field
        conflicts.append(fields[i])
        i += 1
    i += 1
    while i < len(fields) and fields[i].isdigit():  # messages: count, paths, type, text
        count = int(fields[i])
        paths = fields[i + 1 : i + 1 + count]
        kind = fields[i + 1 + count] if i + 1 + count < len(fields) else ""
        if kind.startswith("CONFLICT"):
            conflicts.extend(paths)
        i += count + 3
    unique = tuple(dict.fromkeys(conflicts))
    return fields[0], unique or ("(unnamed conflict)",)


def merge_base(git: Git, target: str, branch: str) -> str:
    proc = git.run("merge-base", target, branch, check=False)
    if proc.returncode != 0:
        raise GitError(f"{branch} and {target} have no common history", returncode=proc.returncode,
                       stderr=proc.stderr)
    return proc.stdout.strip()


@dataclass(frozen=True)
class Replayed:
    """Commits replayed: the tip, its tree, the conflicts (tip then unusable), and what merge
    rules settled on the way."""

    tip: str | None  # None where a caller marks a conflicted replay unusable
    tree: str
    conflicts: tuple[str, ...]
    settled: tuple[Settled, ...] = ()
    regenerate: tuple[Regeneration, ...] = ()


def replay_commits(git: Git, onto: str, base: str, head: str,
                   rules: MergeRules = MergeRules()) -> Replayed:
    """The commits of `base..head` (no merges, oldest first) replayed onto `onto`, each keeping
    its author, dates and message (the same inputs give the same SHAs). A commit whose change is
    already there is dropped, as `git rebase` does; an empty commit stays empty. On a conflict,
    `tree` holds the conflicted tree. `rules` settle what they cover at each pick."""
    commits = git.out(
        "rev-list", "--reverse", "--topo-order", "--no-merges", f"{base}..{head}"
    ).split()
    tip, tip_tree = onto, tree_of(git, onto)
    settled: dict[str, Settled] = {}
    regenerate: dict[str, Regeneration] = {}
    for c in commits:
        info = git.commit_header(c)
        parent_tree = tree_of(git, info["parents"][0]) if info["parents"] else empty_tree(git)
        c_tree = info["tree"]
        if c_tree == parent_tree:  # an empty commit stays an empty commit
            new_tree = tip_tree
        elif parent_tree == tip_tree:
            new_tree = c_tree
        else:
            picked = pick(git, parent_tree, c_tree, tip_tree, info["committer"][2], rules)
            new_tree = picked.tree
            settled.update((s.path, s) for s in picked.settled)
            regenerate.update((r.glob, r) for r in picked.regenerate)
            if picked.conflicts:
                return Replayed(tip, new_tree, picked.conflicts, tuple(settled.values()),
                                tuple(regenerate.values()))
            if new_tree == tip_tree:  # already upstream: dropped, as git rebase does
                continue
        author_name, author_email, author_date = info["author"]
        env = git.identity_env()
        env.update(
            GIT_AUTHOR_NAME=author_name,
            GIT_AUTHOR_EMAIL=author_email,
            GIT_AUTHOR_DATE=author_date,
            GIT_COMMITTER_DATE=info["committer"][2],
        )
        tip = commit_tree(git, new_tree, [tip], info["message"], env)
        tip_tree = new_tree
    return Replayed(tip, tip_tree, (), tuple(settled.values()), tuple(regenerate.values()))


def pick(git: Git, base_tree: str, theirs_tree: str, ours_tree: str, date: str,
          rules: MergeRules) -> Settlement:
    """Three-way merge of trees with `base_tree` as the merge base (no --merge-base on 2.39),
    with the attributes of `ours_tree` (the tip the commit lands on), then `rules`."""
    env = git.identity_env(date)
    root = commit_tree(git, base_tree, [], "bmad-loop: pick base\n", env)
    theirs = commit_tree(git, theirs_tree, [root], "bmad-loop: pick theirs\n", env)
    ours = commit_tree(git, ours_tree, [root], "bmad-loop: pick ours\n", env)
    with committed_attributes(git, ours_tree) as at:
        tree, conflicts = merge_trees(git, ours, theirs, at)
    return settle(git, rules, Sides(base_tree, ours_tree, theirs_tree), tree, conflicts)


def empty_tree(git: Git) -> str:
    return git.out("mktree", input="")


# -- the attributes a merge reads ---------------------------------------------------------------

ATTRIBUTES = ".gitattributes"


class AttributeRoot:
    """Where a merge runs: `cwd` and the `env` that points git at the repository."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env


@contextmanager
def committed_attributes(git: Git, tree: str) -> Iterator[AttributeRoot]:
    """A folder holding `tree`'s `.gitattributes` files (commit or tree), removed afterwards."""
    listing = git.out("ls-tree", "-r", "-z", "--name-only", tree).split("\0")
    names = [p for p in listing if p == ATTRIBUTES or p.endswith("/" + ATTRIBUTES)]
    with private_temp(git, "attrs-") as root:  # never the shared /tmp, which boxes write
        folder = os.fspath(root)
        for name, obj in zip(names, read_objects(git, [f"{tree}:{n}" for n in names])):
            if obj is None or obj[1] != "blob":
                continue
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(obj[2])
        yield AttributeRoot(root, {"GIT_DIR": os.fspath(git.common_dir()), "GIT_WORK_TREE": folder})


# -- a story's place in history ----------------------------------------------------------------


def current_base(git: Git, base: str, head: str, target: str, cwd: Path | None = None) -> str:
    """`base`, or the merge base of `head` and `target` when that is newer than `base` (the
    branch took in more of the target than it started from). A merge base that is not a
    descendant of `base` (e.g. under a stacked base, which is on no target) leaves `base`."""
    proc = git.run("merge-base", head, target, cwd=cwd, check=False)
    found = proc.stdout.strip()
    if proc.returncode != 0 or not found or found == base:
        return base  # exit 1: no common history; a story keeps what it had
    return found if git.is_ancestor(base, found) else base


# (repository, base, head) -> `foreign_parents`: the lane asks again at each recomposition, and
# commits never change.
_CHECKED = CACHES.memo("git.trees.foreign_parents", 256,
                       holds="(repository, base, head) -> a story's commits whose parents are not its own")


def foreign_parents(git: Git, base: str, head: str) -> list[tuple[str, str]]:
    """(commit, parent) for each parent of the story's commits (`base..head` along first
    parents) that is neither one of them nor in `base`'s history; [] when all are."""
    key = (os.fspath(git.repo_dir), base, head)
    known = _CHECKED.get(key)
    if known is None:
        known = _foreign_parents(git, base, head)
        _CHECKED.put(key, known)
    return list(known)


def _foreign_parents(git: Git, base: str, head: str) -> tuple[tuple[str, str], ...]:
    out = git.out("rev-list", "--first-parent", "--parents", f"{base}..{head}")
    rows = [line.split() for line in out.splitlines() if line.strip()]
    own = {row[0] for row in rows}
    bad: list[tuple[str, str]] = []
    for commit, *parents in rows:
        for parent in parents:
            if parent in own or parent == base:
                continue
            if not git.is_ancestor(parent, base):
                bad.append((commit, parent))
    return tuple(bad)
