"""Reading and writing files of a commit's tree without any worktree: plumbing only.

`blob_at` / `blobs_at` read files as stored (one ``cat-file --batch`` for several), and
`replace_blob` / `replace_blobs` make a new tree with files replaced or removed. The lane's
write-back (board and story file) and the create phase use them; `compose` re-exports them.

A new tree is built folder by folder: only the folders along the changed paths are rebuilt
(their entries read through ``cat-file --batch``, which `blobs_at` already ran for the same
tree and paths, so the write-back reads them there), in git's tree format and order, with their
object names computed here. The new files and folders go to git as one small pack through
``unpack-objects --strict``, which names each object from its content, checks every folder's
format (sorted, no duplicate, no ``.git``) and that everything it names exists (commits are
always git's own: ``commit-tree``). The result is
what a temporary index gives (``ls-tree``, ``read-tree``, ``hash-object``, ``update-index``,
``write-tree``: five processes), which is still the way for anything unusual: a file in the
way of a folder, an odd path, a pack git refuses, or a folder holding a mode git no longer
writes (the index route rewrites such folders in git's canonical form; the folder route keeps
folders it does not touch as they are).
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Sequence

from ...errors import GitError
from ..privatetmp import private_temp
from ..runner import Git, is_full_sha
from ...caches import CACHES

__all__ = ["blob_at", "blobs_at", "cat_file_batch", "read_objects", "replace_blob", "replace_blobs",
           "remember_commit"]

_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}


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
        return proc.stdout
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
    out = git.run("cat-file", "--batch", input=request).stdout
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
    A path that holds no file (absent, or a folder) maps to None. The folders along the paths
    are read in the same process and kept for a `replace_blobs` of the same tree."""
    paths = list(dict.fromkeys(paths))
    if not paths:
        return {}
    if any("\n" in p for p in paths):  # the batch protocol is line-based
        return {p: blob_at(git, tree, p) for p in paths}
    folders = _folders(paths) if is_full_sha(tree) else []
    found = cat_file_batch(git, [f"{tree}:{p}" for p in paths] + [_spec(tree, f) for f in folders])
    _keep_folders(git, tree, folders, found[len(paths):])
    return {p: (obj[1] if obj is not None and obj[0] == "blob" else None)
            for p, obj in zip(paths, found)}


def replace_blob(git: Git, tree: str, path: str, content: bytes | None) -> str:
    """A new tree: `tree` with `path` holding `content` (None removes it). No worktree involved.

    Keeps an existing file's executable bit. Uses a temporary index (``GIT_INDEX_FILE``).
    """
    return replace_blobs(git, tree, {path: content})


def replace_blobs(git: Git, tree: str, contents: dict[str, bytes | None]) -> str:
    """`replace_blob` for several paths at once: one git process however many there are (a
    second when `blobs_at` did not read this tree's folders just before)."""
    if not contents:
        return tree
    built = _by_folders(git, tree, contents)
    if built is not None:
        return built
    return _through_index(git, tree, contents)


def _through_index(git: Git, tree: str, contents: dict[str, bytes | None]) -> str:
    """`replace_blobs` through a temporary index: five git processes."""
    listed = git.run("ls-tree", "-z", tree, "--", *contents, env=_LITERAL).stdout
    modes: dict[str, str] = {}
    for entry in filter(None, listed.split("\0")):
        meta, _, name = entry.partition("\t")
        old_mode, kind, _sha = meta.split(" ")
        if kind == "tree" and name in contents:
            raise GitError(f"{name} is a folder in tree {tree}, not a file")
        modes[name] = old_mode
    with private_temp(git, "index-") as tmp:  # never the shared /tmp, which boxes write
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git.run("read-tree", tree, env=env)
        written = [p for p, c in contents.items() if c is not None]
        sources = []
        for i, p in enumerate(written):
            source = os.path.join(tmp, f"blob{i}")
            with open(source, "wb") as handle:
                handle.write(contents[p])
            sources.append(source)
        blobs = dict(zip(written, git.out(
            "hash-object", "-w", "--no-filters", "--stdin-paths",
            input="".join(f"{src}\n" for src in sources)).split()) if written else {})
        lines = []
        for p, c in contents.items():
            if c is None:
                lines.append(f"0 {'0' * 40}\t{p}\0")
            else:
                mode = "100755" if modes.get(p) == "100755" else "100644"
                lines.append(f"{mode} {blobs[p]}\t{p}\0")
        git.run("update-index", "-z", "--index-info", input="".join(lines), env=env)
        return git.out("write-tree", env=env)


