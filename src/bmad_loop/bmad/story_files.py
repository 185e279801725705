"""Story files: which folder holds them, which file is a story's, and what it says.

**The story folder** (one per project), the first that applies:

1. the policy's `[stories] story_dir` (it must be inside the repository: `repocheck`);
2. the board's `story_location`. Relative, or absolute inside the repository (`{project-root}`
   substituted), it is used as it is. Absolute elsewhere, a Windows path
   (`C:\\Users\\x\\proj\\docs\\stories`), outside the repository, or the template's own
   `{story_location}`: the longest path suffix of it that is a folder of the committed target
   (`docs/stories`), with a warning; when no suffix is, a warning, and the steps below apply;
3. the story folder a BMAD config names (`dev_story_location`, `story_location`; older
   installs) or, for a v4 project, its `devStoryLocation`;
4. the board's own folder.

**A story's file** in that folder `F`, for a key `K` of epic `E` and number `S` (`1-12a-x`:
E `1`, S `12a`), every one of these names is looked for, in this order:

1. `F/K.md`                       BMAD v6
2. `F/stories/K.md`
3. `F/stories/epic-E/K.md`, `F/epic-E/K.md`
4. `F/spec-K.md`
5. `F/story-E.S.md`
6. `F/E.S.md`, then `F/E.S.<anything>.md` (v4-style names)

Exactly one match is the story's file; two are an error naming both (keep one). None: the story
has no file yet, and `StorySpec.story_path` is `F/K.md`, where the create phase writes it.
Keys outside the story grammar (extras) look only for names 1, 2 and 4.

Everything is read from a tree (`committed.CommittedTree`: the committed target), never from
the working copy, so the plan is what the agents will see; `uncommitted_plan_files` names the
working-copy changes that would make them differ.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .board import Board, BoardEntry
from ..git.trees.committed import FolderTree, TreeView, uncommitted
from ..errors import ConfigError
from .footprint import Footprint, footprint_from_mapping
from .selection import StorySpec
from .story_meta import parse_story_text

__all__ = ["StoryFolder", "story_folder", "story_file_matches", "find_story_file",
           "load_stories", "uncommitted_plan_files", "resolve_location"]

_FOREIGN_RE = re.compile(r"^[A-Za-z]:[\\/]|\\")  # a Windows path: a drive, or backslashes
_NUMBER_RE = re.compile(r"^(\d+[a-z]?)(?:[-.]|$)")


@dataclass(frozen=True)
class StoryFolder:
    """The repository-relative story folder ("" = the root), why, and what to warn about."""

    rel: str | None  # None: a policy story_dir outside the repository (refused by repocheck)
    path: Path
    reason: str
    warnings: tuple[str, ...] = ()


def resolve_location(raw: str, root: Path, tree) -> tuple[str | None, str | None]:
    """A board's `story_location` as a repository-relative folder, and a warning when it had
    to be guessed (see the module docstring); (None, warning) when it resolves nowhere."""
    value = raw.strip().replace("{project-root}", str(root))
    if "{" not in value and not _FOREIGN_RE.search(value):
        path = value if os.path.isabs(value) else os.path.join(root, value)
        rel = os.path.relpath(os.path.normpath(path), root)
        if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            rel = Path(rel).as_posix()
            return ("" if rel == "." else rel), None
    parts = [p for p in re.split(r"[\\/]+", value)
             if p and p not in (".", "..") and "{" not in p and not re.fullmatch(r"[A-Za-z]:", p)]
    for i in range(len(parts)):
        suffix = "/".join(parts[i:])
        if tree.is_dir(suffix):
            return suffix, (f"story_location {raw!r} is not a folder of this repository; "
                            f"using {suffix}, the longest part of it that is")
    return None, (f"story_location {raw!r} names no folder of this repository; story files "
                  "are looked for in the default folder")


def story_folder(root: Path, tree, board: Board, source, story_dir: str = "",
                 config_root: Path | None = None) -> StoryFolder:
    """The project's story folder (see the module docstring). `source` is the board's
    `bmadlayout.BoardSource`; BMAD configs are read under `config_root` (default `root`)."""
    from .layout import config_story_folder, repo_relative

    root = Path(root)
    if story_dir.strip():
        value = story_dir.strip().replace("{project-root}", str(root))
        rel = repo_relative(value, root)
        path = root / rel if rel is not None else Path(value)
        return StoryFolder(rel, path, "policy [stories] story_dir")
    warnings = []
    if board.story_location and board.story_location.strip():
        rel, warning = resolve_location(board.story_location, root, tree)
        warnings += [f"{board.path}: {warning}"] if warning else []
        if rel is not None:
            return StoryFolder(rel, root / rel, "the board's story_location", tuple(warnings))
    if source.story_folder is not None:
        return StoryFolder(source.story_folder, root / source.story_folder,
                           f"{source.config}", tuple(warnings))
    named = config_story_folder(root, Path(config_root or root)) if source.format == "v6" else None
    if named is not None:
        return StoryFolder(named[1], root / named[1], f"{named[0]}", tuple(warnings))
    rel = posixpath.dirname(source.rel) if source.rel else None
    path = root / rel if rel is not None else Path(board.path).parent
    return StoryFolder(rel, path, "beside the board", tuple(warnings))


def _epic_and_number(entry: BoardEntry) -> tuple[str | None, str | None]:
    epic = entry.epic
    if entry.kind == "extra" or not epic or not entry.key.startswith(epic):
        return None, None
    m = _NUMBER_RE.match(entry.key[len(epic) + 1:])
    return (epic, m.group(1)) if m and entry.key[len(epic)] in "-." else (None, None)


def story_file_matches(tree: TreeView, folder: str, entry: BoardEntry) -> list[str]:
    """Every file of `tree` in `folder` that could be `entry`'s story file, in search order."""
    key = entry.key
    epic, number = _epic_and_number(entry)
    names = [f"{key}.md", f"stories/{key}.md"]
    if epic:
        names += [f"stories/epic-{epic}/{key}.md", f"epic-{epic}/{key}.md"]
    names.append(f"spec-{key}.md")
    if epic and number:
        names += [f"story-{epic}.{number}.md", f"{epic}.{number}.md"]
    found = [rel for rel in (posixpath.join(folder, n) for n in names) if tree.is_file(rel)]
    if epic and number:
        prefix = f"{epic}.{number}."
        found += [posixpath.join(folder, n) for n in tree.names(folder)
                  if n.startswith(prefix) and n.endswith(".md")]
    return list(dict.fromkeys(found))


