"""Overlap against brute force, on random trees: never under-reports, and is exact for literals.

A tree is a set of file paths; its directories are what the conflict test is given. The
reference is `path_matches(pattern, path, directories)`: the gitignore matcher (checked against
`git check-ignore` in test_footprint.py) in which a parent path counts only when it is one of
the tree's directories, or the pattern ends with `/`.
"""

import itertools
import random

from bmad_loop.bmad.footprint import Footprint, footprints_conflict
from bmad_loop.globs import globs_may_overlap, path_matches

NAMES = ["a", "b", "ab", "a.py", "b.md", "x", "src"]
WILD_SEGMENTS = ["*", "*.py", "*.md", "a*", "*b", "?", "[ab]", "[!a]*", "**", "a*b"]


def random_path(rng: random.Random, depth: tuple[int, int] = (1, 4)) -> str:
    return "/".join(rng.choice(NAMES) for _ in range(rng.randint(*depth)))


def ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:k]) for k in range(1, len(parts))]


def random_tree(rng: random.Random) -> tuple[set[str], frozenset[str]]:
    """Files (none of them a directory of another) and the tree's directories."""
    files: set[str] = set()
    for _ in range(rng.randint(2, 10)):
        path = random_path(rng)
        directories = {d for f in files for d in ancestors(f)}
        if path in directories or any(up in files for up in ancestors(path)):
            continue
        files.add(path)
    return files, frozenset(d for f in files for d in ancestors(f))


def literal_pattern(rng: random.Random, files: set[str], directories: frozenset[str]) -> str:
    """A path with no wildcard: a file of the tree, a directory, or a new path; bare or anchored."""
    pool = [p for p in (sorted(files) + sorted(directories)) if p] or [random_path(rng)]
    path = rng.choice(pool) if rng.random() < 0.6 else random_path(rng, (1, 3))
    roll = rng.random()
    if roll < 0.25:
        return path.rsplit("/", 1)[-1]  # a bare name: any depth
    if roll < 0.45:
        return "/" + path
    if roll < 0.6:
        return path + "/"
    if roll < 0.7:
        return path + "/**"
    return path


def wild_pattern(rng: random.Random) -> str:
    parts = [rng.choice(WILD_SEGMENTS + NAMES) for _ in range(rng.randint(1, 3))]
    body = "/".join(parts)
    if rng.random() < 0.3:
        body = "/" + body
    if rng.random() < 0.2:
        body += "/"
    return body


def is_literal(pattern: str) -> bool:
    body = pattern[:-3] if pattern.endswith("/**") else pattern
    return not any(ch in body for ch in "*?[")


def universe(rng, files, directories, patterns) -> list[str]:
    """Candidate paths: the tree's, new ones, each directory's and literal pattern's children."""
    paths = set(files) | set(directories)
    paths.update("/".join(p) for depth in (1, 2) for p in itertools.product(NAMES, repeat=depth))
    for base in list(directories) + [p.strip("/").removesuffix("/**") for p in patterns if is_literal(p)]:
        paths.add(base)
        paths.update(f"{base}/{name}" for name in NAMES)
        paths.update(f"{base}/{name}/{rng.choice(NAMES)}" for name in NAMES)
    paths.update(random_path(rng, (3, 5)) for _ in range(200))
    return sorted(paths)


