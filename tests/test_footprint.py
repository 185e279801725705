"""Story metadata, footprint sources and reasons, glob overlap and the conflict rule."""

import itertools
import random
import shutil
import subprocess

import pytest

from bmad_loop.bmad.footprint import Footprint, footprint_from_mapping, footprints_conflict
from bmad_loop.globs import globs_may_overlap, path_matches, pattern_problem
from bmad_loop.bmad.story_files import parse_story_text
from support import SAMPLE_STORY, init_repo


def block_story(block: str, heading: str = "## Footprint") -> str:
    return f"# Story 3.1: Block story\n\n{heading}\n\n```yaml\n{block}```\n\n## Tasks\n\n- [ ] x\n"


# --- sources ---


def test_the_sample_story_front_matter_gives_title_and_footprint():
    meta = parse_story_text(SAMPLE_STORY)
    assert meta.title == "User authentication"
    assert meta.footprint == Footprint(
        files=("src/shop/auth/**", "tests/auth/**"),
        shared=("src/shop/__init__.py", "CHANGELOG.md"),
        resources=("database",),
    )
    assert meta.footprint.reason is None and not meta.footprint.exclusive
    assert meta.errors == ()
    assert (meta.depends_on, meta.merge_class, meta.tier, meta.done_checkpoint) == ((), None, None, False)


def test_a_footprint_block_may_hold_a_footprint_mapping():
    meta = parse_story_text(block_story('footprint:\n  files: ["src/cart/**"]\n'))
    assert meta.footprint == Footprint(files=("src/cart/**",))
    assert meta.title == "Block story"


def test_a_footprint_block_may_hold_the_lists_directly():
    meta = parse_story_text(block_story('files: ["src/cart/**"]\nshared: [CHANGELOG.md]\nresources: [gpu]\n'))
    assert meta.footprint == Footprint(files=("src/cart/**",), shared=("CHANGELOG.md",), resources=("gpu",))


def test_a_yml_fence_and_front_matter_without_footprint_also_work():
    text = "---\ntitle: T\n---\n# Story 1.1: X\n\n## Footprint\n\n~~~yml\nfiles: [a.py]\n~~~\n"
    meta = parse_story_text(text)
    assert meta.footprint == Footprint(files=("a.py",))
    assert meta.title == "T"


def test_a_footprint_in_front_matter_and_a_block_is_invalid_and_exclusive():
    text = SAMPLE_STORY + "\n## Footprint\n\n```yaml\nfiles: [x]\n```\n"
    fp = parse_story_text(text).footprint
    assert fp.reason == "invalid: footprint given twice (front matter and ## Footprint block)"
    assert fp.exclusive


def test_two_footprint_blocks_are_invalid():
    text = block_story("files: [a]\n") + "\n## Footprint\n\n```yaml\nfiles: [b]\n```\n"
    assert parse_story_text(text).footprint.reason.startswith("invalid: footprint given twice")


def test_no_footprint_anywhere_is_missing_and_exclusive():
    meta = parse_story_text("# Story 1.1: Scaffold\n\nJust prose.\n")
    assert meta.footprint == Footprint(reason="missing")
    assert meta.footprint.exclusive
    assert meta.title == "Scaffold"


def test_a_yaml_block_outside_the_footprint_section_is_not_a_footprint():
    text = "# S\n\n## Dev Notes\n\n```yaml\nfiles: [a]\n```\n"
    assert parse_story_text(text).footprint.reason == "missing"


def test_a_footprint_heading_inside_a_code_fence_is_not_a_heading():
    text = "# S\n\n```markdown\n## Footprint\n\n```\n"
    assert parse_story_text(text).footprint.reason == "missing"


def test_a_footprint_heading_without_a_yaml_block_is_invalid():
    text = "# S\n\n## Footprint\n\nsrc/** probably\n\n## Tasks\n\n```yaml\nfiles: [a]\n```\n"
    assert parse_story_text(text).footprint.reason == (
        "invalid: ## Footprint heading without a fenced yaml block"
    )


@pytest.mark.parametrize(
    "front",
    [
        "footprint: {files: [], shared: [], resources: []}",
        "footprint: {}",
        "footprint:",
        "footprint: {files: null}",
    ],
)
def test_a_footprint_whose_lists_are_all_empty_is_empty_and_exclusive(front):
    fp = parse_story_text(f"---\n{front}\n---\n# S\n").footprint
    assert fp.reason == "empty"
    assert fp.exclusive


def test_an_empty_block_is_empty():
    assert parse_story_text(block_story("")).footprint.reason == "empty"


