"""A reused worktree is a new one: no index flag, no leftover of the story before it.

An agent can hide its edit of a tracked file from git (``update-index --skip-worktree`` or
``--assume-unchanged``; ``add -N`` marks a file intent-to-add). The story's commit must still
take the edit, and the next story that takes the parked worktree must find none of it: not the
flag, not the hidden content. Real runs through the CLI with a real agent program that runs
those git commands; the pool's `take` on its own for the kept folders (``[scm] reuse_keep``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from bmad_loop.engine.runpaths import Layout
from bmad_loop.engine.workspace.pool import park, parked, take
from bmad_loop.git.worktrees import delete_branch, ensure_worktree
from support import StoryDef, git, git_repo, write

RUN = '[scm]\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n[review]\nenabled = false\n'

# Records what its worktree looks like (flags, files) before it works, then does its plan:
# writes and appends files, then runs git commands in the worktree.
HOSTILE_AGENT = '''import json, os, subprocess, sys
from pathlib import Path
log, plan = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
key, wt = os.environ["BMAD_LOOP_STORY_KEY"], Path(os.environ["BMAD_LOOP_WORKTREE"])
def git(*args):
    return subprocess.run(["git", *args], cwd=wt, capture_output=True, text=True, check=True).stdout
seen = {"key": key,
        "admin": Path((wt / ".git").read_text().split(":", 1)[1].strip()).name,
        "flags": [l for l in git("ls-files", "-v").splitlines() if not l.startswith("H ")],
        "cached": git("diff", "--cached", "--name-only", "HEAD").split(),
        "readme": (wt / "README.md").read_text(),
        "readme_at_head": git("show", "HEAD:README.md"),
        "init": (wt / "src" / "__init__.py").read_text(),
        "init_at_head": git("show", "HEAD:src/__init__.py")}
with open(log, "a") as handle:
    handle.write(json.dumps(seen) + "\\n")
mine = plan.get(key, {})
for rel, text in mine.get("write", {}).items():
    (wt / rel).parent.mkdir(parents=True, exist_ok=True)
    (wt / rel).write_text(text)
for rel, text in mine.get("append", {}).items():
    with open(wt / rel, "a") as handle:
        handle.write(text)
for args in mine.get("git", []):
    git(*args)
'''

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py", "README.md"])
BETA = StoryDef("1-2-beta", files=["src/beta.py", "README.md"])
GAMMA = StoryDef("1-3-gamma", files=["src/gamma.py", "src/__init__.py"])
STORIES = [ALPHA, BETA, GAMMA]

PLAN = {
    # Hides its README edit behind skip-worktree (git sees the file as unchanged).
    ALPHA.key: {"write": {"src/alpha.py": "A = 1\n"}, "append": {"README.md": "alpha\n"},
                "git": [["update-index", "--skip-worktree", "README.md"]]},
    # Edits README as its footprint allows, and hides a second edit behind assume-unchanged.
    BETA.key: {"write": {"src/beta.py": "B = 1\n"}, "append": {"README.md": "beta\n",
                                                               "src/__init__.py": "# beta\n"},
               "git": [["update-index", "--assume-unchanged", "src/__init__.py"]]},
    # Marks its new file intent-to-add, and edits the file beta hid.
    GAMMA.key: {"write": {"src/gamma.py": "G = 1\n"}, "append": {"src/__init__.py": "# gamma\n"},
                "git": [["add", "-N", "src/gamma.py"]]},
}


def _hostile_repo(make_repo, tmp_path, scm: str = ""):
    agent, plan, log = tmp_path / "hostile.py", tmp_path / "plan.json", tmp_path / "seen.jsonl"
    agent.write_text(HOSTILE_AGENT)
    plan.write_text(json.dumps(PLAN))
    command = json.dumps([sys.executable, str(agent), str(log), str(plan)])
    repo = make_repo(STORIES, policy=RUN.replace("[scm]\n", "[scm]\n" + scm) + f"[adapter]\ncommand = {command}\ntimeout_s = 60\n")
    return repo, log


def test_edits_hidden_behind_index_flags_are_committed_and_never_reach_the_next_story(
        make_repo, tmp_path):
    """Fails before the fix: alpha's README edit was dropped by its commit (skip-worktree), the
    flag travelled with the parked worktree, and beta's README edit was dropped too."""
    repo, log = _hostile_repo(make_repo, tmp_path)
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    seen = {r["key"]: r for r in map(json.loads, log.read_text().splitlines())}
    # The pool was used: every story worked in the worktree alpha made.
    assert [seen[s.key]["admin"] for s in STORIES] == [ALPHA.key] * 3
    for story in STORIES:
        got = seen[story.key]
        # What each agent finds is a new worktree: no flag, nothing staged, files as committed.
        assert got["flags"] == [] and got["cached"] == [], got
        assert got["readme"] == got["readme_at_head"] and got["init"] == got["init_at_head"], got
    # Every edit landed, whatever flag the agent put on it.
    assert repo.git("show", "main:README.md") == "# test repo\nalpha\nbeta"
    assert repo.git("show", "main:src/__init__.py") == "# beta\n# gamma"
    assert repo.git("show", "main:src/gamma.py") == "G = 1"
    assert set(repo.board_status(s.key) for s in STORIES) == {"done"}


