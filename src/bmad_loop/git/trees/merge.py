"""Three-way merges of trees in plumbing, and commits replayed onto another tip.

No worktree, index or ref is touched: ``merge-tree --write-tree`` merges two commits (reading
attributes only from the target's committed tree, mergeattrs.py), ``commit-tree`` makes
commits. git 2.39 has no ``merge-tree --merge-base``, so replaying a commit C with parent P is a
cherry-pick through synthetic commits: a root B' (tree of P), X' (tree of C, parent B') and T'
(tree of the current tip, parent B'); ``merge-tree --write-tree T' X'`` then merges with P's
tree as the base. The synthetic commits are never referenced and are collected by ``git gc``.
Merge rules (mergesettle.py) settle what they cover at each pick.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ...errors import GitError
from ..runner import Git
from .mergeattrs import AttributeRoot, committed_attributes
from .settle import MergeRules, Regeneration, Settled, Sides, settle
from .edit import remember_commit

__all__ = ["Replayed", "commit_tree", "empty_tree", "merge_base", "merge_trees", "replay_commits",
           "tree_of"]


def tree_of(git: Git, rev: str) -> str:
    return git.out("rev-parse", "--verify", "--end-of-options", f"{rev}^{{tree}}")


def commit_tree(git: Git, tree: str, parents: Iterable[str], message: str, env: dict) -> str:
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
    proc = git.run(
        "merge-tree", "--write-tree", "-z", "--name-only", ours, theirs, check=False,
        **({"cwd": at.cwd, "env": at.env} if at is not None else {}),
    )
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
          rules: MergeRules):
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
