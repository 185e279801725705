"""Reading and writing files of a commit's tree without any worktree: plumbing only.

`blob_at` / `blobs_at` read files as stored (one ``cat-file --batch`` for several), and
`replace_blob` / `replace_blobs` make a new tree with files replaced or removed. The lane's
write-back (board and story file), the merge rules and the create phase use them; `compose`
re-exports them.

A new tree is written by git, folder by folder: one ``ls-tree`` lists the folders along the
edited paths (their entries, with each file's mode and whether a name is a folder), one
``hash-object`` writes the new files, and ``mktree --batch`` writes the changed folders, one
process per depth, the deepest first. Only those folders are read and written, however large
the tree (a temporary index would read and write all of it, three times). git names every
object and checks that each entry names one of its type; the names git refuses to store in a
tree are refused first (`replace_blob`).

The new files wait for ``hash-object`` in a throw-away folder of `private_temp`, where no box
can write. The system temp folders are writable in every box: a folder bmad-loop made there
(the committed attributes a merge reads, the files of a new tree) could be filled by a sibling
agent between its creation and its use (a ``* merge=union`` line planted in the attributes).
These folders live in the repository's git directory instead, which every box binds read-only.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
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

_TREE = "040000"
Entry = tuple[str, str, str]  # (mode, type, object) of one name in a folder


def replace_blob(git: Git, tree: str, path: str, content: bytes | None) -> str:
    """A new tree: `tree` with `path` holding `content` (None removes it). No worktree involved.

    Keeps an existing file's executable bit; a file in the way of a new folder gives way, an
    emptied folder goes. A path that is a folder in `tree`, or one git would not store (an empty,
    ``.`` or ``..`` part, a ``.git`` in any spelling), is a GitError.
    """
    return replace_blobs(git, tree, {path: content})


def replace_blobs(git: Git, tree: str, contents: Mapping[str, bytes | None]) -> str:
    """`replace_blob` for several paths at once: the folders along them listed by one
    ``ls-tree``, the new files written by one ``hash-object``, the changed folders by one
    ``mktree --batch`` per depth (the deepest first: a folder names its new subfolders)."""
    if not contents:
        return tree
    for path in contents:
        _check_path(path)
    folders = _folders(contents)
    entries = _listing(git, tree, folders)
    blobs = _hashed(git, {p: c for p, c in contents.items() if c is not None})
    for path, content in contents.items():
        parent, _, name = path.rpartition("/")
        old = entries[parent].get(name)
        if old is not None and old[1] == "tree":
            raise GitError(f"{path} is a folder in tree {tree}, not a file")
        if content is None:
            entries[parent].pop(name, None)
        else:
            entries[parent][name] = ("100755" if old is not None and old[0] == "100755"
                                     else "100644", "blob", blobs[path])
    new = _write_folders(git, folders, entries)
    for path, content in contents.items():
        if content is not None:
            _WRITTEN.put((os.fspath(git.repo_dir), new, path), content)
    return new


def _check_path(path: str) -> None:
    """GitError unless git would store `path` in a tree (its own check refuses these names)."""
    for part in path.split("/"):
        folded = part.lower().rstrip(" .")
        if part in ("", ".", "..") or "\0" in part or folded in (".git", "git~1") \
                or folded.startswith(".git:"):
            raise GitError(f"git does not store {path!r} in a tree")


def _folders(paths: Iterable[str]) -> list[str]:
    """The folders along `paths`, the root ("") first, each once."""
    found = {"": None}
    for path in paths:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            found["/".join(parts[:i])] = None
    return list(found)


def _listing(git: Git, tree: str, folders: list[str]) -> dict[str, dict[str, Entry]]:
    """Each folder's entries in `tree` ({} where it has none), but for its subfolders among
    `folders`: ``ls-tree`` shows what a folder holds when a path below it is asked for, and
    the folder itself otherwise (or a file of that name, in the way)."""
    specs = ["."] + [f"{f}/" for f in folders[1:]]
    out = git.run("ls-tree", "-z", "--full-tree", tree, "--", *specs, env=_LITERAL).stdout
    entries: dict[str, dict[str, Entry]] = {f: {} for f in folders}
    for record in filter(None, out.split("\0")):
        meta, _, path = record.partition("\t")
        mode, kind, sha = meta.split(" ")
        parent, _, name = path.rpartition("/")
        if parent in entries:
            entries[parent][name] = (mode, kind, sha)
    return entries


def _write_folders(git: Git, folders: list[str], entries: dict[str, dict[str, Entry]]) -> str:
    """The edited folders written, the deepest first, each named in its parent (an emptied one
    leaves it); the new root tree."""
    written: dict[str, str | None] = {}
    for depth in sorted({f.count("/") + 1 if f else 0 for f in folders}, reverse=True):
        level = [f for f in folders if (f.count("/") + 1 if f else 0) == depth]
        for folder in level:
            for child in [f for f in written if f.rpartition("/")[0] == folder]:
                name = child.rpartition("/")[2]
                sha = written.pop(child)
                if sha is not None:
                    entries[folder][name] = (_TREE, "tree", sha)
                elif entries[folder].get(name, ("", "", ""))[1] == "tree":
                    entries[folder].pop(name)  # emptied: no folder (a file there stays)
        batch = [f for f in level if entries[f] or not f]  # the root is written even empty
        if not batch:
            written.update({f: None for f in level})
            continue
        request = "".join("".join(f"{m} {k} {o}\t{n}\0" for n, (m, k, o) in entries[f].items())
                          + "\0" for f in batch)
        shas = git.out("mktree", "-z", "--batch", input=request).split()
        written.update({f: None for f in level})
        written.update(zip(batch, shas))
    root = written[""]
    assert root is not None  # the root is always written
    return root


def _hashed(git: Git, contents: Mapping[str, bytes]) -> dict[str, str]:
    """Each content written as a blob (as stored: no filters), by path: one ``hash-object``."""
    if not contents:
        return {}
    with private_temp(git, "blobs-") as folder:  # never the shared /tmp, which boxes write
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
