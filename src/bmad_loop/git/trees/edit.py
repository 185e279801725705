"""Reading and writing files of a commit's tree without any worktree: plumbing only.

`blob_at` / `blobs_at` read files as stored (one ``cat-file --batch`` for several), and
`replace_blob` / `replace_blobs` make a new tree with files replaced or removed. The lane's
write-back (board and story file), the merge rules and the create phase use them; `compose`
re-exports them.

A new tree is written by git, through a temporary index: ``ls-tree`` of the edited paths (their
modes, and whether one is a folder), ``read-tree`` of the old tree into the index,
``hash-object`` of the new files, ``update-index --index-info`` of the edits and ``write-tree``.
git checks every path and names every object.

The temporary index, and any other throw-away folder of bmad-loop's own git work, lives in
`private_temp`, where no box can write. The system temp folders are writable in every box: a
folder bmad-loop made there (the committed attributes a merge reads, a temporary index) could be
filled by a sibling agent between its creation and its use (a ``* merge=union`` line planted in
the attributes). These folders live in the repository's git directory instead, which every box
binds read-only.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from ...errors import GitError
from ..runner import Git, is_full_sha
from ...caches import CACHES

__all__ = ["PRIVATE_TMP", "private_temp", "blob_at", "blobs_at", "cat_file_batch", "read_objects",
           "replace_blob", "replace_blobs", "remember_commit"]

_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}
PRIVATE_TMP = "bmad-loop-tmp"  # in the git common dir


@contextmanager
def private_temp(git: Git, prefix: str) -> Iterator[Path]:
    """A new empty folder only this user can enter, removed afterwards."""
    base = git.common_dir() / PRIVATE_TMP
    base.mkdir(mode=0o700, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=prefix, dir=base) as folder:
        yield Path(folder)


# -- reading ------------------------------------------------------------------------------------


def blob_at(git: Git, commit: str, path: str) -> bytes | None:
    """Content of `path` in `commit`, as stored (no filters), or None when it holds no such file.

    A file this process wrote with `replace_blobs` into the tree of a commit made here
    (`remember_commit`) is answered from memory: the lane reads the board of the target it has
    just advanced to, which is the board its own write-back wrote."""
    written = _written(git, commit, path)
    if written is not None:
        return written
    proc = git.run("cat-file", "blob", f"{commit}:{path}", check=False, text=False)
    if proc.returncode == 0:
        content: bytes = proc.stdout
        return content
    if git.run("cat-file", "-e", f"{commit}^{{tree}}", check=False).returncode != 0:
        raise GitError(f"no commit or tree {commit}", returncode=proc.returncode,
                       stderr=proc.stderr.decode("utf-8", "replace"))
    return None


def cat_file_batch(git: Git, objects: Sequence[str]) -> list[tuple[str, bytes] | None]:
    """Each object's (type, content), through one ``git cat-file --batch``; None where git
    says it is missing or ambiguous. The protocol is line-based: no name may hold a newline."""
    return [None if o is None else (o[1], o[2]) for o in read_objects(git, objects)]


def read_objects(git: Git, objects: Sequence[str]) -> list[tuple[str, str, bytes] | None]:
    """`cat_file_batch` with each object's name: (sha, type, content), or None."""
    if not objects:
        return []
    request = "".join(f"{o}\n" for o in objects).encode("utf-8", "surrogateescape")
    out: bytes = git.run("cat-file", "--batch", input=request).stdout
    found: list[tuple[str, str, bytes] | None] = []
    pos = 0
    for _ in objects:
        end = out.index(b"\n", pos)
        line = out[pos:end]
        pos = end + 1
        if line.endswith((b" missing", b" ambiguous")):  # "<name> missing"
            found.append(None)
            continue
        header = line.split(b" ")  # "<sha> <type> <size>"
        size = int(header[2])
        found.append((header[0].decode("ascii"), header[1].decode("ascii"), out[pos:pos + size]))
        pos += size + 1  # the content, then one newline
    return found


