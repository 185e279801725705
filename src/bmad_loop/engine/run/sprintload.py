"""Reading a project's sprint the way its agents will see it: from the committed target.

`load_sprint` finds the board (`bmad.locations`), reads it and the story files from the tree of the
target commit (`committed.CommittedTree`; without a target, e.g. `validate` in a folder git
cannot read, from the folder itself), and says where each came from and what it had to guess.
The BMAD configs, often untracked, come from the working copy. `check_committed` refuses a plan
whose board or story files have changes in the checkout that the target does not hold: agents
would work from other text than the plan, and every candidate writes the board.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...bmad.locations import BoardSource, find_board
from ...policy import env_override
from ...bmad.v4 import v4_board
from ...bmad.board import Board, load_board, parse_board
from ...git.trees.committed import CommittedTree, FolderTree
from ...errors import ConfigError
from ...bmad.footprint import footprint_from_mapping
from ...bmad.selection import StorySpec
from ...bmad.story_files import StoryFolder, load_stories, story_folder, uncommitted_plan_files
from .repocheck import check_story_dir

__all__ = ["Sprint", "load_sprint", "check_committed"]


@dataclass
class Sprint:
    board: Board
    source: BoardSource
    folder: StoryFolder
    stories: list[StorySpec]
    where: str  # what the files were read from
    warnings: list[str] = field(default_factory=list)


def _read_board(project, tree, source: BoardSource, branch: str) -> Board:
    if source.format == "v4":
        return v4_board(tree, source.story_folder or "", project.root)
    if source.rel is None:  # a policy sprint_status outside the repository: read where it is
        return load_board(source.path)
    if not tree.is_file(source.rel):
        if (project.root / source.rel).is_file():
            raise ConfigError(f"{source.path}: the sprint board is not committed on {branch} "
                              "(the plan is read from the committed target); commit it first")
        raise ConfigError(f"{source.path}: sprint status file not found ({source.reason})")
    return parse_board(tree.text(source.rel, "sprint status file", source.path), source.path)


def _overrides(policy, board: Board, problems: list[str] | None = None) -> dict:
    overrides = {k: {"files": list(v.files), "shared": list(v.shared), "resources": list(v.resources)}
                 for k, v in policy.footprints.overrides.items()}
    for key in list(overrides):
        problem = None
        if board.entry(key) is None:
            problem = f"{policy.source}: [footprints.\"{key}\"]: no such story on {board.path}"
        else:
            fp = footprint_from_mapping(overrides[key])
            if fp.reason and fp.reason.startswith("invalid"):
                problem = f"{policy.source}: [footprints.\"{key}\"]: {fp.reason}"
        if problem is not None:
            if problems is None:
                raise ConfigError(problem)
            problems.append(problem)
            del overrides[key]
    return overrides


def load_sprint(project, policy, target_sha: str | None = None, branch: str = "",
                problems: list[str] | None = None) -> Sprint:
    """The board and every story of it, read from the target commit `target_sha` (the folder
    on disk when None). A story file's or a footprint override's problem is a ConfigError, or
    with a `problems` list, a line appended to it (`validate`: every problem in one pass)."""
    if target_sha:
        tree = CommittedTree(project.git(policy), target_sha, branch)
    else:
        tree = FolderTree(project.root)
    named = env_override("stories", "sprint_status") or "policy [stories] sprint_status"
    source = find_board(project.root, tree, policy.stories.sprint_status, config_root=project.home,
                        named=named)
    board = _read_board(project, tree, source, branch).with_extra_keys(policy.stories.extra_keys)
    folder = story_folder(project.root, tree, board, source, policy.stories.story_dir,
                          config_root=project.home)
    check_story_dir(project, policy, folder.path)
    stories = load_stories(project.root, board, folder.rel if folder.rel is not None else folder.path,
                           _overrides(policy, board, problems), tree=tree, problems=problems)
    return Sprint(board, source, folder, stories, tree.where, list(folder.warnings))


def check_committed(project, policy, sprint: Sprint, chosen, branch: str) -> None:
    """ConfigError naming the board and chosen story files the checkout changed but the target
    does not hold. Only when the checkout has the target branch checked out: on another
    branch, its files are simply not the plan's."""
    git = project.git(policy)
    if git.current_branch() != branch:
        return
    changed = uncommitted_plan_files(git, sprint.source.rel, sprint.folder.rel, sprint.board,
                                     chosen)
    if changed:
        raise ConfigError(f"{project.root}: uncommitted changes to {', '.join(changed)}: the plan "
                          f"and the agents read the committed {branch}; commit them first")
