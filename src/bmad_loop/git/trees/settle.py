"""Merge rules at composition: the paths the lane settles by itself (`[integration] merge`).

Two stories that each append to a ledger, or each add a dependency to a lockfile, conflict in
git although the right result is mechanical. After git's three-way merge of a candidate, the
paths the story changed that a rule covers are settled here:

- ``union`` (append-only ledgers): when the story's file starts with its base's bytes (a pure
  append), the result is the target's current text followed by the story's added suffix, so
  each story's entry lands after everything already on the target, in plan order. Anything else
  (an edit, a deletion, an insertion in the middle) keeps git's own merge of that path: clean, it
  stands; conflicted, the story escalates as for any conflict. A path absent counts as empty.
  Computed here from the bytes, not by git's ``union`` driver, which folds identical lines and
  brings rewritten ones back.
- ``regenerate`` (derived files): when the composition conflicts in the rule's paths only, or
  always with ``always = true``, those paths take the target's version here and the lane runs
  the rule's command in the candidate (engine/lane/regenerate.py). A conflict elsewhere escalates.

The most specific glob wins (the longest literal prefix); the policy refuses ties.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Mapping

from ..runner import Git
from ...globs import literal_prefix_length, path_matches
from ...policy.mergerule import MergeRule, MergeRuleKind
from .diff import changed_status
from .edit import read_objects, replace_blobs

__all__ = ["MergeRules", "Sides", "Settled", "Regeneration", "Settlement", "Generators", "settle",
           "union_text"]


@dataclass(frozen=True)
class MergeRules:
    """The rules in force for a run: (glob, rule) pairs, the policy's and the built-in ones."""

    rules: tuple[tuple[str, MergeRule], ...] = ()

    @classmethod
    def of(cls, merge: Mapping[str, MergeRule], builtin: Iterable[tuple[str, MergeRule]] = ()) -> "MergeRules":
        """The policy's `[integration] merge`, plus built-in rules for globs it does not name."""
        pairs = dict(builtin)
        pairs.update(merge)  # the policy's own rule for the same glob wins
        return cls(tuple(pairs.items()))

    def __bool__(self) -> bool:
        return bool(self.rules)

    def rule_for(self, path: str) -> tuple[str, MergeRule] | None:
        """(glob, rule) of the most specific glob matching `path`, or None."""
        best = None
        for glob, rule in self.rules:
            if path_matches(glob, path, frozenset()) and (
                    best is None or literal_prefix_length(glob) > literal_prefix_length(best[0])):
                best = (glob, rule)
        return best

    def covers(self, path: str) -> bool:
        return self.rule_for(path) is not None

    def unions_only(self) -> "MergeRules":
        """The same without generators (a stacked start replays layers, it runs nothing)."""
        return MergeRules(tuple((g, r) for g, r in self.rules if r.kind == MergeRuleKind.UNION))


@dataclass(frozen=True)
class Settled:
    """One path the lane settled: its rule and the blob SHAs involved (None: absent)."""

    path: str
    rule: MergeRuleKind
    glob: str
    base: str | None
    target: str | None
    story: str | None
    result: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "rule": self.rule, "glob": self.glob, "base_blob": self.base,
                "target_blob": self.target, "story_blob": self.story, "result_blob": self.result}


@dataclass(frozen=True)
class Regeneration:
    """A regenerate rule to run in the candidate: its glob, the rule and the paths it settles."""

    glob: str
    rule: MergeRule
    paths: tuple[str, ...]


@dataclass(frozen=True)
class Settlement:
    """A merge after its rules: the tree, the conflicts left, the paths settled, and the
    generators the lane still runs in the candidate."""

    tree: str
    conflicts: tuple[str, ...]
    settled: tuple[Settled, ...] = ()
    regenerate: tuple[Regeneration, ...] = ()


def union_text(base: bytes | None, target: bytes | None, story: bytes | None) -> bytes | None:
    """The union of a story's append with the target's text, or None when the story's change
    is not a pure append (its file does not start with its base's bytes).

    An absent file counts as empty. When the target's text moved past the base and does not end
    in a newline, one is put before the suffix, so an entry never joins the last line."""
    base, target = base or b"", target or b""
    if story is None or not story.startswith(base):
        return None
    suffix = story[len(base):]
    if target and target != base and not target.endswith(b"\n") and suffix:
        target += b"\n"
    return target + suffix


@dataclass(frozen=True)
class Sides:
    """The three sides of a merge: the merge `base`, the `target` it lands on and the `story`
    merged in (commits or trees)."""

    base: str
    target: str
    story: str


