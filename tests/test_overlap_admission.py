"""Precise overlap where it is used: the target tree's directories (`treedirs`), admission with
them, and a real run in which a bare file name no longer holds back an unrelated story."""

import pytest

from bmad_loop.engine.lane.admission import StoryView, admit
from bmad_loop.bmad.footprint import Footprint
from bmad_loop.git.runner import Git
from bmad_loop.bmad.footprint import conflict_on, tree_directories
from support import MERGE_NONE, StoryDef, barrier_script, git_repo, go, inside, states, wait_until

TREE = {"src/greet.py": "", "src/app/__init__.py": "", "docs/index.md": "", "CHANGELOG.md": "",
        "odd name/é x.txt": ""}


@pytest.fixture
def target(tmp_path):
    repo = git_repo(tmp_path / "t", TREE)
    return repo, repo.rev("HEAD")


def test_the_directories_of_a_commit_are_listed_and_files_are_not(target):
    repo, sha = target
    assert tree_directories(repo, sha) == frozenset({"src", "src/app", "docs", "odd name"})
    assert tree_directories(repo, "0" * 40) is None  # no such commit: unknown, stay conservative
    assert tree_directories(repo, None) is None


def test_a_listed_tree_is_not_listed_again(target, tmp_path):
    repo, sha = target
    first = tree_directories(repo, sha)
    nowhere = Git(tmp_path / "no-repository-here")  # any git process here would fail
    assert tree_directories(nowhere, sha) is first


def two_stories(a: Footprint, b: Footprint) -> list[StoryView]:
    return [StoryView(key="1-1-a", seq=1, epic="1", state="pending", footprint=a),
            StoryView(key="1-2-b", seq=2, epic="1", state="pending", footprint=b)]


def admitted(repo, sha, a: list[str], b: list[str]):
    decision = admit(two_stories(Footprint(files=tuple(a)), Footprint(files=tuple(b))),
                     max_parallel=2, capacity=lambda name: 1, gates_mode="none",
                     conflict=conflict_on(repo, lambda: sha))
    return decision.dispatch, decision.waiting


@pytest.mark.parametrize("a, b, together", [
    (["CHANGELOG.md"], ["src/greet.py"], True),      # two files
    (["flagA"], ["src/greet.py"], True),
    (["src"], ["src/greet.py"], False),              # src is a directory on the target
    (["docs/"], ["docs/x.md"], False),               # a trailing / is a directory
    (["newdir"], ["newdir/x.py"], True),             # not on the target: the file newdir
    (["newdir/"], ["newdir/x.py"], False),           # how a new directory is written
    (["app"], ["src/app/models.py"], False),         # a bare name meets the directory src/app
])
def test_admission_runs_together_only_what_cannot_write_a_common_path(target, a, b, together):
    repo, sha = target
    dispatch, waiting = admitted(repo, sha, a, b)
    if together:
        assert (dispatch, waiting) == (["1-1-a", "1-2-b"], {})
    else:
        assert dispatch == ["1-1-a"]
        assert waiting["1-2-b"].startswith("conflicts with 1-1-a: ")


def test_admission_without_a_target_commit_stays_conservative(target):
    repo, _ = target
    dispatch, waiting = admitted(repo, None, ["CHANGELOG.md"], ["src/greet.py"])
    assert dispatch == ["1-1-a"]
    assert waiting == {"1-2-b": "conflicts with 1-1-a: src/greet.py overlaps CHANGELOG.md"}


def test_a_comparison_free_pass_lists_nothing(target):
    repo, sha = target
    asked = []
    conflict = conflict_on(repo, lambda: asked.append(sha) or sha)
    admit(two_stories(Footprint(files=("a",)), Footprint(reason="missing")), max_parallel=2,
          capacity=lambda name: 1, gates_mode="none", conflict=conflict)
    assert asked == []  # an exclusive footprint needs no tree
    conflict(Footprint(files=("a",)), Footprint(files=("b",)))
    conflict(Footprint(files=("a",)), Footprint(files=("c",)))
    assert asked == [sha]  # read once per pass


def test_a_bare_file_name_and_a_source_file_are_in_dev_together_through_the_cli(make_repo, bar):
    a = StoryDef("1-1-notes", files=["CHANGELOG.md"])
    b = StoryDef("1-2-greet", files=["src/greet.py"])
    repo = make_repo([a, b], script=barrier_script([a, b], bar),
                     policy=MERGE_NONE.format(n=2, strategy="merge"),
                     files={"src/greet.py": "print('hi')\n", "CHANGELOG.md": "# log\n"})
    proc = repo.spawn("run")
    # Both agents inside dev at once: before, 1-2-greet waited for 1-1-notes to integrate.
    wait_until(lambda: inside(bar) == [a.key, b.key], what="both stories inside dev")
    assert states(repo) == {a.key: "working", b.key: "working"}
    go(bar, b.key)
    go(bar, a.key)
    assert proc.wait(timeout=60) == 0, repo.spawned_logs()
    assert states(repo) == {a.key: "integrated", b.key: "integrated"}
    assert not [e for e in repo.journal() if e["kind"] == "story.waiting" and e["story"] == b.key]


# ------------------------------------------------------------------ drift reads footprints the same way
def _drift_paths(repo) -> list[str]:
    return [p for e in repo.journal() if e["kind"] == "footprint.drift" for p in e["data"]["paths"]]


def test_drift_reads_a_literal_path_as_admission_does(make_repo):
    """`src` is a folder of the target, so it covers `src/new.py`; `newdir` is not, so it is a
    file and `newdir/x.py` is drift (admission let other stories write under it meanwhile)."""
    from support import StoryDef

    stories = [StoryDef("1-1-alpha", files=["src"]), StoryDef("1-2-beta", files=["newdir"]),
               StoryDef("1-3-gamma", files=["other/"])]
    script = {"1-1-alpha": {"dev": [{"write": {"src/new.py": "A = 1\n"}}]},
              "1-2-beta": {"dev": [{"write": {"newdir/x.py": "B = 1\n"}}]},
              "1-3-gamma": {"dev": [{"write": {"other/y.py": "C = 1\n"}}]}}
    repo = make_repo(stories, script=script, policy='[gates]\nmode = "none"\n')
    (repo.root / "src").mkdir(exist_ok=True)
    (repo.root / "src" / "keep.py").write_text("K = 1\n")
    repo.commit_all("src is a folder of the target")
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert _drift_paths(repo) == ["newdir/x.py"]