def test_reuse_worktrees_false_gives_every_story_a_new_worktree(make_repo, tmp_path):
    repo, log = _hostile_repo(make_repo, tmp_path, "reuse_worktrees = false\n")
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    seen = [json.loads(r) for r in log.read_text().splitlines()]
    assert [r["admin"] for r in seen] == [s.key for s in STORIES]  # each made by its own add
    assert repo.git("show", "main:README.md") == "# test repo\nalpha\nbeta"
    assert repo.worktrees() == [str(repo.root)]


# ------------------------------------------------------------------------------ take and keep
IGNORES = "/.venv/\n/node_modules\n/build/\n/sub/\n"


def _one_parked(tmp_path, spoil):
    """A repository with one story worktree spoiled by `spoil(worktree)` and parked."""
    repo = tmp_path / "repo"
    g = git_repo(repo, {"a.txt": "a\n", "src/b.txt": "b\n", ".gitignore": IGNORES})
    base = g.rev("HEAD")
    layout = Layout((repo / ".bmad-loop").resolve(), "r1")
    path, branch = layout.story_worktree("1-0-old"), layout.story_branch("1-0-old")
    ensure_worktree(g, path, branch, base, branch_head=None)
    spoil(path)
    assert park(g, path, branch, layout, size=1) is not None
    delete_branch(g, branch)
    return g, layout, base


def _take(g, layout, base, keep=()):
    path, branch = layout.story_worktree("1-1-new"), layout.story_branch("1-1-new")
    assert take(g, layout, path, branch, base, keep)
    return path


def _leftovers(path: Path) -> list[str]:
    return sorted(git(path, "status", "--porcelain", "--ignored", "--untracked-files=all")
                  .splitlines())


def test_a_take_clears_flags_and_hidden_edits_and_keeps_only_real_ignored_kept_folders(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()

    def spoil(wt):
        write(wt / "a.txt", "hidden\n")
        git(wt, "update-index", "--skip-worktree", "a.txt")
        write(wt / "src/b.txt", "hidden too\n")
        git(wt, "update-index", "--assume-unchanged", "src/b.txt")
        write(wt / ".venv/bin/tool", "#!/bin/sh\n")  # kept: ignored, a real folder
        write(wt / ".venv/.gitignore", "!*\n")       # planted inside a kept folder: kept with it
        write(wt / "build/stamp", "old\n")           # ignored, not kept: goes
        os.symlink(outside, wt / "node_modules")     # kept name, but a symlink: goes
        write(wt / "sub/.venv/x", "x\n")             # the pattern is anchored at the root: goes

    g, layout, base = _one_parked(tmp_path, spoil)
    path = _take(g, layout, base, keep=[".venv", "node_modules", "sub/nothing"])
    assert git(path, "ls-files", "-v").splitlines() == ["H .gitignore", "H a.txt", "H src/b.txt"]
    assert (path / "a.txt").read_text() == "a\n" and (path / "src/b.txt").read_text() == "b\n"
    assert _leftovers(path) == ["!! .venv/.gitignore", "!! .venv/bin/tool"]
    assert (outside.exists() and not os.path.lexists(path / "node_modules"))


def test_a_kept_folder_the_new_tree_does_not_ignore_goes_even_with_a_planted_gitignore(tmp_path):
    """`vendor` is kept by name, but the project does not ignore it: a `.gitignore` planted
    inside it makes git list it as ignored, yet it goes (the next agent would commit it)."""
    def spoil(wt):
        write(wt / "vendor/.gitignore", "*\n")
        write(wt / "vendor/evil.py", "print('planted')\n")

    g, layout, base = _one_parked(tmp_path, spoil)
    path = _take(g, layout, base, keep=["vendor"])
    assert _leftovers(path) == []


def test_a_read_only_leftover_makes_the_take_say_no_and_leaves_nothing(tmp_path):
    """Build output the next story cannot clean (a read-only folder): the take gives the
    worktree up, no branch is left, and the caller adds a new worktree."""
    def spoil(wt):
        write(wt / "build/cache/x", "x\n")
        os.chmod(wt / "build/cache", 0o500)

    g, layout, base = _one_parked(tmp_path, spoil)
    path, branch = layout.story_worktree("1-1-new"), layout.story_branch("1-1-new")
    ok = take(g, layout, path, branch, base)
    if ok:  # root can clean a read-only folder: then it is a clean take
        assert _leftovers(path) == []
    else:
        assert not path.exists() and g.rev(f"refs/heads/{branch}") is None
    assert parked(layout) == []