@pytest.mark.parametrize(
    "mapping, why",
    [
        ({"files": ["a"], "paths": ["b"]}, "unknown key 'paths'"),
        ({"files": "src/**"}, "'files' must be a list of strings"),
        ({"shared": [1]}, "'shared' must be a list of strings"),
        ({"resources": [{"a": 1}]}, "'resources' must be a list of strings"),
        ({"files": ["!src/**"]}, "negation is not supported"),
        ({"files": ["C:/src/**"]}, "absolute path"),
        ({"files": ["//server/share"]}, "absolute path"),
        ({"files": ["~/notes"]}, "absolute path"),
        ({"files": ["src/../etc"]}, "'..' component"),
        ({"files": ["../x"]}, "'..' component"),
        ({"files": ["./src/x"]}, "'.' component"),
        ({"files": ["src//x"]}, "empty path component"),
        ({"files": [""]}, "empty pattern"),
        ({"files": ["/"]}, "empty pattern"),
        ({"files": ["src\\x"]}, "backslash"),
        ({"files": [" src/x"]}, "whitespace"),
        ({"files": ["src/[ab"]}, "unclosed '['"),
        ({"files": ["src/[[:nope:]]"]}, "unknown character class"),
        ({"resources": [""]}, "bad resource name"),
        (["src/**"], "footprint must be a mapping"),
    ],
)
def test_an_invalid_footprint_says_why_and_is_exclusive(mapping, why):
    fp = footprint_from_mapping(mapping)
    assert fp.reason.startswith("invalid: ")
    assert why in fp.reason
    assert fp.exclusive


def test_an_invalid_footprint_in_a_story_file_is_exclusive_not_an_error():
    meta = parse_story_text("---\nfootprint:\n  files: ['!x']\n---\n# S\n")
    assert meta.footprint.reason.startswith("invalid: negation")
    assert meta.errors == ()


def test_a_block_with_footprint_and_other_keys_is_invalid():
    fp = parse_story_text(block_story("footprint: {files: [a]}\ndepends_on: [x]\n")).footprint
    assert fp.reason == "invalid: unknown key 'depends_on' beside 'footprint'"


def test_broken_yaml_in_a_block_is_invalid():
    assert parse_story_text(block_story("files: [a\n")).footprint.reason == (
        "invalid: ## Footprint block is not valid YAML"
    )


def test_valid_patterns_have_no_problem():
    for p in ("src/**", "/README.md", "docs/", "*.py", "**/test_*.py", "a/[!x]?/b*", "[[:alpha:]]x", "#notes"):
        assert pattern_problem(p) is None, p


def test_to_dict_and_with_files_keep_the_reason():
    fp = Footprint(files=("a",), shared=("b",), resources=("db",))
    assert fp.to_dict() == {"files": ["a"], "shared": ["b"], "resources": ["db"]}
    grown = Footprint(reason="missing").with_files("s.md", "s.md")
    assert grown == Footprint(files=("s.md",), reason="missing")
    assert fp.with_files("a", "c").files == ("a", "c")


# --- other metadata ---


def test_front_matter_carries_depends_on_merge_class_tier_and_done_checkpoint():
    meta = parse_story_text(
        "---\ndepends_on: [1-1-a, 1-2-b]\nmerge_class: operator\ntier: heavy\ndone_checkpoint: true\n"
        "footprint: {files: [x]}\n---\n# Story 1.3: Third\n"
    )
    assert meta.depends_on == ("1-1-a", "1-2-b")
    assert (meta.merge_class, meta.tier, meta.done_checkpoint) == ("operator", "heavy", True)
    assert meta.title == "Third"
    assert meta.errors == ()


@pytest.mark.parametrize(
    "front, error",
    [
        ("depends_on: {a: 1}", "'depends_on' must be a list of story keys"),
        ("depends_on: [1, 2]", "'depends_on' must be a list of story keys"),
        ("depends_on: ['(done)']", "'depends_on' entry '(done)' names no story"),
        ("merge_class: later", "'merge_class' must be one of self, operator"),
        ("tier: [a]", "'tier' must be a non-empty string"),
        ("done_checkpoint: maybe", "'done_checkpoint' must be true or false"),
        ("title: [a]", "'title' must be a non-empty string"),
    ],
)
def test_bad_metadata_is_reported_as_an_error(front, error):
    meta = parse_story_text(f"---\n{front}\n---\n# S\n")
    assert any(error in e for e in meta.errors), meta.errors