def find_story_file(tree: TreeView, folder: str, entry: BoardEntry, root: Path) -> str | None:
    """`entry`'s story file (repository-relative), None when it has none; two matches are a
    ConfigError naming both."""
    found = story_file_matches(tree, folder, entry)
    if len(found) > 1:
        raise ConfigError(f"story {entry.key}: {len(found)} story files match it: "
                          f"{' and '.join(str(Path(root) / f) for f in found)}; keep one")
    return found[0] if found else None


def _title_from_entry(entry: BoardEntry) -> str:
    words = (entry.slug or entry.key).replace("-", " ").replace("_", " ").strip()
    return words[:1].upper() + words[1:] if words else entry.key


def _folder_rel(project_dir: Path, story_dir) -> str | None:
    if isinstance(story_dir, str) and not os.path.isabs(story_dir):
        rel = posixpath.normpath(story_dir) if story_dir else ""
        return "" if rel == "." else rel
    from .layout import repo_relative

    return repo_relative(os.path.abspath(story_dir), Path(os.path.abspath(project_dir)))


def load_stories(
    project_dir: Path,
    board: Board,
    story_dir: Path | str,
    overrides: Mapping[str, Mapping] | None = None,
    *,
    tree: TreeView | None = None,
    problems: list[str] | None = None,
) -> list[StorySpec]:
    """Every story of the board, in file order, with its story file's metadata.

    `story_dir` is the story folder (a path, or repository-relative); `tree` where files are
    read (default: the folder on disk). A policy override (`overrides[key]`, a `{files,
    shared, resources}` mapping) replaces the story's own footprint. The story file's own path
    is always added to `footprint.files`. A metadata error in a story file is a ConfigError
    naming the file; given a `problems` list, each one is appended there instead (one line,
    naming the file) and the story read as if it had no metadata, its footprint invalid, so
    `validate` reports every problem in one pass.
    """
    project_dir = Path(project_dir)
    tree = tree if tree is not None else FolderTree(project_dir)
    folder = _folder_rel(project_dir, story_dir)
    overrides = overrides or {}
    entries = board.stories()
    found = {e.key: _story_file_or_problem(tree, folder, e, project_dir, problems)
             for e in entries}
    texts = tree.read_many([rel for rel in found.values() if rel])
    specs: list[StorySpec] = []
    for position, entry in enumerate(entries):
        rel = found[entry.key]
        story_path = rel or (posixpath.join(folder, f"{entry.key}.md") if folder is not None else None)
        story_file = project_dir / rel if rel else None
        meta, failed = _story_meta(story_file, texts[rel], problems) if rel else (None, False)
        footprint = meta.footprint if meta else \
            Footprint(reason="invalid: the story file's metadata" if failed else "missing")
        if entry.key in overrides:
            footprint = footprint_from_mapping(overrides[entry.key])
        if story_path is not None:
            # anchor it: a bare file name would otherwise match at any depth
            footprint = footprint.with_files(story_path if "/" in story_path else "/" + story_path)
        specs.append(StorySpec(
            key=entry.key, epic=entry.epic or "", status=entry.status,
            title=(meta.title if meta else None) or _title_from_entry(entry),
            story_file=story_file, story_path=story_path, footprint=footprint,
            depends_on=meta.depends_on if meta else (),
            merge_class=meta.merge_class if meta else None, tier=meta.tier if meta else None,
            done_checkpoint=meta.done_checkpoint if meta else False, position=position,
        ))
    return specs


