"""Checks of the repository a run would work in, made before anything is written.

Each refuses with one `ConfigError` line naming the folder, the policy key or the file:

- `not_a_checkout`: why `git rev-parse --show-toplevel` found no working tree: a bare repository
  (bmad-loop needs a checkout), or no repository at all;
- `check_checkout`: `init`'s refusal of such a folder, saying how to make one;
- `check_has_commits`: an empty repository (no commit yet), where no branch can be a target;
- `check_story_dir`: `[stories] story_dir` outside the repository (story files are read, and
  handed to agents, inside each story's worktree);
- `check_agent`: the agent's argv[0]. A name without a slash is looked up on PATH. A relative
  path with a slash is run from each story's worktree, which is made from the target commit, so
  it must be committed there (executable), or be copied in by `[scm] worktree_seed`; when the
  agent runs in the checkout itself (no worktrees) it must exist there.
"""

from __future__ import annotations

import posixpath
from pathlib import Path, PurePosixPath

from ...agents.adapter import check_binary
from ...errors import ConfigError
from ..runs import path_inside

__all__ = ["check_agent", "check_checkout", "check_has_commits", "check_story_dir", "not_a_checkout"]

_EXECUTABLE_MODES = ("100755", "120000")  # an executable file, or a symlink


def not_a_checkout(root: Path, git) -> ConfigError:
    """The error for a folder where git finds no working tree."""
    proc = git.run("rev-parse", "--is-bare-repository", check=False)
    if proc.returncode == 0 and proc.stdout.strip() == "true":
        return ConfigError(f"{root}: a bare repository (no working tree); bmad-loop needs a "
                           "checkout: clone it and run bmad-loop in the clone")
    return ConfigError(f"{root}: not a git repository")


def check_checkout(project) -> None:
    """`init` refuses a folder where git finds no working tree, before anything is written."""
    git = project.git()
    if git.toplevel() is None:
        raise ConfigError(f"{not_a_checkout(project.root, git)}; run `git init` (or clone the "
                          "repository) first, then `bmad-loop init` in it")


def check_has_commits(root: Path, git, branch: str) -> None:
    """Refuse an empty repository by name; a missing branch is the caller's message."""
    proc = git.run("for-each-ref", "--count=1", "--format=%(refname)", "refs/heads", check=False)
    if proc.returncode == 0 and not proc.stdout.strip() and git.rev("HEAD") is None:
        raise ConfigError(f"{root}: an empty repository (no commits yet, branch '{branch}' is "
                          "unborn); commit the sprint board and story files first")


def check_story_dir(project, policy, story_dir: Path) -> None:
    value = policy.stories.story_dir
    if value and path_inside(story_dir, project.root) is None:
        raise ConfigError(f"{policy.source}: [stories] story_dir: {value!r} is outside the "
                          f"repository {project.root} (story files must be in the repository)")


def _seeded(rel: str, seeds) -> bool:
    path = PurePosixPath(rel)
    return any(path == PurePosixPath(seed) or PurePosixPath(seed) in path.parents for seed in seeds)


def check_agent(argv0: str, source: str, *, project=None, policy=None,
                target_sha: str | None = None, from_checkout: bool = False) -> None:
    """Check the agent binary where it will run (see the module docstring). `from_checkout`:
    the agent runs in the project's own checkout, not in worktrees."""
    is_relative_path = "/" in argv0 and not argv0.startswith("/")
    if project is None or policy is None or not is_relative_path:
        check_binary(argv0, source)
        return
    rel = posixpath.normpath(argv0)
    if rel == ".." or rel.startswith("../"):
        raise ConfigError(f"{source} command: agent '{argv0}' is outside the worktree it runs "
                          "in; give an absolute path or a name on PATH")
    if from_checkout or _seeded(rel, policy.scm.worktree_seed):
        check_binary(argv0, source, cwd=project.root)
        return
    if target_sha is None:  # no target to look in (validate: the git check failed already)
        return
    git = project.git(policy)
    proc = git.run("ls-tree", target_sha, "--", rel, check=False)
    fields = proc.stdout.split() if proc.returncode == 0 else []
    if not fields or fields[1] != "blob":
        raise ConfigError(f"{source} command: agent '{argv0}' is not committed on the target "
                          "branch, and each story runs it from its own worktree made from "
                          "there: commit it, list it in [scm] worktree_seed, or give an "
                          "absolute path or a name on PATH")
    if fields[0] not in _EXECUTABLE_MODES:
        raise ConfigError(f"{source} command: agent '{argv0}' is committed without its "
                          f"executable bit (mode {fields[0]}; git update-index --chmod=+x)")
