"""The conflict relation of a run's stories, computed once and kept up to date.

Admission asks, for every pending story on every pass, "which earlier, unfinished story
conflicts with it?". Asking the footprint test for every pair on every pass is O(K²) glob work
per pass. Here each pair is tested once per run, and again only when it could have changed:

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

from typing import Callable, Iterable

from ...bmad.footprint import Footprint, footprints_conflict

__all__ = ["ConflictIndex"]

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