def _story_file_or_problem(tree: TreeView, folder: str | None, entry: BoardEntry, root: Path,
                           problems: list[str] | None) -> str | None:
    if folder is None:
        return None
    try:
        return find_story_file(tree, folder, entry, root)
    except ConfigError as exc:
        if problems is None:
            raise
        problems.append(str(exc))
        # Checked on as its first match: the later checks should not call it missing.
        return story_file_matches(tree, folder, entry)[0]


def _story_meta(story_file: Path, data: bytes, problems: list[str] | None):
    """(metadata or None, whether it was refused): a ConfigError naming the file, or without
    `problems` to collect them, one line per problem appended there."""
    try:
        meta = parse_story_text(data.decode("utf-8"))
        errors = list(meta.errors)
    except UnicodeDecodeError:
        meta, errors = None, ["story file is not UTF-8 text"]
    if not errors:
        return meta, False
    if problems is None:
        raise ConfigError(f"{story_file}: {'; '.join(errors)}")
    problems.extend(f"{story_file}: {error}" for error in errors)
    return None, True


class _PathSet(TreeView):
    """A tree of the given paths only (what `git status` reported)."""

    def __init__(self, paths) -> None:
        super().__init__()
        for path in paths:
            self._add(path, path)


def uncommitted_plan_files(git, board_rel: str | None, folder: str | None, board: Board,
                           chosen: Sequence[StorySpec]) -> list[str]:
    """The working-copy changes the plan would not see: to the board, or where a chosen
    story's file is or would be found (modified, staged, deleted, untracked), as
    `path (what)`."""
    changes = dict((path, what) for what, path in uncommitted(git, [board_rel, folder]))
    if not changes:
        return []
    relevant = {board_rel} if board_rel else set()
    dirty = _PathSet(changes)
    for spec in chosen:
        relevant.add(spec.story_path)
        entry = board.entry(spec.key)
        if entry is not None and folder is not None:
            relevant.update(story_file_matches(dirty, folder, entry))
    return [f"{path} ({changes[path]})" for path in changes if path in relevant]
