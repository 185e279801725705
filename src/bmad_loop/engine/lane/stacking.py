"""Stacked starts: the composition of finished, not yet integrated work.

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
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from ...git.trees.merge import Replayed, replay_commits
from ...git.trees.settle import MergeRules
from ...states import STORY_STACKABLE, StoryState

__all__ = ["Layer", "Replayed", "replay", "stack", "layers_under", "stacked_bases", "stale_layer", "LAYER_OK"]

# A layer is still good while its story is in one of these states with the recorded head.
LAYER_OK = STORY_STACKABLE | {StoryState.INTEGRATED}


@dataclass(frozen=True)
class Layer:
    """One story's own commits: `base..head`."""

    key: str
    base: str
    head: str


def replay(git, onto: str, base: str, head: str, rules: MergeRules = MergeRules()) -> Replayed:
    """The commits of `base..head` replayed onto `onto` (`compose.replay_commits`: the replay
    the lane's `ff` composition uses too), merge `rules` settling what they cover. On a
    conflict, `tip` is None and `tree` holds the conflicted tree."""
    replayed = replay_commits(git, onto, base, head, rules)
    return replace(replayed, tip=None) if replayed.conflicts else replayed


def stack(git, onto: str, layers: Iterable[Layer], rules: MergeRules = MergeRules()) -> Replayed:
    """`onto` with each layer's own commits replayed on top, in the order given. Only `union`
    rules apply: a stacked start runs no generator (a regenerated path stays a conflict)."""
    rules = rules.unions_only()
    result = Replayed(onto, "", ())
    for layer in layers:
        result = replay(git, result.tip, layer.base, layer.head, rules)
        if result.tip is None:
            return Replayed(None, result.tree, tuple(f"{layer.key}: {p}" for p in result.conflicts))
    return result


def layers_under(blockers: Sequence[str], rows: Mapping[str, object]) -> list[Layer]:
    """The layers a story stacked on `blockers` needs, in plan order: each blocker that is not
    yet integrated, and (transitively) what that blocker was itself stacked on, since its own
    commits were written on top of those."""
    wanted: dict[str, object] = {}
    todo = list(blockers)
    while todo:
        key = todo.pop()
        row = rows.get(key)
        if row is None or key in wanted or row.state == StoryState.INTEGRATED:
            continue
        wanted[key] = row
        todo.extend(layer["key"] for layer in row.stacked_on or ())
    ordered = sorted(wanted.values(), key=lambda row: row.seq)
    return [Layer(row.key, row.base_sha, row.head_sha) for row in ordered]


def stacked_bases(git, target_sha: str, decision, rows: Mapping[str, object],
                  rules: MergeRules = MergeRules()) -> dict:
    """key -> (stacked base SHA, stacked_on entries) for each story admission put on a stacked
    base (`decision.stacked`); a story whose base does not compose cleanly is taken out of
    `decision.dispatch` and waits as it would without stacking."""
    bases = {}
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


def stale_layer(story, rows: Mapping[str, object]) -> str | None:
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
