"""Admission: which pending stories get a worker slot now, and what holds the others back.

A pure function of the story rows, so it is easy to test and to reason about:

- at most `max_parallel` stories are in flight (queued or working);
- a slot goes to the earliest story in plan order that is *eligible*: every earlier story whose
  footprint conflicts with it is integrated or terminally failed/skipped, every dependency is
  integrated, every resource it names has free capacity, and its epic's gate is open;
- resources are held from dispatch until the story is integrated or terminal;
- a story that may stack (`can_stack`) is not held back by an earlier conflicting story or a
  dependency that is finished but not integrated (`ready`, `integrating`, `held`): it is
  dispatched on a stacked base and `Admission.stacked` names the stories it stacks on;
- a story whose file is not written yet (`to_create`) is dispatched for its create phase with
  only the slot and its epic's gate checked: creating touches nothing but its own story file.
  Until its create ends, its footprint is unknown, so no later story's dev may start (it is
  exclusive towards later devs only); then it comes back pending and is admitted like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from ..footprint import Footprint, footprints_conflict
from ..states import STORY_AWAITING_LANE, STORY_DONE, STORY_IN_FLIGHT, STORY_STACKABLE, StoryState

__all__ = ["StoryView", "Admission", "admit", "HOLDS_RESOURCES"]

# Resources are held from dispatch until the story is integrated or terminal.
HOLDS_RESOURCES = STORY_IN_FLIGHT | STORY_AWAITING_LANE | {StoryState.HELD}


@dataclass(frozen=True)
class StoryView:
    key: str
    seq: int
    epic: str  # the BMAD epic id ("1", "r", "3-5"); "" for a story in no epic
    state: str
    footprint: Footprint
    depends_on: tuple[str, ...] = ()
    approved: bool = True  # spec-approval gate
    to_create: bool = False  # its create phase has not ended: the footprint is not known yet
    # May start on a stacked base: blockers that are finished but not integrated do not hold
    # it back (stacking.py); the lane allows it only at max_parallel > 1, on a fresh branch.
    can_stack: bool = False


@dataclass
class Admission:
    dispatch: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # key -> what holds it back
    gate: str | None = None  # an epic whose gate must be passed before it can start
    approvals: list[str] = field(default_factory=list)  # stories waiting for `approve`
    stacked: dict[str, list[str]] = field(default_factory=dict)  # key -> the stories it stacks on


def admit(
    stories: Sequence[StoryView],
    *,
    max_parallel: int,
    capacity: Callable[[str], int],
    gates_mode: str,
    gates_passed: Sequence[str] = (),
    conflict: Callable[[Footprint, Footprint], str | None] = footprints_conflict,
) -> Admission:
    ordered = sorted(stories, key=lambda s: s.seq)
    by_key = {s.key: s for s in ordered}
    result = Admission()
    in_flight = sum(1 for s in ordered if s.state in STORY_IN_FLIGHT)
    used: dict[str, int] = {}
    for s in ordered:
        if s.state in HOLDS_RESOURCES and not s.to_create:  # a create step holds no resource
            for name in s.footprint.resources:
                used[name] = used.get(name, 0) + 1
    # Epic ids are strings; a run enqueued before they were may still hold numbers.
    gates_passed = {str(g) for g in gates_passed}
    first_epic = next((s.epic for s in ordered if s.epic), None)

    dispatched: set[str] = set()
    for index, story in enumerate(ordered):
        if story.state != StoryState.PENDING:
            continue
        # Stories dispatched earlier in this pass count as queued, so a second pass over the
        # same rows gives the same answer (and journals nothing new).
        earlier = [replace(s, state=StoryState.QUEUED) if s.key in dispatched else s for s in ordered[:index]]
        reason = _epic_barrier(story, earlier, gates_mode, gates_passed, first_epic)
        if reason == "gate":
            result.gate = story.epic
            result.waiting[story.key] = f"gate before epic {story.epic}"
            break  # nothing of a later epic may pass a closed gate either
        if reason:
            result.waiting[story.key] = reason
            continue
        if story.to_create:
            # Spec approval, dependencies and resources concern dev, which comes after.
            reason = f"all {max_parallel} worker slot(s) busy" if in_flight >= max_parallel else None
            if reason:
                result.waiting[story.key] = reason
            else:
                result.dispatch.append(story.key)
                dispatched.add(story.key)
                in_flight += 1
            continue
        under: list[str] = []
        reason = _conflict_with_earlier(story, earlier, conflict, under) or _dependencies(story, by_key, under)
        if reason is None and gates_mode == "per-story-spec-approval" and not story.approved:
            result.approvals.append(story.key)
            reason = "awaiting spec approval (bmad-loop approve)"
        if reason is None:
            reason = _resources(story, used, capacity)
        if reason is None and in_flight >= max_parallel:
            reason = f"all {max_parallel} worker slot(s) busy"
        if reason:
            result.waiting[story.key] = reason
            continue
        result.dispatch.append(story.key)
        if under:
            result.stacked[story.key] = under
        dispatched.add(story.key)
        in_flight += 1
        for name in story.footprint.resources:
            used[name] = used.get(name, 0) + 1
    return result


def _epic_barrier(story, earlier, gates_mode, gates_passed, first_epic) -> str | None:
    # A story in no epic (an extra key above every epic line) neither waits for nor holds an epic.
    if not story.epic:
        return None
    earlier_epics = [s for s in earlier if s.epic and s.epic != story.epic]
    if not earlier_epics:
        return None
    if gates_mode == "per-epic":
        open_stories = [s for s in earlier_epics if s.state not in (StoryState.INTEGRATED, StoryState.SKIPPED)]
        if open_stories:
            return f"epic {story.epic} waits for epic {open_stories[0].epic} ({open_stories[0].key})"
        if story.epic != first_epic and story.epic not in gates_passed:
            return "gate"
        return None
    # gates "none" (and spec approval): the next epic starts once the current one is dispatched.
    pending = [s for s in earlier_epics if s.state == StoryState.PENDING]
    if pending:
        return f"epic {story.epic} waits until epic {pending[0].epic} is dispatched ({pending[0].key})"
    return None


def _conflict_with_earlier(story, earlier, conflict, under: list[str]) -> str | None:
    """What holds `story` back; finished blockers it may stack on are added to `under`."""
    for other in earlier:
        if other.state in STORY_DONE:
            continue
        if other.to_create:
            return f"waits for {other.key} to be created (its footprint is not known yet)"
        why = conflict(story.footprint, other.footprint)
        if why and story.can_stack and other.state in STORY_STACKABLE:
            under.append(other.key)
        elif why:
            return f"conflicts with {other.key}: {why}"
    return None


def _dependencies(story, by_key: Mapping[str, StoryView], under: list[str]) -> str | None:
    # A dependency on a finished story is satisfied by stacking on it, like a conflict.
    for dep in story.depends_on:
        other = by_key.get(dep)
        if other is None or other.state in (StoryState.INTEGRATED, StoryState.SKIPPED):
            continue
        if story.can_stack and other.state in STORY_STACKABLE:
            if dep not in under:
                under.append(dep)
        else:
            return f"depends on {dep} ({other.state})"
    return None


def _resources(story, used, capacity) -> str | None:
    for name in story.footprint.resources:
        cap = capacity(name)
        if used.get(name, 0) >= cap:
            return f"resource {name} at capacity ({cap})"
    return None