# -- folder by folder ---------------------------------------------------------------------------

_TREE_MODE = b"40000"
_WRITTEN_MODES = frozenset({b"100644", b"100755", b"120000", b"160000", _TREE_MODE})
# (repository, tree, folder) -> the folder's tree object (None: no folder there).
_FOLDERS = CACHES.memo("git.trees.folders", 64,
                       holds="(repository, tree, folder) -> that folder's raw entries")
_UNREAD = object()


def _folders(paths) -> list[str]:
    """The folders along `paths`, the root ("") first, each once."""
    found = {"": None}
    for p in paths:
        parts = p.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            found["/".join(parts[:i])] = None
    return list(found)


def _spec(tree: str, folder: str) -> str:
    return f"{tree}^{{tree}}" if not folder else f"{tree}:{folder}"


def _keep_folders(git: Git, tree: str, folders, objects) -> None:
    for folder, obj in zip(folders, objects):
        _FOLDERS.put((os.fspath(git.repo_dir), tree, folder),
                     obj[1] if obj is not None and obj[0] == "tree" else None)


def _read_folders(git: Git, tree: str, folders) -> dict[str, bytes | None]:
    where = os.fspath(git.repo_dir)
    got = {f: _FOLDERS.get((where, tree, f), _UNREAD) for f in folders}
    known = {f: folder for f, folder in got.items() if folder is not _UNREAD}
    missing = [f for f in folders if f not in known]
    if missing:
        found = cat_file_batch(git, [_spec(tree, f) for f in missing])
        _keep_folders(git, tree, missing, found)
        known.update({f: (obj[1] if obj is not None and obj[0] == "tree" else None)
                      for f, obj in zip(missing, found)})
    return known


def _parse_tree(raw: bytes, size: int) -> dict[bytes, tuple[bytes, bytes]] | None:
    """name -> (mode, raw object name) of a tree object; None when it holds a mode git no
    longer writes (the index route then decides) or does not parse."""
    entries: dict[bytes, tuple[bytes, bytes]] = {}
    pos = 0
    while pos < len(raw):
        space = raw.find(b" ", pos)
        nul = raw.find(b"\0", space + 1)
        if space < 0 or nul < 0 or nul + 1 + size > len(raw):
            return None
        mode, name = raw[pos:space], raw[space + 1:nul]
        if mode not in _WRITTEN_MODES or name in entries:
            return None
        entries[name] = (mode, raw[nul + 1:nul + 1 + size])
        pos = nul + 1 + size
    return entries


def _tree_bytes(entries: dict[bytes, tuple[bytes, bytes]]) -> bytes:
    """A tree object's content: entries in git's order (a folder sorts as if its name ended
    in "/")."""
    order = sorted(entries, key=lambda n: n + b"/" if entries[n][0] == _TREE_MODE else n)
    return b"".join(entries[n][0] + b" " + n + b"\0" + entries[n][1] for n in order)


def _object_name(kind: bytes, content: bytes, hex_len: int) -> bytes:
    algorithm = hashlib.sha1 if hex_len == 40 else hashlib.sha256
    return algorithm(kind + b" %d\0" % len(content) + content).digest()