def test_front_matter_that_is_not_yaml_or_not_a_mapping_or_not_closed_is_an_error():
    for text in ("---\ntitle: [\n---\n# S\n", "---\n- a\n---\n# S\n", "---\ntitle: x\n# S\n"):
        meta = parse_story_text(text)
        assert meta.errors, text
        assert meta.footprint.reason.startswith("invalid: ")


def test_the_title_falls_back_to_the_first_heading_without_its_story_prefix():
    assert parse_story_text("Intro\n\n# Story 2.3a: Search index\n\n# Later\n").title == "Search index"
    assert parse_story_text("# Plain title\n").title == "Plain title"
    assert parse_story_text("no heading\n").title is None
    assert parse_story_text("```\n# not a heading\n```\n# Real\n").title == "Real"


# --- overlap ---

OVERLAPPING = [
    ("src/auth/**", "src/**"),
    ("**/test_*.py", "tests/test_auth.py"),
    ("docs/", "docs/x.md"),
    ("README.md", "src/README.md"),
    ("src/*", "src/a/b.py"),
    ("*.py", "*.md"),  # x.py/notes.md: a folder named x.py is covered with everything in it
    ("a*b", "a*c"),  # a1b/a2c
    ("src/", "lib/src/x.py"),
    ("src/**/x.py", "src/x.py"),
    ("**", "anything/at/all"),
    ("src/a?c.py", "src/abc.py"),
    ("src/[ab].py", "src/b.py"),
    ("src/*.py", "src/test_*"),
    ("/src/*", "src/a.py"),
    ("tests/", "tests/**"),
    ("src/a/**", "src/a"),
    ("src/a", "src/a/b/c"),
    ("**/migrations/**", "app/migrations/0001.py"),
]

DISJOINT = [
    ("src/a/*.py", "src/b/*.py"),
    ("/README.md", "src/README.md"),
    ("/*.py", "/*.md"),
    ("/a*b", "/a*c"),
    ("src/auth/**", "src/cart/**"),
    ("tests/test_auth.py", "tests/test_cart.py"),
    ("src/x.py", "src/y.py"),
    ("src/*.py", "docs/*.md"),
    ("src/[ab].py", "src/c.py"),
    ("src/a?c.py", "src/abd.py"),
    ("src/foo*", "src/bar*"),
    ("/src/*.py", "lib/src/a.py"),
    ("src/**/*.py", "lib/**"),
    ("/docs/", "/doc"),
]


@pytest.mark.parametrize("a, b", OVERLAPPING)
def test_globs_that_can_match_a_common_path_overlap(a, b):
    assert globs_may_overlap(a, b)
    assert globs_may_overlap(b, a)


@pytest.mark.parametrize("a, b", DISJOINT)
def test_globs_that_cannot_match_a_common_path_are_disjoint(a, b):
    assert not globs_may_overlap(a, b)
    assert not globs_may_overlap(b, a)


def test_the_reference_matcher_follows_gitignore_rules():
    assert path_matches("README.md", "src/README.md")
    assert not path_matches("/README.md", "src/README.md")
    assert path_matches("docs/", "docs/x.md")
    assert not path_matches("docs/", "docs")  # a file named docs is not a directory
    assert path_matches("src/*", "src/a/b.py")
    assert path_matches("*.py", "x.py/notes.md")
    assert path_matches("a/**/b", "a/b") and path_matches("a/**/b", "a/x/y/b")
    assert not path_matches("a/**", "a")
    assert not path_matches("src/*.py", "lib/src/a.py")
    assert path_matches("a**b", "axxb") and not path_matches("a**b", "ax/xb")


# Pieces for random patterns and paths: literals, wildcards, classes, look-alike suffixes.
PATTERN_SEGMENTS = [
    "a", "b", "ab", "a.py", "b.md", "*", "*.py", "*.md", "a*", "*b", "?", "??", "a?", "[ab]",
    "[!a]*", "[a-c].py", "**", "a*b", "x*y", "*a*", "[[:digit:]]*",
]
PATH_SEGMENTS = ["a", "b", "ab", "ba", "a.py", "b.md", "c.py", "a.md", "x", "xay", "abc", "1b", "aab"]


