"""A story's place in history: where its work starts from, and whether its commits are its own.

`current_base` is the story's base once its branch contains a newer target: a person merged or
rebased the target into it after an escalation, or bmad-loop merged it in for a repair. From
then on the lane-owned-ledger guard, drift and composition measure the story's changes from
there, so the target's own changes (the board marks of stories that landed meanwhile) are never
taken for the story's and reverted.

`foreign_parents` is the lane's check before it composes a story: walking the story's commits
along first parents from its head down to its base, every parent must be one of those commits
or already in the base's history. A merge of the target (which moved the base) passes; a commit
that took a sibling story's tip as a parent — through a ``MERGE_HEAD`` an agent wrote, or a
merge it made itself — does not, since the sibling's work is on no base of this story.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...caches import CACHES
from ..runner import Git

__all__ = ["current_base", "foreign_parents"]


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
    bad = []
    for commit, *parents in rows:
        for parent in parents:
            if parent in own or parent == base:
                continue
            if not git.is_ancestor(parent, base):
                bad.append((commit, parent))
    return tuple(bad)