def test_no_false_disjoint_on_random_trees_and_exact_verdicts_for_literals():
    rng = random.Random(20261215)
    pairs = found_common = sharper = literal_pairs = 0
    unsound, imprecise = [], []
    for _ in range(60):
        files, directories = random_tree(rng)
        patterns = sorted({literal_pattern(rng, files, directories) for _ in range(25)}
                          | {wild_pattern(rng) for _ in range(20)})
        paths = universe(rng, files, directories, patterns)
        matched = {p: frozenset(x for x in paths if path_matches(p, x, directories)) for p in patterns}
        for a, b in itertools.combinations(patterns, 2):
            pairs += 1
            common = matched[a] & matched[b]
            verdict = globs_may_overlap(a, b, directories)
            assert verdict == globs_may_overlap(b, a, directories), (a, b)
            if common:
                found_common += 1
                if not verdict:
                    unsound.append((a, b, min(common), sorted(directories)))
            # Knowing the directories only ever narrows the verdict.
            assert not verdict or globs_may_overlap(a, b), (a, b)
            if globs_may_overlap(a, b) and not verdict:
                sharper += 1
            if is_literal(a) and is_literal(b):
                literal_pairs += 1
                if verdict != bool(common):
                    imprecise.append((a, b, sorted(directories)))
    assert unsound == []
    assert imprecise == []
    # Not vacuous: many pairs share paths, many are newly told apart, many are literal pairs.
    assert pairs > 30_000 and found_common > 3_000 and sharper > 3_000 and literal_pairs > 10_000


def test_two_literal_files_conflict_exactly_when_they_are_the_same_path():
    rng = random.Random(7)
    for _ in range(40):
        files, directories = random_tree(rng)
        candidates = sorted(files | {random_path(rng, (2, 4)) for _ in range(20)})
        candidates = [p for p in candidates if p not in directories and "/" in p]
        for a, b in itertools.product(candidates, repeat=2):
            for fa, fb in ((a, b), ("/" + a, b), (a, "/" + b)):
                clash = footprints_conflict(Footprint(files=(fa,)), Footprint(files=(fb,)), directories)
                assert (clash is not None) == (a == b), (fa, fb, sorted(directories))


def test_without_directories_the_old_conservative_verdict_stands():
    assert globs_may_overlap("CHANGELOG.md", "src/greet.py")  # src/greet.py/CHANGELOG.md
    assert not globs_may_overlap("CHANGELOG.md", "src/greet.py", frozenset({"src"}))
    assert footprints_conflict(Footprint(files=("flagA",)), Footprint(files=("src/greet.py",))) is not None
    assert footprints_conflict(Footprint(files=("flagA",)), Footprint(files=("src/greet.py",)),
                               frozenset({"src"})) is None


def test_each_rule_of_the_documented_table():
    tree = frozenset({"src", "src/app", "docs"})
    table = [
        ("CHANGELOG.md", "src/greet.py", False),   # two files
        ("src", "src/greet.py", True),             # src is a directory of the tree
        ("/src", "src/app/x.py", True),
        ("docs/", "docs/x.md", True),              # trailing /: a directory
        ("newdir", "newdir/x.py", False),          # not a directory of the tree: a file
        ("newdir/", "newdir/x.py", True),
        ("newdir/**", "newdir/x.py", True),
        ("newdir/**", "/newdir", False),           # /** covers what is inside, not the name
        ("newdir/**", "newdir", True),             # newdir/newdir
        ("src/*", "src/app/x.py", True),           # matches the directory src/app
        ("src/*", "src/new/x.py", False),          # src/new does not exist: src/* meets files
        ("*.py", "*.md", False),                   # no directory named *.py in the tree
        ("app", "src/app/x.py", True),             # a bare name meets src/app, a directory
        ("README.md", "src/README.md", True),      # a bare name matches at any depth
        ("/README.md", "src/README.md", False),
    ]
    wrong = [(a, b, want) for a, b, want in table
             if globs_may_overlap(a, b, tree) != want or globs_may_overlap(b, a, tree) != want]
    assert wrong == []


def test_directory_names_holding_wildcard_characters_are_matched_literally():
    tree = frozenset({"lib", "lib/a*b", "lib/[x]"})
    assert globs_may_overlap("lib/a*b", "lib/a*b/f.py", tree)  # the directory itself
    assert globs_may_overlap("a*b", "lib/a*b/f.py", tree)
    assert not globs_may_overlap("/lib/[x]", "lib/x/f.py", tree)  # [x] names the file x: lib/x
    assert globs_may_overlap("/lib/[[]x]", "lib/[x]/f.py", tree)
    assert not globs_may_overlap("a*b", "lib/azb/f.py", tree)  # lib/azb is not a directory
