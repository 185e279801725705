"""Reading and writing files of a commit's tree without any worktree: plumbing only.

`blob_at` / `blobs_at` read files as stored (one ``cat-file --batch`` for several), and
`replace_blob` / `replace_blobs` make a new tree with files replaced or removed, through a
temporary index: five git processes however many files change. The lane's write-back (board and
story file) and the create phase use them; `compose` re-exports them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

from bmad_loop.errors import GitError
from bmad_loop.gitcmd import Git

__all__ = ["blob_at", "blobs_at", "cat_file_batch", "replace_blob", "replace_blobs"]

_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}


def blob_at(git: Git, commit: str, path: str) -> bytes | None:
    """Content of `path` in `commit`, as stored (no filters), or None when it holds no such file."""
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
    if not objects:
        return []
    request = "".join(f"{o}\n" for o in objects).encode("utf-8", "surrogateescape")
    out = git.run("cat-file", "--batch", input=request).stdout
    found: list[tuple[str, bytes] | None] = []
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
        found.append((header[1].decode("ascii"), out[pos:pos + size]))
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


def replace_blob(git: Git, tree: str, path: str, content: bytes | None) -> str:
    """A new tree: `tree` with `path` holding `content` (None removes it). No worktree involved.

    Keeps an existing file's executable bit. Uses a temporary index (``GIT_INDEX_FILE``).
    """
    return replace_blobs(git, tree, {path: content})


def replace_blobs(git: Git, tree: str, contents: dict[str, bytes | None]) -> str:
    """`replace_blob` for several paths at once: five git processes however many there are."""
    if not contents:
        return tree
    listed = git.run("ls-tree", "-z", tree, "--", *contents, env=_LITERAL).stdout
    modes: dict[str, str] = {}
    for entry in filter(None, listed.split("\0")):
        meta, _, name = entry.partition("\t")
        old_mode, kind, _sha = meta.split(" ")
        if kind == "tree" and name in contents:
            raise GitError(f"{name} is a folder in tree {tree}, not a file")
        modes[name] = old_mode
    with tempfile.TemporaryDirectory(prefix="bmad-loop-index-") as tmp:
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
