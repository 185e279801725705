"""The files a plan is read from: the committed target tree, or (without git) a folder.

The board and the story files are read from the commit the target branch points at: that tree
is what every story's worktree is made from, so the plan and the agents see the same text.
`CommittedTree` lists that commit once (`git ls-tree -r -z`) and reads the blobs it is asked
for through one `git cat-file --batch` process, so a board of a hundred stories costs two git
processes, not a hundred. `FolderTree` answers the same questions from the file system, for a
folder that is not a repository (tests, and `validate` when the git check failed).

Paths are repository-relative POSIX strings (`""` is the root). `uncommitted` says which of a
set of paths differ from the last commit in the checkout: modified, staged, deleted or untracked.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from pathlib import Path

from ...errors import ConfigError, GitError
from ..runner import Git
from .edit import cat_file_batch

__all__ = ["CommittedTree", "FolderTree", "TreeView", "uncommitted"]

_FILE_MODES = ("100644", "100755")  # regular files; a symlink or submodule is no story file


class TreeView:
    """What both trees answer: is there a file or folder at a path, what a folder holds."""

    where = ""

    def __init__(self) -> None:
        self._files: dict[str, str] = {}  # path -> blob id (FolderTree: the path itself)
        self._children: dict[str, list[str]] = {}  # folder -> file names directly in it

    def is_file(self, rel: str) -> bool:
        return rel in self._files

    def is_dir(self, rel: str) -> bool:
        return rel.strip("/") in self._children or rel.strip("/") == ""

    def names(self, rel: str) -> list[str]:
        """File names directly in the folder `rel`, sorted."""
        return sorted(self._children.get(rel.strip("/"), ()))

    def read(self, rel: str) -> bytes:
        return self.read_many([rel])[rel]

    def read_many(self, rels: Iterable[str]) -> dict[str, bytes]:
        raise NotImplementedError

    def text(self, rel: str, what: str, shown: Path) -> str:
        """`rel` decoded as UTF-8 with its line ends kept; a one-line error naming `shown`."""
        if not self.is_file(rel):
            raise ConfigError(f"{shown}: {what} not found in {self.where}")
        try:
            return self.read(rel).decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"{shown}: {what} is not UTF-8 text") from None

    def _add(self, rel: str, ident: str) -> None:
        self._files[rel] = ident
        folder, name = posixpath.split(rel)
        self._children.setdefault(folder, []).append(name)
        while folder:  # every ancestor is a folder, even one that holds only folders
            folder = posixpath.dirname(folder)
            self._children.setdefault(folder, [])


class CommittedTree(TreeView):
    """The files of commit `sha`, relative to the folder `git` runs in (the project root)."""

    def __init__(self, git: Git, sha: str, label: str = "") -> None:
        super().__init__()
        self.git, self.sha = git, sha
        self.where = f"the committed target ({label + ' at ' if label else ''}{sha[:10]})"
        proc = git.run("ls-tree", "-r", "-z", "--end-of-options", sha, check=False, text=False)
        if proc.returncode != 0:
            raise GitError(f"cannot list commit {sha}: "
                           f"{proc.stderr.decode('utf-8', 'replace').strip()}",
                           returncode=proc.returncode)
        for record in proc.stdout.split(b"\0"):
            if not record:
                continue
            meta, _, path = record.partition(b"\t")
            mode, kind, blob = meta.decode("ascii").split(" ")
            if kind == "blob" and mode in _FILE_MODES:
                self._add(path.decode("utf-8", "surrogateescape"), blob)

    def read_many(self, rels: Iterable[str]) -> dict[str, bytes]:
        rels = list(dict.fromkeys(rels))
        missing = [r for r in rels if r not in self._files]
        if missing:
            raise KeyError(missing[0])
        if not rels:
            return {}
        found = cat_file_batch(self.git, [self._files[r] for r in rels])  # blob ids: never missing
        read: dict[str, bytes] = {}
        for rel, obj in zip(rels, found):
            if obj is None:
                raise GitError(f"{rel}: its blob is missing from {self.where}")
            read[rel] = obj[1]
        return read


class FolderTree(TreeView):
    """The files under `root` on disk (hidden folders and `.bmad-loop` skipped)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = Path(root)
        self.where = str(self.root)
        for folder, dirs, files in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") or d == ".bmad-core")
            rel_folder = Path(folder).relative_to(self.root).as_posix()
            rel_folder = "" if rel_folder == "." else rel_folder
            self._children.setdefault(rel_folder, [])
            for name in files:
                self._add(posixpath.join(rel_folder, name), name)

    def read_many(self, rels: Iterable[str]) -> dict[str, bytes]:
        return {rel: (self.root / rel).read_bytes() for rel in rels}


def uncommitted(git: Git, paths: Iterable[str | None]) -> list[tuple[str, str]]:
    """Which files under `paths` (files or folders, relative to the project root) hold changes
    the last commit of the checkout does not: `(what, path)`, e.g. `("M", "docs/board.yaml")`
    or `("untracked", "docs/stories/1-1-a.md")`."""
    paths = sorted(set(p for p in paths if p is not None))
    if not paths:
        return []
    prefix = git.out("rev-parse", "--show-prefix")
    pathspecs = [f":(literal){p or '.'}" for p in paths]
    proc = git.run("status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
                   "--", *pathspecs)
    found = []
    for record in proc.stdout.split("\0"):
        if len(record) < 4:
            continue
        code, path = record[:2], record[3:]
        if prefix and path.startswith(prefix):
            path = path[len(prefix):]
        found.append(("untracked" if code == "??" else code.strip(), path))
    return found
