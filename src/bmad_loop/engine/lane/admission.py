"""Admission: which pending stories get a worker slot now, and what holds the others back.

A pure function of the story rows, so it is easy to test and to reason about:

- at most `max_parallel` stories are in flight (queued or working);
- a slot goes to the earliest story in plan order that is *eligible*: every earlier story whose
  footprint conflicts with it is integrated or terminally failed/skipped, every dependency is
  integrated, every resource it names has free capacity, and its epic's gate is open;
- resources are held from dispatch until the story is integrated or terminal;
- a story whose file is not written yet (`to_create`) is dispatched for its create phase with
  only the slot and its epic's gate checked: creating touches nothing but its own story file.
  Until its create ends, its footprint is unknown, so no later story's dev may start (it is
  exclusive towards later devs only); then it comes back pending and is admitted like any other;
- stacked starts (`can_stack`, at `max_parallel > 1`): a blocker (conflict or dependency) that
  is finished but not yet integrated (`STORY_STACKABLE`) does not hold a story back; the story
  starts on a base with that blocker's work in it (`Admission.stacked`, stacking.py).

Cost: the lane admits on every pass, so a pass is one walk in plan order with a few look-ups
per story; which pairs conflict comes from the run's `ConflictIndex`, which runs the footprint
test once per pair that can meet, not once per pass.

**The conflict index.** Admission asks, for every pending story on every pass, "which earlier,
unfinished story conflicts with it?". Asking the footprint test for every pair on every pass is
O(K²) glob work per pass. The index tests each pair once per run, and again only when it could
have changed:

- a story's footprint changed (its create phase wrote the story file): its pairs are re-tested,
  one test per other story;
- the target tree's directories changed (a literal path covers what is under it only when it
  names a directory there, see `globs`): knowing directories only ever *narrows* overlap, so the
  relation tested without them (`directories=None`, "wide") holds every pair that can conflict
  under any tree, and only those pairs are re-tested against the new directories.

Which pairs are tested at all: two patterns anchored at the root whose literal leading segments
differ somewhere (`work/1.txt` and `work/2.txt`, `src/a/*.py` and `src/b/**`) can never match a
common path, under any tree, so stories are only tested against those whose patterns share a
literal path prefix (one prefix above the other), and against every story with a pattern that
matches at any depth (`CHANGELOG.md`, `**/x`, `*.py`). With many stories on distinct files,
building the relation costs a few look-ups per story, not a test per pair.

Exclusive footprints (missing, empty, invalid) conflict with everything by definition
(`Footprint.exclusive`), so they are not stored as pairs: admission treats them, and stories
still to be created, as walls for every later story.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Sequence, Iterable

from ...bmad.footprint import Footprint, footprints_conflict
from ...db.models import Story
from ...git.trees.settle import MergeRules
from ..runrows import LaneRow
from ...globs import is_literal
from ...states import (
    STORY_AWAITING_LANE,
    STORY_DONE,
    STORY_IN_FLIGHT,
    STORY_STACKABLE,
    Phase,
    StoryState,
)

__all__ = ["StoryView", "Admission", "Rules", "admit", "views_of", "HOLDS_RESOURCES",
           "ConflictIndex"]


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
    # Sent back to its agent for a repair: it keeps the resources it held since its dispatch
    # (a later story must not take them while it waits in line for a slot).
    repairing: bool = False


@dataclass
class Admission:
    dispatch: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # key -> what holds it back
    gate: str | None = None  # an epic whose gate must be passed before it can start
    approvals: list[str] = field(default_factory=list)  # stories waiting for `approve`
    stacked: dict[str, list[str]] = field(default_factory=dict)  # key -> the stories it stacks on


@dataclass(frozen=True)
class Rules:
    """What admission decides by, besides the stories (the keyword arguments of `admit`)."""

    max_parallel: int
    capacity: Callable[[str], int]
    gates_mode: str
    gates_passed: Sequence[str] = ()
    conflict: Callable[[Footprint, Footprint], str | None] = footprints_conflict
    index: ConflictIndex | None = None
    directories: Callable[[], frozenset[str] | None] = lambda: None


def admit(stories: Sequence[StoryView], **rules: Any) -> Admission:
    """`rules` are the fields of `Rules`. `index` is the run's conflict relation, kept across
    calls (see `ConflictIndex`); it is brought up to date with `stories` and the target tree's
    `directories()` first (listed only when some pair depends on them), so the answer is the
    same as with a fresh one. Without it a fresh one is made from `conflict`.

    One pass walks the stories once in plan order, carrying what the earlier ones say (the
    earliest unfinished story, the earliest unfinished wall, each epic's earliest open story),
    so a pass costs a few look-ups per story and no footprint test."""
    return _Pass(stories, Rules(**rules)).walk()


class _Pass:
    """One admission pass over the stories, in plan order, and what it has decided so far."""

    def __init__(self, stories: Sequence[StoryView], rules: Rules):
        self.rules = rules
        self.ordered = sorted(stories, key=lambda s: s.seq)
        self.index = rules.index if rules.index is not None else ConflictIndex.of(rules.conflict)
        self.index.update(self.ordered, rules.directories)
        self.by_key = {s.key: s for s in self.ordered}
        self.result = Admission()
        self.in_flight = sum(1 for s in self.ordered if s.state in STORY_IN_FLIGHT)
        self.used: dict[str, int] = {}
        for s in self.ordered:
            if (s.state in HOLDS_RESOURCES or s.repairing) and not s.to_create:  # a create step holds none
                self._hold_resources(s)
        # Epic ids are strings; a run enqueued before they were may still hold numbers.
        self.gates_passed = {str(g) for g in rules.gates_passed}
        self.first_epic = next((s.epic for s in self.ordered if s.epic), None)
        self.earlier = _Earlier(rules.gates_mode)

    def walk(self) -> Admission:
        result = self.result
        for story in self.ordered:
            dispatched = False
            if story.state == StoryState.PENDING:
                under: list[str] = []
                reason = self.decide(story, under)
                if reason == "gate":
                    result.gate = story.epic
                    result.waiting[story.key] = f"gate before epic {story.epic}"
                    break  # nothing of a later epic may pass a closed gate either
                if reason:
                    result.waiting[story.key] = reason
                else:
                    self._dispatch(story, under)
                    dispatched = True
            # Stories dispatched earlier in this pass count as queued, so a second pass over the
            # same rows gives the same answer (and journals nothing new).
            self.earlier.add(story, StoryState.QUEUED if dispatched else story.state)
        return result

    def decide(self, story: StoryView, under: list[str]) -> str | None:
        """What holds a pending story back (None: it gets a slot; "gate": a closed epic gate).
        Finished blockers it may stack on are added to `under`."""
        max_parallel = self.rules.max_parallel
        reason = self.earlier.epic_barrier(story, self.gates_passed, self.first_epic)
        if reason:
            return reason
        if story.to_create:
            # Spec approval, dependencies and resources concern dev, which comes after.
            return f"all {max_parallel} worker slot(s) busy" if self.in_flight >= max_parallel else None
        reason = (self.earlier.conflict(story, self.index, under)
                  or _dependencies(story, self.by_key, under))
        if (reason is None and self.rules.gates_mode == "per-story-spec-approval"
                and not story.approved):
            self.result.approvals.append(story.key)
            reason = "awaiting spec approval (bmad-loop approve)"
        if reason is None and not story.repairing:  # it holds its own already
            reason = _resources(story, self.used, self.rules.capacity)
        if reason is None and self.in_flight >= max_parallel:
            reason = f"all {max_parallel} worker slot(s) busy"
        return reason

    def _dispatch(self, story: StoryView, under: list[str]) -> None:
        self.result.dispatch.append(story.key)
        if under:
            self.result.stacked[story.key] = under
        self.in_flight += 1
        if not story.to_create and not story.repairing:
            self._hold_resources(story)

    def _hold_resources(self, story: StoryView) -> None:
        for name in story.footprint.resources:
            self.used[name] = self.used.get(name, 0) + 1


class _Earlier:
    """What the stories already walked (earlier in plan order) say, kept as the walk goes."""

    def __init__(self, gates_mode: str):
        self.per_epic = gates_mode == "per-epic"
        self.seen: dict[str, tuple[StoryView, str]] = {}  # key -> (story, state in this pass)
        self.first_open: StoryView | None = None  # earliest story not done
        self.first_wall: StoryView | None = None  # earliest not-done exclusive or to-create story
        # Every not-done story, and every not-done wall, in plan order: only a story that may
        # stack looks past its first blocker.
        self.open: list[StoryView] = []
        self.walls: list[StoryView] = []
        self.epics: set[str] = set()
        # Each epic's earliest story that holds later epics back (per-epic: not integrated or
        # skipped; otherwise: still pending), in plan order.
        self.holders: list[StoryView] = []
        self._holding: set[str] = set()

    def add(self, story: StoryView, state: str) -> None:
        self.seen[story.key] = (story, state)
        if state not in STORY_DONE:
            if self.first_open is None:
                self.first_open = story
            if self.first_wall is None and (story.to_create or story.footprint.exclusive):
                self.first_wall = story
            self.open.append(story)
            if story.to_create or story.footprint.exclusive:
                self.walls.append(story)
        if story.epic:
            self.epics.add(story.epic)
            holds = (state not in (StoryState.INTEGRATED, StoryState.SKIPPED) if self.per_epic
                     else state == StoryState.PENDING)
            if holds and story.epic not in self._holding:
                self._holding.add(story.epic)
                self.holders.append(story)

    def epic_barrier(self, story: StoryView, gates_passed: Collection[str],
                     first_epic: str | None) -> str | None:
        # A story in no epic (an extra key above every epic line) neither waits for nor holds an epic.
        if not story.epic or self.epics <= {story.epic}:
            return None
        holder = next((s for s in self.holders if s.epic != story.epic), None)
        if self.per_epic:
            if holder is not None:
                return f"epic {story.epic} waits for epic {holder.epic} ({holder.key})"
            if story.epic != first_epic and story.epic not in gates_passed:
                return "gate"
            return None
        # gates "none" (and spec approval): the next epic starts once the current one is dispatched.
        if holder is not None:
            return f"epic {story.epic} waits until epic {holder.epic} is dispatched ({holder.key})"
        return None

    def conflict(self, story: StoryView, index: ConflictIndex, under: list[str]) -> str | None:
        """The earliest unfinished earlier story that conflicts with `story`, and why: an
        exclusive story conflicts with every story, every story with an exclusive one or one
        still to be created (a wall); other pairs come from the index. A story that may stack
        passes the finished ones (added to `under`) and is held only by the others."""
        if story.can_stack:
            return self._conflict_stacking(story, index, under)
        blocker = self.first_open if story.footprint.exclusive else self.first_wall
        for key in index.earlier_conflicts(story.key):
            other, state = self.seen[key]
            if blocker is not None and other.seq >= blocker.seq:
                break  # the wall comes first
            if state not in STORY_DONE:
                blocker = other
                break
        if blocker is None:
            return None
        return self._held_by(story, blocker, index)

    def _conflict_stacking(self, story: StoryView, index: ConflictIndex, under: list[str]) -> str | None:
        if story.footprint.exclusive:
            blockers = self.open
        else:
            found = {s.key: s for s in self.walls}
            for key in index.earlier_conflicts(story.key):
                other, state = self.seen[key]
                if state not in STORY_DONE:
                    found[key] = other
            blockers = sorted(found.values(), key=lambda s: s.seq)
        for other in blockers:
            if not other.to_create and self.seen[other.key][1] in STORY_STACKABLE:
                under.append(other.key)
                continue
            return self._held_by(story, other, index)
        return None

    @staticmethod
    def _held_by(story: StoryView, blocker: StoryView, index: ConflictIndex) -> str:
        if blocker.to_create:
            return f"waits for {blocker.key} to be created (its footprint is not known yet)"
        return f"conflicts with {blocker.key}: {index.reason(story.key, blocker.key)}"


def _dependencies(story: StoryView, by_key: Mapping[str, StoryView], under: list[str]) -> str | None:
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


def _resources(story: StoryView, used: Mapping[str, int],
               capacity: Callable[[str], int]) -> str | None:
    for name in story.footprint.resources:
        cap = capacity(name)
        if used.get(name, 0) >= cap:
            return f"resource {name} at capacity ({cap})"
    return None


def views_of(rows: Iterable[Story | LaneRow], stacking: bool = False,
             settled: MergeRules | None = None) -> list[StoryView]:
    """The admission's view of story rows (`Story` objects or the lane's read-only rows).
    `stacking`: a story may start on a stacked base when it has no branch yet and no human fix.
    `settled`: the run's merge rules (git.trees.settle.MergeRules): the paths they cover never make
    two stories conflict."""
    return [StoryView(key=s.key, seq=s.seq, epic=s.epic, state=s.state,
                      footprint=_footprint_of(s, settled),
                      depends_on=tuple(s.depends_on or ()), approved=s.approved,
                      to_create=s.to_create,
                      can_stack=stacking and not s.branch and not s.human_fix,
                      repairing=s.state == StoryState.PENDING
                      and getattr(s, "phase", None) == Phase.REPAIR) for s in rows]


def _footprint_of(row: Story | LaneRow, settled: MergeRules | None = None) -> Footprint:
    fp = row.footprint or {}
    files, shared = tuple(fp.get("files", ())), tuple(fp.get("shared", ()))
    if settled:
        # A path the lane settles (a ledger, a lockfile) is shared, whoever declares it:
        # `shared` against `shared` never conflicts. Only literal paths: a glob may cover more.
        moved = tuple(f for f in files if is_literal(f) and settled.covers(f))
        files, shared = tuple(f for f in files if f not in moved), shared + moved
    return Footprint(files=files, shared=shared, resources=tuple(fp.get("resources", ())),
                     reason=row.footprint_reason)


Directories = frozenset[str] | None
Test = Callable[[Footprint, Footprint, Directories], str | None]


class ConflictIndex:
    """Pairs of non-exclusive stories whose footprints conflict, with the reason the test gave.

    `test(a, b, directories)` is the footprint test (`footprints_conflict`); it is asked for
    the later story's footprint against the earlier one's, as admission words its reasons.
    """

    def __init__(self, test: Test = footprints_conflict):
        self._test = test
        self._footprint: dict[str, Footprint] = {}
        self._seq: dict[str, int] = {}
        self._wide: dict[str, set[str]] = {}  # key -> keys that conflict under some tree
        self._pairs: dict[str, dict[str, str]] = {}  # key -> {key: reason} under `_directories`
        self._earlier: dict[str, tuple[str, ...]] = {}  # key -> earlier `_pairs` keys, plan order
        self._directories: Directories = None
        self._prefixes: dict[str, set[tuple[str, ...]]] = {}  # key -> its patterns' prefixes
        self._at: dict[tuple[str, ...], set[str]] = {}  # prefix -> keys with that prefix
        self._under: dict[tuple[str, ...], set[str]] = {}  # prefix -> keys with one below it
        self.tests = 0  # footprint tests run so far (what this index saves)

    @classmethod
    def of(cls, conflict: Callable[[Footprint, Footprint], str | None]) -> ConflictIndex:
        """An index over a two-argument test that knows its own tree (or none)."""
        return cls(lambda a, b, _directories: conflict(a, b))

    def update(self, stories: Iterable, directories: Callable[[], Directories] = lambda: None) -> None:
        """Bring the relation up to date with `stories` (objects with `key`, `seq`,
        `footprint`) and the tree `directories()` lists; it is called only when some pair
        depends on it."""
        changed = [s for s in stories
                   if self._footprint.get(s.key) != s.footprint or self._seq.get(s.key) != s.seq]
        for story in changed:
            self._forget(story.key)
            self._footprint[story.key] = story.footprint
            self._seq[story.key] = story.seq
            if not story.footprint.exclusive:
                self._place(story.key)
        if not any(self._wide.values()) and not changed:
            return
        tree = self._directories
        if any(self._wide.values()) or any(not s.footprint.exclusive for s in changed):
            listed = directories()
            if listed is not tree and listed != tree:
                tree = self._retest_all(listed)
        tested: set[str] = set()  # changed stories already tested against all the others
        for story in changed:
            if not story.footprint.exclusive:
                self._test_against_all(story.key, tested, tree)
            tested.add(story.key)

    def earlier_conflicts(self, key: str) -> tuple[str, ...]:
        """Earlier non-exclusive stories that conflict with `key`, in plan order."""
        found = self._earlier.get(key)
        if found is None:
            seq = self._seq[key]
            found = tuple(sorted((k for k in self._pairs.get(key, ()) if self._seq[k] < seq),
                                 key=self._seq.__getitem__))
            self._earlier[key] = found
        return found

    def reason(self, key: str, other: str) -> str | None:
        """Why `key` conflicts with `other` (None: it does not)."""
        a, b = self._footprint[key], self._footprint[other]
        if a.exclusive or b.exclusive:  # not stored; the test says so at once
            return self._test(a, b, self._directories)
        return self._pairs.get(key, {}).get(other)

    # ------------------------------------------------------------------ internals
    def _ordered(self, key: str, other: str) -> tuple[Footprint, Footprint]:
        if self._seq[key] > self._seq[other]:
            return self._footprint[key], self._footprint[other]
        return self._footprint[other], self._footprint[key]

    def _link(self, key: str, other: str, why: str | None) -> None:
        if why:
            self._pairs[key][other] = self._pairs[other][key] = why
        else:
            self._pairs[key].pop(other, None)
            self._pairs[other].pop(key, None)
        self._earlier.pop(key, None)
        self._earlier.pop(other, None)

    def _candidates(self, key: str) -> set[str]:
        """Stories whose patterns share a literal path prefix with `key`'s (see above)."""
        found: set[str] = set()
        for prefix in self._prefixes[key]:
            for cut in range(len(prefix) + 1):
                found |= self._at.get(prefix[:cut], set())
            found |= self._under.get(prefix, set())
        found.discard(key)
        return found

    def _place(self, key: str) -> None:
        fp = self._footprint[key]
        prefixes = self._prefixes[key] = {_literal_prefix(p) for p in fp.files + fp.shared}
        for prefix in prefixes:
            self._at.setdefault(prefix, set()).add(key)
            for cut in range(len(prefix)):
                self._under.setdefault(prefix[:cut], set()).add(key)

    def _test_against_all(self, key: str, skip: set[str], tree: Directories) -> None:
        for other in self._candidates(key):
            if other in skip:
                continue
            later, earlier = self._ordered(key, other)
            self.tests += 1
            why = self._test(later, earlier, None)
            if why is None:
                continue  # no tree makes these two meet
            self._wide[key].add(other)
            self._wide[other].add(key)
            if tree is not None:
                self.tests += 1
                why = self._test(later, earlier, tree)
            self._link(key, other, why)

    def _retest_all(self, tree: Directories) -> Directories:
        """The tree changed: re-test the pairs that can conflict at all, against it."""
        self._directories = tree
        for key, others in self._wide.items():
            for other in others:
                if self._seq[key] > self._seq[other]:  # each pair once
                    self.tests += 1
                    self._link(key, other, self._test(*self._ordered(key, other), tree))
        return tree

    def _forget(self, key: str) -> None:
        for other in self._wide.pop(key, set()):
            self._wide[other].discard(key)
        for other in self._pairs.pop(key, {}):
            self._pairs[other].pop(key, None)
            self._earlier.pop(other, None)
        self._earlier.pop(key, None)
        self._wide[key], self._pairs[key] = set(), {}
        for prefix in self._prefixes.pop(key, ()):
            self._at[prefix].discard(key)
            for cut in range(len(prefix)):
                self._under[prefix[:cut]].discard(key)


def _literal_prefix(pattern: str) -> tuple[str, ...]:
    """The leading path segments every path a gitignore-style pattern matches starts with:
    those before the first one holding a wildcard, and none for a pattern that matches at any
    depth (no slash but a trailing one)."""
    body = pattern[:-1] if pattern.endswith("/") else pattern
    if body.startswith("/"):
        body = body[1:]
    elif "/" not in body:
        return ()
    prefix = []
    for segment in body.split("/"):
        if any(ch in segment for ch in "*?["):
            break
        prefix.append(segment)
    return tuple(prefix)
