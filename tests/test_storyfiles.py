"""The finding modules on their own: the committed tree, story_location resolution, the story
file search order, v4 statuses, and the project root."""

from __future__ import annotations

import pytest

from bmad_loop.bmad.board import parse_board
from bmad_loop.bmad.v4 import v4_status
from bmad_loop.git.trees.committed import CommittedTree, FolderTree
from bmad_loop.errors import ConfigError
from bmad_loop.policy.load import find_project_root
from bmad_loop.bmad.story_files import find_story_file, resolve_location, story_file_matches
from support import board_with, git_repo, write


@pytest.fixture
def repo(tmp_path):
    """A committed tree with story files in several name forms, and a binary file."""
    root = tmp_path / "repo"
    git = git_repo(root, {
        "docs/stories/1-1-a.md": "one\n",
        "docs/stories/stories/epic-2/2-1-b.md": "two\r\nlines\r\n",
        "docs/stories/story-3.1.md": "three",
        "docs/stories/4.1.v4-name.md": "four\n",
        "docs/stories/4.10.other.md": "not 4.1\n",
        "bin/blob.dat": "",
    })
    (root / "bin/blob.dat").write_bytes(b"\x00\n\xff" * 100)
    git.run("add", "-A")
    git.run("commit", "-q", "-m", "binary", env=git.identity_env())
    return root, git, CommittedTree(git, git.rev("HEAD"), "main")


def entries(*lines):
    board = parse_board(board_with(*lines), "b.yaml")
    return {e.key: e for e in board.stories()}


def test_the_committed_tree_reads_many_blobs_exactly_through_one_batch(repo):
    root, _git, tree = repo
    got = tree.read_many(["docs/stories/stories/epic-2/2-1-b.md", "bin/blob.dat",
                          "docs/stories/story-3.1.md"])
    assert got["docs/stories/stories/epic-2/2-1-b.md"] == b"two\r\nlines\r\n"
    assert got["bin/blob.dat"] == b"\x00\n\xff" * 100
    assert got["docs/stories/story-3.1.md"] == b"three"
    assert tree.is_dir("docs/stories/stories") and not tree.is_file("docs/stories")
    # the working copy does not matter: an edit there is not what the tree holds
    (root / "docs/stories/1-1-a.md").write_text("edited\n")
    write(root / "docs/stories/9-9-new.md", "new\n")
    assert tree.read("docs/stories/1-1-a.md") == b"one\n"
    assert not tree.is_file("docs/stories/9-9-new.md")
    assert FolderTree(root).is_file("docs/stories/9-9-new.md")


def test_each_name_form_is_found_and_a_v4_prefix_never_matches_a_longer_number(repo):
    root, _git, tree = repo
    found = entries("epic-1: backlog", "1-1-a: backlog", "epic-2: backlog", "2-1-b: backlog",
                    "epic-3: backlog", "3-1-c: backlog", "epic-4: backlog", "4-1-d: backlog",
                    "4-2-e: backlog")
    assert find_story_file(tree, "docs/stories", found["1-1-a"], root) == "docs/stories/1-1-a.md"
    assert find_story_file(tree, "docs/stories", found["2-1-b"], root) == \
        "docs/stories/stories/epic-2/2-1-b.md"
    assert find_story_file(tree, "docs/stories", found["3-1-c"], root) == "docs/stories/story-3.1.md"
    assert story_file_matches(tree, "docs/stories", found["4-1-d"]) == ["docs/stories/4.1.v4-name.md"]
    assert find_story_file(tree, "docs/stories", found["4-2-e"], root) is None


def test_two_matching_files_are_an_error_naming_both(tmp_path):
    root = tmp_path / "r"
    git = git_repo(root, {"s/1-1-a.md": "x", "s/spec-1-1-a.md": "y"})
    tree = CommittedTree(git, git.rev("HEAD"))
    with pytest.raises(ConfigError, match=r"story 1-1-a: 2 story files .*s/1-1-a\.md and .*s/spec-1-1-a\.md"):
        find_story_file(tree, "s", entries("1-1-a: backlog")["1-1-a"], root)


@pytest.mark.parametrize("raw, expected, warned", [
    ("docs/stories", "docs/stories", False),
    ("{project-root}/docs/stories", "docs/stories", False),
    ("docs/not-yet", "docs/not-yet", False),  # inside: used as is, create writes there
    ("/home/other/proj/docs/stories", "docs/stories", True),
    ("C:\\Users\\x\\proj\\docs\\stories", "docs/stories", True),
    ("../proj/docs/stories", "docs/stories", True),
    ("{story_location}", None, True),
    ("/nowhere/at/all", None, True),
])
def test_story_location_is_used_or_resolved_by_its_longest_existing_suffix(repo, raw, expected, warned):
    root, _git, tree = repo
    rel, warning = resolve_location(raw, root, tree)
    assert rel == expected
    assert (warning is not None) == warned
    if warned:
        assert repr(raw) in warning


@pytest.mark.parametrize("written, status", [
    ("Draft", "draft"), ("", "draft"), (None, "draft"), ("Approved", "ready-for-dev"),
    ("InProgress", "in-progress"), ("In Progress", "in-progress"), ("Review", "review"),
    ("Ready for Review", "review"), ("Done", "done"), ("Completed", "done"), ("On Hold", "on-hold"),
])
def test_v4_statuses_map_to_the_vocabulary(written, status):
    assert v4_status(written) == status


def test_the_project_is_the_nearest_policy_folder_else_the_git_top_level(tmp_path):
    root = tmp_path / "r"
    git_repo(root, {"a/b/c.txt": "x"})
    assert find_project_root(root / "a" / "b") == root
    write(root / "a" / ".bmad-loop" / "policy.toml", "")
    assert find_project_root(root / "a" / "b") == root / "a"
    outside = tmp_path / "loose" / "x"
    outside.mkdir(parents=True)
    write(tmp_path / ".bmad-loop" / "policy.toml", "")  # above the repository: not its project
    assert find_project_root(root / "a" / "b") == root / "a"
    assert find_project_root(outside) == tmp_path