def random_pattern(rng: random.Random) -> str:
    body = "/".join(rng.choice(PATTERN_SEGMENTS) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.3:
        body = "/" + body
    if rng.random() < 0.2:
        body += "/"
    return body


def all_paths(max_depth: int = 3) -> list[str]:
    paths = []
    for depth in range(1, max_depth + 1):
        paths.extend("/".join(p) for p in itertools.product(PATH_SEGMENTS, repeat=depth))
    return paths


def test_overlap_is_sound_for_random_patterns_and_paths():
    """If any concrete path matches both patterns, globs_may_overlap must say they overlap."""
    rng = random.Random(20261202)
    patterns = sorted({random_pattern(rng) for _ in range(300)})
    paths = all_paths(2) + [
        "/".join(rng.choice(PATH_SEGMENTS) for _ in range(rng.randint(3, 4))) for _ in range(700)
    ]
    matched = {p: frozenset(i for i, path in enumerate(paths) if path_matches(p, path)) for p in patterns}
    unsound = []
    disjoint = 0
    for a, b in itertools.combinations(patterns, 2):
        common = matched[a] & matched[b]
        verdict = globs_may_overlap(a, b)
        assert verdict == globs_may_overlap(b, a), (a, b)
        if common and not verdict:
            unsound.append((a, b, paths[min(common)]))
        if not verdict:
            disjoint += 1
    assert unsound == []
    assert disjoint > 5000, "the check must not be vacuous: many pairs are provably disjoint"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_reference_matcher_agrees_with_git_check_ignore(tmp_path):
    """The soundness test is only as good as its matcher, so check the matcher against git."""
    init_repo(tmp_path)
    rng = random.Random(7)
    patterns = sorted({random_pattern(rng) for _ in range(40)}) + ["docs/", "/README.md", "a/**", "**/b"]
    paths = all_paths(2) + ["/".join(rng.choice(PATH_SEGMENTS) for _ in range(3)) for _ in range(60)]
    disagreements = []
    for pattern in patterns:
        (tmp_path / ".gitignore").write_text(pattern + "\n")
        out = subprocess.run(
            ["git", "check-ignore", "--no-index", "--stdin", "-v", "-n"],
            cwd=tmp_path,
            input="\n".join(paths) + "\n",
            capture_output=True,
            text=True,
        ).stdout
        git_says = {}
        for line in out.splitlines():
            source, path = line.split("\t", 1)
            git_says[path] = source != "::"
        for path in paths:
            if git_says[path] != path_matches(pattern, path):
                disagreements.append((pattern, path, git_says[path]))
    assert disagreements == []


# --- conflicts ---


def fp(files=(), shared=(), resources=()):
    return Footprint(files=tuple(files), shared=tuple(shared), resources=tuple(resources))


def test_files_overlapping_files_conflict_and_the_reason_names_both():
    assert footprints_conflict(fp(["src/auth/**"]), fp(["src/**"])) == "src/auth/** overlaps src/**"


def test_files_overlapping_the_others_shared_conflict_both_ways():
    assert footprints_conflict(fp(["src/app/**"]), fp(["/x"], shared=["src/app/__init__.py"])) == (
        "src/app/** overlaps src/app/__init__.py"
    )
    assert footprints_conflict(fp(["/x"], shared=["src/app/__init__.py"]), fp(["src/app/**"])) == (
        "src/app/** overlaps src/app/__init__.py"
    )


def test_shared_against_shared_does_not_conflict():
    a = fp(["src/auth/**"], shared=["/CHANGELOG.md", "src/__init__.py"])
    b = fp(["src/cart/**"], shared=["/CHANGELOG.md", "src/__init__.py"])
    assert footprints_conflict(a, b) is None


def test_a_shared_name_without_a_slash_matches_at_any_depth_and_so_meets_other_files():
    """`CHANGELOG.md` means any CHANGELOG.md, so it meets `src/cart/**` (src/cart/CHANGELOG.md)."""
    a = fp(["src/auth/**"], shared=["CHANGELOG.md"])
    assert footprints_conflict(a, fp(["src/cart/**"])) == "src/cart/** overlaps CHANGELOG.md"
    assert footprints_conflict(fp(["src/auth/**"], shared=["/CHANGELOG.md"]), fp(["src/cart/**"])) is None


def test_disjoint_files_and_shared_resources_do_not_conflict():
    assert footprints_conflict(fp(["src/a/**"], resources=["db"]), fp(["src/b/**"], resources=["db"])) is None


@pytest.mark.parametrize("reason", ["missing", "empty", "invalid: negation is not supported: '!x'"])
def test_an_exclusive_footprint_conflicts_with_everything(reason):
    exclusive = Footprint(files=("only/this",), reason=reason)
    other = fp(["elsewhere/**"])
    assert footprints_conflict(exclusive, other) == f"exclusive footprint ({reason})"
    assert footprints_conflict(other, exclusive) == f"exclusive footprint ({reason})"
    assert footprints_conflict(exclusive, Footprint(reason="missing")) is not None
