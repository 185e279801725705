"""Stacked starts: the composition of finished, not yet integrated work, and restacking when
that work does not land.

A story whose only blockers are earlier stories that are finished but not integrated (`ready`,
`integrating`, `held`) may start on a *stacked base*: the target with those stories' own commits
(`base_sha..head_sha` of each, in plan order) replayed on top. It records the base in `base_sha`
and the stories under it in `stacked_on` (`{"key", "head"}` each). Its integration replays its
own commits (`base_sha..head_sha`) onto the real target first, then composes as usual, so what
lands is exactly its own change and the target's trees are those of the sequential loop.

The same layering (`stack`) is what a stack of speculative candidates needs: C(k) = C(k-1)
with story k's own commits on top.

Replay is pure plumbing (no worktree, index or ref): commit C with parent P is picked onto the
tip by a three-way merge with P's tree as the base, through throw-away commits, because git
2.39 has no `merge-tree --merge-base`. Replayed commits keep author, dates and message, so the
same inputs always give the same SHAs (a lane that crashed recomputes the same base).

**Restacking.** A stacked story built on work that had not integrated yet. When a story under
it fails to integrate (escalates, is blocked or sent back) or is redone with another head, that
base is not what the target will be. The lane then:

1. keeps the stacked story's work under `refs/bmad-loop/<run>/restacked/<key>/<n>` (nothing is
   dropped; an existing ref at the same head is reused, so a crash here repeats nothing);
2. removes its worktree and branch;
3. sends it back to `pending` with a fresh start (fresh attempt budget, no stacked base),
   journaled `story.restacked`.

A fresh start rather than a replay of its commits: they were written against work that did not
land, so only an agent can tell what they should become. The kept ref is named in the story's
feedback, so the next prompt can point at it.

A story still `queued` just goes back to `pending` (nothing started; a worktree and branch a
worker made before it died are removed too); a `working` one is left to finish its story and is
restacked once it is `ready` (or escalated).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, Sequence, cast
from pathlib import Path

from ...git.trees.merge import Replayed, replay_commits
from ...git.trees.settle import MergeRules
from ...states import STORY_STACKABLE, StoryState
from ...git.worktrees import delete_branch, remove_worktree
from ..journal import EventKind, record
from ..transitions import transition_story
from ...db.database import Database
from ...git.runner import Git
from ..runpaths import Layout
from ..runrows import StoryRow
from ...policy import ScmPolicy
from .admission import Admission

__all__ = ["Layer", "Replayed", "replay", "stack", "layers_under", "stacked_bases", "stale_layer",
           "LAYER_OK", "restack_stale", "restacked_ref_prefix", "own_paths"]


# A layer is still good while its story is in one of these states with the recorded head.
LAYER_OK = STORY_STACKABLE | {StoryState.INTEGRATED}


# key -> (the stacked base's SHA, its `stacked_on` entries): (None, None) for no layer.
StackedBase = tuple[str | None, list[dict[str, str]] | None]
# A story's own worktree and branch by its key (`own_paths`).
MadeAt = Callable[[str], tuple[Path, str]]


@dataclass(frozen=True)
class Layer:
    """One story's own commits: `base..head`."""

    key: str
    base: str
    head: str


def replay(git: Git, onto: str, base: str, head: str, rules: MergeRules = MergeRules()) -> Replayed:
    """The commits of `base..head` replayed onto `onto` (`compose.replay_commits`: the replay
    the lane's `ff` composition uses too), merge `rules` settling what they cover. On a
    conflict, `tip` is None and `tree` holds the conflicted tree."""
    replayed = replay_commits(git, onto, base, head, rules)
    return replace(replayed, tip=None) if replayed.conflicts else replayed


def stack(git: Git, onto: str, layers: Iterable[Layer],
          rules: MergeRules = MergeRules()) -> Replayed:
    """`onto` with each layer's own commits replayed on top, in the order given. Only `union`
    rules apply: a stacked start runs no generator (a regenerated path stays a conflict)."""
    rules = rules.unions_only()
    result, tip = Replayed(onto, "", ()), onto
    for layer in layers:
        result = replay(git, tip, layer.base, layer.head, rules)
        if result.tip is None:
            return Replayed(None, result.tree, tuple(f"{layer.key}: {p}" for p in result.conflicts))
        tip = result.tip
    return result


def layers_under(blockers: Sequence[str], rows: Mapping[str, StoryRow]) -> list[Layer]:
    """The layers a story stacked on `blockers` needs, in plan order: each blocker that is not
    yet integrated, and (transitively) what that blocker was itself stacked on, since its own
    commits were written on top of those."""
    wanted: dict[str, StoryRow] = {}
    todo = list(blockers)
    while todo:
        key = todo.pop()
        row = rows.get(key)
        if row is None or key in wanted or row.state == StoryState.INTEGRATED:
            continue
        wanted[key] = row
        todo.extend(layer["key"] for layer in row.stacked_on or ())
    ordered = sorted(wanted.values(), key=lambda row: row.seq)
    # A finished story (what a story stacks on) has its base and its head.
    return [Layer(row.key, cast(str, row.base_sha), cast(str, row.head_sha)) for row in ordered]