def _by_folders(git: Git, tree: str, contents: dict[str, bytes | None]) -> str | None:
    """The new tree built folder by folder (see the module's docstring); None when the index
    route must decide."""
    if not is_full_sha(tree):
        return None
    for p in contents:
        if any(part in ("", ".", "..") or "\0" in part or "\n" in part for part in p.split("/")):
            return None
    hex_len = len(tree)
    folders = _folders(list(contents))
    trees = _parsed_folders(git, tree, folders, hex_len // 2)
    if trees is None or not _paths_fit(tree, trees, folders, contents):
        return None
    blobs = {p: _object_name(b"blob", c, hex_len) for p, c in contents.items() if c is not None}
    _apply_edits(trees, contents, blobs)
    written = _rebuilt_folders(trees, folders, hex_len)
    if not trees[""]:
        return None  # an empty root: the index route's answer
    root = _object_name(b"tree", _tree_bytes(trees[""]), hex_len)
    written.append(("", root, trees[""]))
    if not _write_objects(git, contents, blobs, written, hex_len):
        return None  # git's own verdict comes from the index route
    for p, content in contents.items():
        if content is not None:
            _WRITTEN.put((os.fspath(git.repo_dir), root.hex(), p), content)
    return root.hex()


def _parsed_folders(git: Git, tree: str, folders: list[str], size: int):
    """Folder -> its entries (None: not in `tree`), or None when the root or a folder cannot
    be read here."""
    raw = _read_folders(git, tree, folders)
    if raw[""] is None:
        return None
    trees: dict[str, dict[bytes, tuple[bytes, bytes]] | None] = {}
    for folder in folders:
        if raw[folder] is None:
            trees[folder] = None
            continue
        parsed = _parse_tree(raw[folder], size)
        if parsed is None:
            return None
        trees[folder] = parsed
    return trees


def _paths_fit(tree: str, trees, folders: list[str], contents) -> bool:
    """Each folder along a path is a folder or nothing; a path is a file or nothing (a folder
    edited as a file is an error; a file in the way of a folder is the index route's)."""
    for folder in folders[1:]:
        parent, _, name = folder.rpartition("/")
        entry = (trees[parent] or {}).get(name.encode("utf-8", "surrogateescape"))
        if (entry is not None and entry[0] != _TREE_MODE) or folder in contents:
            return False
    for p in contents:
        parent, _, name = p.rpartition("/")
        entry = (trees[parent] or {}).get(name.encode("utf-8", "surrogateescape"))
        if entry is not None and entry[0] == _TREE_MODE:
            raise GitError(f"{p} is a folder in tree {tree}, not a file")
    return True


def _apply_edits(trees, contents, blobs: dict[str, bytes]) -> None:
    """The edited files into their folders' entries (an existing file keeps its executable bit)."""
    for p, content in contents.items():
        parent, _, name = p.rpartition("/")
        key = name.encode("utf-8", "surrogateescape")
        folder = trees[parent] if trees[parent] is not None else {}
        trees[parent] = folder
        old = folder.get(key)
        if content is None:
            folder.pop(key, None)
        else:
            mode = b"100755" if old is not None and old[0] == b"100755" else b"100644"
            folder[key] = (mode, blobs[p])


def _rebuilt_folders(trees, folders: list[str], hex_len: int) -> list[tuple[str, bytes, dict]]:
    """The changed folders rebuilt deepest first, each named in its parent: (folder, name,
    entries) of each one to write, the root aside."""
    written: list[tuple[str, bytes, dict]] = []
    for folder in sorted(folders, key=lambda f: (-f.count("/") if f else 1, f)):
        entries = trees[folder]
        if folder == "":
            continue
        parent, _, name = folder.rpartition("/")
        key = name.encode("utf-8", "surrogateescape")
        holder = trees[parent] if trees[parent] is not None else {}
        trees[parent] = holder
        if not entries:
            holder.pop(key, None)  # an emptied folder is no folder
            continue
        name_raw = _object_name(b"tree", _tree_bytes(entries), hex_len)
        if holder.get(key) != (_TREE_MODE, name_raw):
            holder[key] = (_TREE_MODE, name_raw)
            written.append((folder, name_raw, entries))
    return written


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
    return None if tree is None else _WRITTEN.get((where, tree, path))


def _write_objects(git: Git, contents, blobs: dict[str, bytes], written, hex_len: int) -> bool:
    """The new files and folders, written by one ``unpack-objects --strict`` from a pack made
    here (git names every object from its content, and checks each folder's format and that
    everything it names exists); False when git refused it."""
    objects = [(_PACK_BLOB, contents[p]) for p in blobs]
    objects += [(_PACK_TREE, _tree_bytes(entries)) for _f, _n, entries in written]
    body = b"PACK" + (2).to_bytes(4, "big") + len(objects).to_bytes(4, "big")
    body += b"".join(_pack_entry(kind, content) for kind, content in objects)
    algorithm = hashlib.sha1 if hex_len == 40 else hashlib.sha256
    proc = git.run("unpack-objects", "-q", "--strict", input=body + algorithm(body).digest(),
                   check=False)
    return proc.returncode == 0


_PACK_TREE, _PACK_BLOB = 2, 3


def _pack_entry(kind: int, content: bytes) -> bytes:
    """One undeltified pack entry: type and size (a little-endian varint), then zlib data."""
    size = len(content)
    header = bytearray()
    byte = (kind << 4) | (size & 0x0F)
    size >>= 4
    while size:
        header.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    header.append(byte)
    return bytes(header) + zlib.compress(content)
