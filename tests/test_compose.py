"""Commits, composition, compare-and-swap and checkout sync, on real repositories."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from bmad_loop.git.trees.compose import (
    LaneEdit,
    blob_at,
    cas_advance,
    changed_paths,
    changed_status,
    commit_worktree,
    compose,
    dirty_paths,
    overlapping_dirty,
    path_matches,
    replace_blob,
)
from bmad_loop.git.targets.local import index_path
from bmad_loop.errors import GitError
from bmad_loop.git.runner import Git
from bmad_loop.git.targets.local import LocalTarget
from bmad_loop.git.worktrees import ensure_worktree
from support import git_repo

BOARD = "sprint-status.yaml"
A_PY = "".join(f"line {i}\n" for i in range(1, 11))

# HOME without git config: the autouse `isolated_home` fixture of conftest.py.

_clock = itertools.count(1_700_000_000, 60)


def commit(git: Git, cwd: Path, files: dict, message: str, author: tuple | None = None) -> str:
    """Write (or delete, for None) files in `cwd` and commit them at the next test-clock minute."""
    for name, text in files.items():
        path = cwd / name
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    git.run("add", "-A", cwd=cwd)
    env = git.identity_env(f"@{next(_clock)} +0100")
    if author:
        env.update(GIT_AUTHOR_NAME=author[0], GIT_AUTHOR_EMAIL=author[1], GIT_AUTHOR_DATE=author[2])
    git.run("commit", "-q", "--allow-empty", "-m", message, cwd=cwd, env=env)
    return git.rev("HEAD", cwd=cwd)


@pytest.fixture
def git(tmp_path) -> Git:
    """A real repository on `main`: a board, two sources, an executable, an ignore rule."""
    repo = tmp_path / "repo"
    g = git_repo(repo)
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    commit(g, repo, {
        "README": "hello\n",
        BOARD: "1-1-a: ready-for-dev\n1-2-b: backlog\n",
        "src/a.py": A_PY,
        "src/b.py": "b\n",
        ".gitignore": "*.log\n",
    }, "base")
    return g


@pytest.fixture
def story(git, tmp_path) -> Path:
    """The worktree of branch `story`, started from main."""
    wt = tmp_path / "wt"
    ensure_worktree(git, wt, "story", git.rev("main"))
    return wt


def parents(git: Git, sha: str) -> list[str]:
    return git.out("rev-list", "--parents", "-n1", sha).split()[1:]


def text_at(git: Git, rev: str, path: str) -> str | None:
    blob = blob_at(git, rev, path)
    return None if blob is None else blob.decode()


def board_edit(git: Git, text: str):
    return lambda tree: replace_blob(git, tree, BOARD, text.encode())


def a_with(line: int, text: str) -> str:
    lines = A_PY.splitlines(keepends=True)
    lines[line - 1] = text + "\n"
    return "".join(lines)


# -- reading -----------------------------------------------------------------------------------


def test_blob_at_reads_content_and_gives_none_for_a_missing_path(git):
    assert blob_at(git, "main", "src/b.py") == b"b\n"
    assert blob_at(git, "main", "nope.txt") is None
    with pytest.raises(GitError):
        blob_at(git, "0" * 40, "src/b.py")


def test_changed_paths_lists_both_sides_of_a_rename(git, story):
    base = git.rev("main")
    git.run("mv", "src/b.py", "src/c.py", cwd=story)
    head = commit(git, story, {"src/a.py": a_with(1, "x")}, "rename")
    assert changed_paths(git, base, head) == ["src/a.py", "src/b.py", "src/c.py"]
    assert changed_paths(git, base, base) == []


def test_dirty_paths_sees_modified_staged_deleted_untracked_and_renamed_but_not_ignored(git, story):
    (story / "README").write_text("changed\n")
    (story / "src/new").mkdir()
    (story / "src/new/n.py").write_text("n\n")
    (story / "staged.txt").write_text("s\n")
    git.run("add", "staged.txt", cwd=story)
    (story / "run.sh").unlink()
    git.run("mv", "src/b.py", "src/moved.py", cwd=story)
    (story / "build.log").write_text("ignored\n")
    assert dirty_paths(git, story) == {
        "README", "src/new/n.py", "staged.txt", "run.sh", "src/b.py", "src/moved.py"
    }


def test_replace_blob_makes_a_new_tree_and_touches_no_index_or_worktree(git):
    tree = git.out("rev-parse", "main^{tree}")
    edited = replace_blob(git, tree, BOARD, b"1-1-a: done\n")
    assert text_at(git, edited, BOARD) == "1-1-a: done\n"
    assert text_at(git, tree, BOARD) == "1-1-a: ready-for-dev\n1-2-b: backlog\n"
    assert changed_paths(git, tree, edited) == [BOARD]
    exec_kept = replace_blob(git, tree, "run.sh", b"#!/bin/sh\necho\n")
    assert git.out("ls-tree", exec_kept, "run.sh").split()[0] == "100755"
    nested = replace_blob(git, tree, "docs/deep/new.md", b"new\n")
    assert text_at(git, nested, "docs/deep/new.md") == "new\n"
    removed = replace_blob(git, tree, "src/b.py", None)
    assert blob_at(git, removed, "src/b.py") is None
    assert git.out("status", "--porcelain") == ""


@pytest.mark.parametrize(
    "globs, path, expected",
    [
        ([BOARD], BOARD, True),
        ([BOARD], f"_bmad-output/impl/{BOARD}", True),  # no slash: any depth
        (["/sprint-status.yaml"], f"x/{BOARD}", False),  # leading slash: anchored
        (["docs/*.md"], "docs/a.md", True),
        (["docs/*.md"], "docs/x/a.md", False),  # * does not cross /
        (["docs/*.md"], "x/docs/a.md", False),  # middle slash: anchored
        (["docs/**/*.md"], "docs/a.md", True),
        (["docs/**/*.md"], "docs/x/y/a.md", True),
        (["**/ledger.md"], "a/b/ledger.md", True),
        (["ledger/**"], "ledger/x/y", True),
        (["ledger/**"], "ledger", False),
        (["ledger/"], "ledger/x", True),
        (["ledger/"], "ledger", False),
        (["ledger"], "a/ledger/x", True),  # a matched folder matches what is inside
        (["stat?s.yaml"], "status.yaml", True),
        (["[ab].txt"], "b.txt", True),
        (["[!ab].txt"], "b.txt", False),
        (["a.txt", "b.txt"], "b.txt", True),
        ([], "b.txt", False),
    ],
)
def test_path_matches_follows_gitignore_rules_from_the_repository_root(globs, path, expected):
    assert path_matches(globs, path) is expected


# -- the worker's commit -----------------------------------------------------------------------


def test_commit_worktree_reverts_lane_owned_files_and_commits_the_rest(git, story):
    base = git.rev("main")
    commit(git, story, {BOARD: "1-1-a: done\n", "src/a.py": a_with(1, "agent")}, "agent commit")
    (story / BOARD).write_text("1-1-a: review\n")  # edited again, uncommitted
    (story / "ledger").mkdir()
    (story / "ledger/notes.md").write_text("agent made this\n")  # lane-owned, absent in base
    (story / "src/new.py").write_text("new\n")
    head, reverted = commit_worktree(git, story, "1-1-a: A", base, [BOARD, "ledger/**"])
    assert reverted == ["ledger/notes.md", BOARD]
    assert changed_paths(git, base, head) == ["src/a.py", "src/new.py"]
    assert text_at(git, head, "src/a.py") == a_with(1, "agent")
    assert (story / BOARD).read_text() == text_at(git, base, BOARD)
    assert not (story / "ledger/notes.md").exists()
    assert git.out("log", "-1", "--format=%s|%an|%cn", head) == "1-1-a: A|bmad-loop|bmad-loop"
    assert dirty_paths(git, story) == set()


def test_commit_worktree_with_nothing_to_commit_leaves_head_alone(git, story):
    base = git.rev("main")
    head, reverted = commit_worktree(git, story, "msg", base, [BOARD])
    assert (head, reverted) == (base, [])
    (story / BOARD).write_text("edited\n")
    head, reverted = commit_worktree(git, story, "msg", base, [BOARD])
    assert (head, reverted) == (base, [BOARD])


def test_commit_worktree_leaves_excluded_seed_files_out_of_the_commit(git, story):
    base = git.rev("main")
    (story / ".env").write_text("SECRET=1\n")
    (story / "src/a.py").write_text("changed\n")
    head, _ = commit_worktree(git, story, "msg", base, exclude=[".env"])
    assert changed_paths(git, base, head) == ["src/a.py"]
    assert dirty_paths(git, story) == {".env"}


# -- composition -------------------------------------------------------------------------------


@pytest.fixture
def diverged(git, story):
    """A story that changed src/a.py line 1, and a target that meanwhile changed src/b.py."""
    base = git.rev("main")
    branch = commit(git, story, {"src/a.py": a_with(1, "story")}, "story work")
    target = commit(git, git.repo_dir, {"src/b.py": "target\n"}, "target moved")
    return base, target, branch


def test_merge_composes_a_merge_commit_of_target_and_branch(git, diverged):
    _, target, branch = diverged
    c = compose(git, "merge", target, branch, "1-1-a: A")
    assert c.ok and c.conflicts == () and c.strategy == "merge" and not c.rebased
    assert parents(git, c.sha) == [target, branch]
    assert git.out("rev-parse", f"{c.sha}^{{tree}}") == c.tree
    assert text_at(git, c.sha, "src/a.py") == a_with(1, "story")
    assert text_at(git, c.sha, "src/b.py") == "target\n"
    assert git.out("log", "-1", "--format=%B", c.sha) == "1-1-a: A"
    who = git.out("log", "-1", "--format=%an <%ae>|%cn|%ad|%cd", "--date=raw", c.sha)
    date = git.commit_date(branch).lstrip("@")
    assert who == f"bmad-loop <bmad-loop@localhost>|bmad-loop|{date}|{date}"
    assert git.rev("main") == target  # no ref moved


def test_squash_composes_one_commit_on_target_with_the_merged_tree(git, diverged):
    _, target, branch = diverged
    merged = compose(git, "merge", target, branch, "m")
    c = compose(git, "squash", target, branch, "1-1-a: A")
    assert parents(git, c.sha) == [target]
    assert c.tree == merged.tree
    assert git.out("log", "-1", "--format=%B", c.sha) == "1-1-a: A"


def test_merge_and_squash_fold_the_tree_edit_into_their_commit(git, diverged):
    _, target, branch = diverged
    for strategy in ("merge", "squash"):
        c = compose(git, strategy, target, branch, "m",
                    edit=LaneEdit(board_edit(git, "1-1-a: done\n")))
        assert text_at(git, c.sha, BOARD) == "1-1-a: done\n"
        assert text_at(git, c.sha, "src/a.py") == a_with(1, "story")
        assert parents(git, c.sha)[0] == target


def test_ff_on_an_unmoved_target_is_the_branch_head_itself(git, story):
    target = git.rev("main")
    branch = commit(git, story, {"src/a.py": a_with(1, "story")}, "story work")
    c = compose(git, "ff", target, branch, "unused")
    assert (c.sha, c.rebased, c.strategy) == (branch, False, "ff")


def test_ff_puts_the_tree_edit_in_one_lane_commit_on_top_of_the_branch(git, story):
    target = git.rev("main")
    branch = commit(git, story, {"src/a.py": a_with(1, "story")}, "story work")
    c = compose(git, "ff", target, branch, "unused",
                edit=LaneEdit(board_edit(git, "1-1-a: done\n"), "bmad-loop: 1-1-a done"))
    assert parents(git, c.sha) == [branch]
    assert git.out("log", "-1", "--format=%B", c.sha) == "bmad-loop: 1-1-a done"
    assert changed_paths(git, branch, c.sha) == [BOARD]
    assert not c.rebased
    same = compose(git, "ff", target, branch, "unused",
                   edit=LaneEdit(lambda tree: tree, "nothing to do"))
    assert same.sha == branch  # an edit that changes nothing makes no lane commit


def test_ff_on_a_moved_target_replays_the_story_commits_keeping_authors_and_messages(git, story):
    base = git.rev("main")
    alice = ("Alice", "alice@example.org", "@1600000000 -0500")
    first = commit(git, story, {"src/a.py": a_with(1, "story")}, "first\n\nbody", author=alice)
    second = commit(git, story, {"src/new.py": "new\n"}, "second")
    target = commit(git, git.repo_dir, {"src/a.py": a_with(10, "target")}, "target moved")
    c = compose(git, "ff", target, second, "unused", edit=LaneEdit(board_edit(git, "done\n"), "lane"))
    assert c.ok and c.rebased
    lane, r2 = c.sha, parents(git, c.sha)[0]
    r1 = parents(git, r2)[0]
    assert parents(git, r1) == [target]
    assert git.out("log", "-1", "--format=%B", lane) == "lane"
    assert git.out("log", "-1", "--format=%B", r2) == "second"
    assert git.out("log", "-1", "--format=%B", r1) == "first\n\nbody"
    fmt = "--format=%an|%ae|%ad|%cn|%ce|%cd"
    assert git.out("log", "-1", fmt, "--date=raw", r1) == (
        f"Alice|alice@example.org|1600000000 -0500|bmad-loop|bmad-loop@localhost|"
        f"{git.commit_date(first).lstrip('@')}"
    )
    assert text_at(git, c.sha, "src/a.py") == a_with(10, "target").replace("line 1\n", "story\n", 1)
    assert text_at(git, c.sha, "src/new.py") == "new\n"
    assert text_at(git, c.sha, BOARD) == "done\n"
    assert git.is_ancestor(target, c.sha) and not git.is_ancestor(second, c.sha)
    assert base != target


def test_ff_replay_drops_a_commit_whose_change_is_already_on_the_target(git, story):
    commit(git, story, {"src/b.py": "same\n"}, "already upstream")
    branch = commit(git, story, {"src/new.py": "new\n"}, "story work")
    target = commit(git, git.repo_dir, {"src/b.py": "same\n", "README": "moved\n"}, "target")
    c = compose(git, "ff", target, branch, "unused")
    assert parents(git, c.sha) == [target]
    assert git.out("log", "-1", "--format=%s", c.sha) == "story work"


def test_ff_replay_that_conflicts_reports_the_paths(git, story):
    commit(git, story, {"src/new.py": "new\n"}, "clean step")
    branch = commit(git, story, {"src/a.py": a_with(5, "story")}, "conflicting step")
    target = commit(git, git.repo_dir, {"src/a.py": a_with(5, "target")}, "target")
    c = compose(git, "ff", target, branch, "unused")
    assert (c.sha, c.conflicts, c.rebased, c.ok) == (None, ("src/a.py",), True, False)
    assert b"<<<<<<<" in blob_at(git, c.tree, "src/a.py")


def test_merge_conflicts_report_every_conflicted_path_and_keep_the_marked_tree(git, story):
    branch = commit(git, story, {"src/a.py": a_with(5, "story"), "src/b.py": "story\n"}, "s")
    target = commit(git, git.repo_dir, {"src/a.py": a_with(5, "target"), "src/b.py": None}, "t")
    for strategy in ("merge", "squash"):
        c = compose(git, strategy, target, branch, "m", edit=LaneEdit(board_edit(git, "never\n")))
        assert c.sha is None and sorted(c.conflicts) == ["src/a.py", "src/b.py"]
        assert b"<<<<<<<" in blob_at(git, c.tree, "src/a.py")
        assert text_at(git, c.tree, BOARD) != "never\n"


def test_composing_the_same_inputs_twice_gives_the_same_sha(git, story):
    commit(git, story, {"src/a.py": a_with(1, "story")}, "one")
    branch = commit(git, story, {"src/new.py": "new\n"}, "two")
    target = commit(git, git.repo_dir, {"src/a.py": a_with(10, "target")}, "target")
    cases = [("merge", target), ("squash", target), ("ff", target), ("ff", git.rev("story~2"))]
    first = [compose(git, s, t, branch, "m", edit=LaneEdit(board_edit(git, "done\n"), "lane")) for s, t in cases]
    time.sleep(1.1)  # the wall clock moves on; the lane's dates come from the inputs
    again = [compose(git, s, t, branch, "m", edit=LaneEdit(board_edit(git, "done\n"), "lane")) for s, t in cases]
    assert [c.sha for c in first] == [c.sha for c in again]
    assert len({c.sha for c in first}) == len(cases)
    assert all(c.ok for c in first)


def test_an_unknown_strategy_is_a_value_error(git):
    with pytest.raises(ValueError, match="rebase"):
        compose(git, "rebase", "main", "main", "m")


# -- advancing the target ----------------------------------------------------------------------


def test_cas_advance_moves_the_ref_refuses_when_it_moved_and_is_idempotent(git, diverged):
    base, target, branch = diverged
    c = compose(git, "merge", target, branch, "m")
    assert cas_advance(git, "main", c.sha, target) is True
    assert git.rev("main") == c.sha
    assert cas_advance(git, "main", c.sha, target) is True  # already there
    assert "bmad-loop: advance" in git.out("reflog", "-1", "--format=%gs", "refs/heads/main")
    stale = compose(git, "squash", target, branch, "s")
    assert cas_advance(git, "main", stale.sha, target) is False  # main is no longer `target`
    assert git.rev("main") == c.sha


def test_the_held_checkout_follows_a_composed_advance_with_its_board_edit(git, story):
    target = LocalTarget(git, "main")
    checkout = git.repo_dir  # main is checked out here
    old = git.rev("main")
    branch = commit(git, story, {"src/a.py": a_with(1, "story"), "src/new.py": "n\n",
                                 "src/b.py": None}, "story")
    (checkout / "README").write_text("local edit\n")
    (checkout / "notes.txt").write_text("staged note\n")
    git.run("add", "notes.txt")
    c = compose(git, "merge", old, branch, "m", edit=LaneEdit(board_edit(git, "done\n")))
    with target.checkout_held():
        assert overlapping_dirty(git, checkout, old, c.sha) == []
        assert target.advance(c.sha, old)
        target.sync_checkout(checkout, old, c.sha)
        assert (checkout / "src/a.py").read_text() == a_with(1, "story")
        assert (checkout / "src/new.py").exists() and not (checkout / "src/b.py").exists()
        assert (checkout / BOARD).read_text() == "done\n"
        assert (checkout / "README").read_text() == "local edit\n"
        assert git.out("diff", "--cached", "--name-only") == "notes.txt"
        target.sync_checkout(checkout, old, c.sha)  # a lane resumed after a crash may sync again
    assert dirty_paths(git, checkout) == {"README", "notes.txt"}
    assert (checkout / "src/a.py").read_text() == a_with(1, "story")


def test_overlapping_dirty_reports_local_changes_the_advance_would_touch(git, story):
    checkout = git.repo_dir
    old = git.rev("main")
    (story / "gen.log").write_text("tracked in the story\n")
    git.run("add", "-f", "gen.log", cwd=story)
    new = commit(git, story, {"src/a.py": a_with(1, "story"), "src/new.py": "n\n",
                              "lib/x.py": "x\n"}, "story")
    (checkout / "src/a.py").write_text("dirty overlap\n")
    (checkout / "src/new.py").write_text("untracked in the way\n")
    (checkout / "gen.log").write_text("ignored but would be overwritten\n")
    (checkout / "lib").write_text("a file where a folder must go\n")
    (checkout / "README").write_text("unrelated\n")
    expected = ["gen.log", "lib", "src/a.py", "src/new.py"]
    assert overlapping_dirty(git, checkout, old, new) == expected


def test_the_held_checkout_refuses_to_follow_a_branch_that_was_not_advanced(git, story):
    target = LocalTarget(git, "main")
    old = git.rev("main")
    new = commit(git, story, {"src/b.py": "changed\n"}, "story")
    with target.checkout_held() as checkout:
        with pytest.raises(GitError, match="not on the advanced branch"):
            target.sync_checkout(checkout, old, new)  # main was never advanced
    assert (git.repo_dir / "src/b.py").read_text() == "b\n"


def test_commit_worktree_without_an_agent_commit_commits_all_but_the_reverted_files(git, story):
    base = git.rev("main")
    (story / BOARD).write_text("1-1-a: done\n")  # lane-owned, uncommitted
    (story / "src/b.py").unlink()
    (story / "src/new.py").write_text("new\n")
    head, reverted = commit_worktree(git, story, "msg", base, [BOARD])
    assert reverted == [BOARD]
    assert head != base and parents(git, head) == [base]
    assert changed_status(git, base, head) == {"src/b.py": "D", "src/new.py": "A"}
    assert dirty_paths(git, story) == set()


@pytest.mark.parametrize("agent_commits", [False, True])
def test_the_story_s_changes_known_from_its_commit_are_what_git_diffs(git, story, agent_commits):
    base = git.rev("main")
    if agent_commits:
        commit(git, story, {BOARD: "1-1-a: done\n", "src/a.py": a_with(3, "c")}, "agent")
    (story / BOARD).write_text("1-1-a: review\n")
    (story / "src/b.py").unlink()
    (story / "ledger").mkdir()
    (story / "ledger/x.md").write_text("lane-owned, new\n")
    head, _ = commit_worktree(git, story, "msg", base, [BOARD, "ledger/**"])
    raw = git.out("diff-tree", "-r", "-z", "--name-status", "--no-renames", base, head)
    fields = raw.split("\0")
    diffed = {fields[i + 1]: fields[i] for i in range(0, len(fields) - 1, 2)}
    assert changed_status(git, base, head) == diffed
    assert list(changed_status(git, base, head)) == list(diffed)


def test_changed_status_names_each_path_s_change_and_answers_a_pair_again_alike(git, story):
    base = git.rev("main")
    git.run("rm", "-q", "run.sh", cwd=story)
    head = commit(git, story, {"src/a.py": a_with(2, "x"), "src/new.py": "n\n"}, "s")
    expected = {"run.sh": "D", "src/a.py": "M", "src/new.py": "A"}
    assert changed_status(git, base, head) == expected
    again = changed_status(git, base, head)
    assert again == expected and changed_paths(git, base, head) == sorted(expected)
    again["x"] = "A"  # a caller's copy: the next answer is unchanged
    assert changed_status(git, base, head) == expected
    assert changed_status(git, head, base) == {"run.sh": "A", "src/a.py": "M", "src/new.py": "D"}


def test_the_held_checkout_follows_the_advance_and_keeps_unrelated_local_changes(git, story):
    target = LocalTarget(git, "main")
    old = git.rev("main")
    new = commit(git, story, {"src/a.py": a_with(1, "story"), "src/new.py": "n\n",
                              "src/b.py": None}, "story")
    checkout = git.repo_dir
    (checkout / "README").write_text("local edit\n")
    (checkout / "notes.txt").write_text("staged note\n")
    git.run("add", "notes.txt")
    assert index_path(git, checkout) == Path(
        git.out("rev-parse", "--path-format=absolute", "--git-path", "index"))
    with target.checkout_held() as held:
        assert held == checkout
        assert overlapping_dirty(git, checkout, old, new) == []
        assert target.advance(new, old)
        target.sync_checkout(checkout, old, new)
        target.sync_checkout(checkout, old, new)  # idempotent: a resumed lane syncs again
    assert (checkout / "src/a.py").read_text() == a_with(1, "story")
    assert (checkout / "src/new.py").exists() and not (checkout / "src/b.py").exists()
    assert (checkout / "README").read_text() == "local edit\n"
    assert dirty_paths(git, checkout) == {"README", "notes.txt"}
    assert git.out("diff", "--cached", "--name-only") == "notes.txt"


def test_a_linked_worktree_s_index_is_its_own(git, story):
    assert index_path(git, story) == Path(
        git.out("rev-parse", "--path-format=absolute", "--git-path", "index", cwd=story))


def test_the_worker_s_commit_date_known_here_is_the_one_git_stored(git, story):
    from bmad_loop.git.trees.compose import _commit_date

    base = git.rev("main")
    (story / "src/new.py").write_text("new\n")
    head, _ = commit_worktree(git, story, "msg", base, [BOARD])
    assert _commit_date(git, head) == git.commit_date(head)
    assert git.out("log", "-1", "--format=%ad|%cd", "--date=raw", head).split("|") == \
        [git.commit_date(head)[1:]] * 2