def blobs_at(git: Git, tree: str, paths: Sequence[str]) -> dict[str, bytes | None]:
    """`blob_at` for several paths of one commit or tree, through one ``cat-file --batch``.
    A path that holds no file (absent, or a folder) maps to None."""
    paths = list(dict.fromkeys(paths))
    if not paths:
        return {}
    if any("\n" in p for p in paths):  # the batch protocol is line-based
        return {p: blob_at(git, tree, p) for p in paths}
    found = cat_file_batch(git, [f"{tree}:{p}" for p in paths])
    return {p: (obj[1] if obj is not None and obj[0] == "blob" else None)
            for p, obj in zip(paths, found)}


# -- writing ------------------------------------------------------------------------------------


def replace_blob(git: Git, tree: str, path: str, content: bytes | None) -> str:
    """A new tree: `tree` with `path` holding `content` (None removes it). No worktree involved.

    Keeps an existing file's executable bit. Uses a temporary index (``GIT_INDEX_FILE``).
    """
    return replace_blobs(git, tree, {path: content})


def replace_blobs(git: Git, tree: str, contents: Mapping[str, bytes | None]) -> str:
    """`replace_blob` for several paths at once, in the same five git processes however many
    there are (see the module's docstring)."""
    if not contents:
        return tree
    modes = _modes(git, tree, contents)
    with private_temp(git, "index-") as tmp:  # never the shared /tmp, which boxes write
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git.run("read-tree", tree, env=env)
        blobs = _hashed(git, tmp, {p: c for p, c in contents.items() if c is not None})
        lines = []
        for p, c in contents.items():
            if c is None:
                lines.append(f"0 {'0' * 40}\t{p}\0")
            else:
                mode = "100755" if modes.get(p) == "100755" else "100644"
                lines.append(f"{mode} {blobs[p]}\t{p}\0")
        git.run("update-index", "-z", "--index-info", input="".join(lines), env=env)
        new = git.out("write-tree", env=env)
    for p, content in contents.items():
        if content is not None:
            _WRITTEN.put((os.fspath(git.repo_dir), new, p), content)
    return new


def _modes(git: Git, tree: str, contents: Mapping[str, bytes | None]) -> dict[str, str]:
    """The mode of each edited path `tree` holds; GitError when one of them is a folder."""
    listed = git.run("ls-tree", "-z", tree, "--", *contents, env=_LITERAL).stdout
    modes: dict[str, str] = {}
    for entry in filter(None, listed.split("\0")):
        meta, _, name = entry.partition("\t")
        old_mode, kind, _sha = meta.split(" ")
        if kind == "tree" and name in contents:
            raise GitError(f"{name} is a folder in tree {tree}, not a file")
        modes[name] = old_mode
    return modes


def _hashed(git: Git, folder: Path, contents: Mapping[str, bytes]) -> dict[str, str]:
    """Each content written as a blob (as stored: no filters), by path: one ``hash-object``."""
    if not contents:
        return {}
    sources = []
    for i, content in enumerate(contents.values()):
        source = os.path.join(folder, f"blob{i}")
        with open(source, "wb") as handle:
            handle.write(content)
        sources.append(source)
    shas = git.out("hash-object", "-w", "--no-filters", "--stdin-paths",
                   input="".join(f"{src}\n" for src in sources)).split()
    return dict(zip(contents, shas))


# -- what this process wrote --------------------------------------------------------------------

# (repository, commit) -> its tree, for commits made here; (repository, tree, path) -> a file
# `replace_blobs` wrote there.
_COMMITS = CACHES.memo("git.trees.commit_trees", 64,
                       holds="(repository, commit) -> its tree, for commits made here")
_WRITTEN = CACHES.memo("git.trees.written", 64,
                       holds="(repository, tree, path) -> a file replace_blobs wrote there")


def remember_commit(git: Git, commit: str, tree: str) -> None:
    """`commit` (made in this process) has `tree`: `blob_at` may then answer from what
    `replace_blobs` wrote into that tree."""
    if is_full_sha(commit) and is_full_sha(tree):
        _COMMITS.put((os.fspath(git.repo_dir), commit), tree)


def _written(git: Git, commit: str, path: str) -> bytes | None:
    where = os.fspath(git.repo_dir)
    tree = _COMMITS.get((where, commit))
    if tree is None:
        return None
    content: bytes | None = _WRITTEN.get((where, tree, path))
    return content