def stacked_bases(git: Git, target_sha: str, decision: Admission, rows: Mapping[str, StoryRow],
                  rules: MergeRules = MergeRules()) -> dict[str, StackedBase]:
    """key -> (stacked base SHA, stacked_on entries) for each story admission put on a stacked
    base (`decision.stacked`); a story whose base does not compose cleanly is taken out of
    `decision.dispatch` and waits as it would without stacking."""
    bases: dict[str, StackedBase] = {}
    for key in decision.stacked:
        layers = layers_under(decision.stacked[key], rows)
        built = stack(git, target_sha, layers, rules)
        if built.tip is None:  # it waits for their integration instead, as without stacking
            decision.dispatch.remove(key)
            decision.waiting[key] = (f"stacking on {', '.join(x.key for x in layers)} conflicts "
                                     f"({', '.join(built.conflicts)}): waits for their integration")
            continue
        bases[key] = ((built.tip, [{"key": x.key, "head": x.head} for x in layers]) if layers
                      else (None, None))
    return bases


def stale_layer(story: StoryRow, rows: Mapping[str, StoryRow]) -> str | None:
    """Why `story`'s stacked base no longer stands (a story under it failed to integrate, was
    sent back or redone), or None while every layer is ready, on its way, or integrated with
    the head the base was built from."""
    for layer in story.stacked_on or ():
        row = rows.get(layer["key"])
        if row is None:
            return f"{layer['key']} is no longer in the run"
        if row.state not in LAYER_OK:
            return f"{row.key} is {row.state}" + (f": {row.reason}" if row.reason else "")
        if row.head_sha != layer["head"]:
            return f"{row.key} was redone ({(row.head_sha or 'no head')[:12]}, not {layer['head'][:12]})"
    return None


# The states a stale stacked story is restacked from (a working one finishes first).
_RESTACKABLE = (StoryState.PENDING, StoryState.QUEUED, StoryState.READY, StoryState.ESCALATED)


def restacked_ref_prefix(run_id: str, key: str) -> str:
    return f"refs/bmad-loop/{run_id}/restacked/{key}/"


def own_paths(layout: Layout, scm: ScmPolicy) -> MadeAt | None:
    """`made_at` for `restack_stale`: a story's own worktree and branch, by its key (None when
    the run shares one branch, which is never a story's to remove)."""
    if scm.branch_per != "story":
        return None
    return lambda key: (layout.story_worktree(key, "story"), layout.story_branch(key, "story"))


def restack_stale(db: Database, git: Git, run_id: str, stories: Sequence[StoryRow],
                  made_at: MadeAt | None = None) -> bool:
    """Restack every stacked story whose base no longer stands; True when one was.
    `made_at(key)`: (worktree, branch) a story's prepare makes, for one the row does not name
    yet (a worker died between making them and writing the row)."""
    rows = {s.key: s for s in stories}
    changed = False
    for story in stories:
        if not story.stacked_on or story.state not in _RESTACKABLE:
            continue
        why = stale_layer(story, rows)
        if why is not None:
            changed |= _restack(db, git, run_id, story, why, made_at)
    return changed


def _restack(db: Database, git: Git, run_id: str, story: StoryRow, why: str,
             made_at: MadeAt | None = None) -> bool:
    kept = None
    worktree, branch = story.worktree, story.branch
    made = made_at(story.key) if not branch and made_at is not None else None
    if made is not None and git.rev(f"refs/heads/{made[1]}"):
        worktree, branch = str(made[0]), made[1]  # else never prepared: nothing to remove
    if branch or worktree:
        head = story.head_sha or (git.rev(f"refs/heads/{branch}") if branch else None)
        if head and head != story.base_sha:
            kept = _keep(git, run_id, story.key, head)
        if worktree:
            remove_worktree(git, Path(worktree))
        if branch:
            delete_branch(git, branch)
    under = [layer["key"] for layer in story.stacked_on or ()]  # (a stacked story's)
    feedback: dict[str, str] = {}
    if kept:
        feedback["verify_output"] = (f"An earlier try of this story was built on {', '.join(under)}, "
                                     f"which did not integrate ({why}); it is kept at {kept}. "
                                     "This try starts from the target as it is now.")
    with db.transaction() as s:
        if not transition_story(s, story.id, story.state, state=StoryState.PENDING, phase=None,
                                worktree=None, branch=None, base_sha=None, head_sha=None,
                                stacked_on=None, dev_attempts=0, review_cycles=0,
                                feedback=feedback, after_phase=None, human_fix=False,
                                port_block=None, wait_reason=None, reason=None, ended_at=None,
                                ready_at=None):
            return False  # it moved on meanwhile (a worker claimed it): next pass
        record(s, run_id, EventKind.STORY_RESTACKED, story.key, was=story.state, stacked_on=under,
               reason=why, kept=kept)
    return True


def _keep(git: Git, run_id: str, key: str, head: str) -> str:
    prefix = restacked_ref_prefix(run_id, key)
    listed = git.out("for-each-ref", "--format=%(objectname) %(refname)", prefix).splitlines()
    for line in listed:
        sha, _, ref = line.partition(" ")
        if sha == head:
            return ref
    ref = f"{prefix}{len(listed) + 1}"
    git.run("update-ref", ref, head, "0" * 40)
    return ref