class Generators(Enum):
    """Which generators a settlement asks for, and which version their paths take meanwhile."""

    AS_RULED = "as ruled"  # on a conflict in their paths, or `always`; the target's version
    # A repair's merge: none runs, the paths keep the story's version (its candidate redoes them).
    KEEP_STORY = "keep the story's version"
    # A repaired story's candidate: each one whose paths the story changed, as if `always`.
    EVERY = "every one the story's changes reach"


def settle(git: Git, rules: MergeRules, sides: Sides, tree: str, conflicts: tuple[str, ...],
           changed: Iterable[str] | None = None, *,
           generators: Generators = Generators.AS_RULED) -> Settlement:
    """Apply `rules` to git's merge of `sides`, which gave `tree` and `conflicts`; `changed`:
    the paths the story changed against the base, when known."""
    base, target, story = sides.base, sides.target, sides.story
    if not rules:
        return Settlement(tree, conflicts)
    paths = changed if changed is not None else changed_status(git, base, story)
    ruled = {p: hit for p in paths if (hit := rules.rule_for(p)) is not None}
    if not ruled:
        return Settlement(tree, conflicts)
    blobs = _blobs(git, (base, target, story), list(ruled))
    contents: dict[str, bytes | None] = {}
    settled: list[Settled] = []
    for path, (glob, rule) in ruled.items():
        if rule.kind != MergeRuleKind.UNION:
            continue
        (b_sha, b), (t_sha, t), (s_sha, s) = blobs[path]
        text = union_text(b, t, s)
        if text is not None:
            contents[path] = text
            settled.append(Settled(path, MergeRuleKind.UNION, glob, b_sha, t_sha, s_sha, None))
    left = tuple(c for c in conflicts if c not in contents)
    keep_story = generators is Generators.KEEP_STORY
    regenerate = _regenerations(ruled, left, generators is not Generators.AS_RULED)
    if regenerate is None:  # a conflict no generator settles: the story escalates
        return Settlement(_write(git, tree, contents), left, tuple(settled))
    side = 2 if keep_story else 1
    for job in regenerate:
        for path in job.paths:
            # The target's version, which the command redoes; a repair's merge keeps the
            # story's, so the story's intent is still a change when its candidate regenerates.
            contents[path] = blobs[path][side][1]
    left = tuple(c for c in left if not any(c in job.paths for job in regenerate))
    if keep_story:
        regenerate = []
    new_tree = _write(git, tree, contents)
    results = _result_shas(git, new_tree, [s.path for s in settled])
    settled = [Settled(s.path, s.rule, s.glob, s.base, s.target, s.story, results.get(s.path))
               for s in settled]
    return Settlement(new_tree, left, tuple(settled), tuple(regenerate))


def _regenerations(ruled: Mapping[str, tuple[str, MergeRule]], conflicts: tuple[str, ...],
                   every: bool = False) -> list[Regeneration] | None:
    """The generators to run (`every`: each one whose paths the story changed), or None when a
    conflict lies outside every generator's paths."""
    by_glob: dict[str, tuple[MergeRule, list[str]]] = {}
    for path, (glob, rule) in ruled.items():
        if rule.kind == MergeRuleKind.REGENERATE:
            by_glob.setdefault(glob, (rule, []))[1].append(path)
    regen_paths = {p for _rule, ps in by_glob.values() for p in ps}
    if any(c not in regen_paths for c in conflicts):
        return None
    return [Regeneration(glob, rule, tuple(sorted(ps))) for glob, (rule, ps) in by_glob.items()
            if every or rule.always or any(p in conflicts for p in ps)]


Blob = tuple[str | None, bytes | None]  # (sha, content) of a file on one side; None: no file


def _blobs(git: Git, revs: tuple[str, str, str],
           paths: list[str]) -> dict[str, tuple[Blob, Blob, Blob]]:
    """{path: ((sha, bytes) at each of `revs`)}, None where a rev holds no file there."""
    specs = [f"{rev}:{path}" for path in paths for rev in revs]
    found = read_objects(git, specs)
    out: dict[str, tuple[Blob, Blob, Blob]] = {}
    for i, path in enumerate(paths):
        base, target, story = ((obj[0], obj[2]) if obj is not None and obj[1] == "blob"
                               else (None, None) for obj in found[3 * i:3 * i + 3])
        out[path] = (base, target, story)
    return out


def _write(git: Git, tree: str, contents: dict[str, bytes | None]) -> str:
    return replace_blobs(git, tree, contents) if contents else tree


def _result_shas(git: Git, tree: str, paths: list[str]) -> dict[str, str | None]:
    if not paths:
        return {}
    found = read_objects(git, [f"{tree}:{p}" for p in paths])
    return {p: (obj[0] if obj is not None else None) for p, obj in zip(paths, found)}
