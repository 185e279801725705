"""The programs bmad-loop runs outside every box (git, bubblewrap), and its own code.

A boxed agent writes the home and the temp folders, so it could plant a `git` or a `bwrap`
in a folder that comes early on `PATH` (`~/.local/bin`), or a `.pth` file in bmad-loop's own
site-packages, and have bmad-loop run it unboxed. Two things close that:

- `trusted_program` looks each program up once per process, on `PATH`'s absolute folders,
  and takes the first whose file and every folder above it (links resolved) belong to root or
  to this user and are writable by nobody else (a sticky folder such as `/tmp` excepted). A
  folder reached through a symlink that lies in the home or a temp folder is skipped: the box
  binds the link's target read-only but cannot bind the link itself, so a box could point it
  elsewhere for the next bmad-loop process;
- `outside_code` names what every box binds read-only: each folder on `PATH` (bmad-loop's
  and the box's own, and the usual per-user ones, `~/.local/bin` and `~/bin`, even when
  absent), the interpreter's prefixes, every `sys.path` entry, the user site folder, the
  package itself, and the folders the programs above were found in.
"""

from __future__ import annotations

import os
import shutil
import site
import stat
import sys
from pathlib import Path
from typing import Mapping

from ..caches import CACHES
from .plan import box_writable_roots

__all__ = ["trusted_program", "untrusted_reason", "redirectable_folder", "outside_code", "per_user_bins",
           "placeholder_folders", "box_search_path"]

_FOUND: dict[tuple[str, str], str] = {}  # (program name, PATH) -> its trusted path
CACHES.register("sandbox.programs", _FOUND.clear, bound="one per program name and PATH seen (17 at most)",
                holds="(name, PATH) -> the trusted executable this process runs for it")
_PACKAGE = Path(__file__).resolve().parent.parent


def trusted_program(name: str) -> str:
    """The absolute path of the first `name` on PATH that `untrusted_reason` passes ("" when
    none), looked up once for the life of the process (once per PATH: bmad-loop never changes
    its own, tests do): a program planted later, even in a folder before the one it was found
    in, is never picked up by a process already running. A miss is looked up again."""
    search = os.environ.get("PATH", "")
    found = _FOUND.get((name, search))
    if found is None:
        for folder in _absolute_folders(search):
            if redirectable_folder(folder):
                continue
            candidate = shutil.which(name, path=folder)
            if candidate and untrusted_reason(candidate) is None:
                found = os.path.realpath(candidate)
                if len(_FOUND) > 16:
                    _FOUND.clear()
                _FOUND[(name, search)] = found
                break
    return found or ""


def untrusted_reason(program: str) -> str | None:
    """Why `program` must not run unboxed (None: it may): the file or a folder above it (links
    resolved) belongs to another user, or others may write it."""
    me = os.geteuid() if hasattr(os, "geteuid") else 0
    path = Path(os.path.realpath(program))
    for part in (path, *path.parents):
        try:
            info = os.stat(part)
        except OSError as exc:
            return f"{part}: {exc.strerror}"
        if info.st_uid not in (0, me):
            return f"{part} belongs to uid {info.st_uid}"
        sticky_folder = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_folder:
            return f"{part} is writable by others"
    return None


def redirectable_folder(folder: str) -> str | None:
    """The symlink on the way to `folder` that a box could re-point (one in the home or a temp
    folder, which every box writes), or None."""
    # The roots as far as this process can tell (`sandbox_writable` is a project's, not known).
    reach = [Path(os.path.realpath(p)) for p in box_writable_roots(os.environ)]
    path = Path(folder)
    for depth in range(2, len(path.parts) + 1):
        step = Path(*path.parts[:depth])
        if not step.is_symlink():
            continue
        parent = Path(os.path.realpath(step.parent))
        if any(parent == root or parent.is_relative_to(root) for root in reach):
            return str(step)
    return None


def per_user_bins(env: Mapping[str, str]) -> list[Path]:
    """The per-user program folders a later shell may put first on PATH."""
    home = env.get("HOME") or ""
    if not os.path.isabs(home) or os.path.realpath(home) == "/":
        return []
    return [Path(home) / ".local" / "bin", Path(home) / "bin"]


def outside_code(env: Mapping[str, str]) -> list[Path]:
    """What bmad-loop runs outside the box, as real paths (some may not exist): read-only in
    every box. `env`: the boxed process's environment (its PATH and HOME)."""
    paths = [Path(p) for p in _absolute_folders(os.environ.get("PATH", ""))]
    paths += [Path(p) for p in _absolute_folders(env.get("PATH", ""))]
    paths += per_user_bins(env) + per_user_bins(os.environ)
    paths += [Path(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)]
    paths.append(Path(os.path.realpath(sys.executable)).parent)
    paths += [Path(p) for p in sys.path if p and os.path.isabs(p)]
    if site.ENABLE_USER_SITE:
        paths.append(Path(site.getusersitepackages()))
    pycache_prefix = getattr(sys, "pycache_prefix", None)
    if pycache_prefix:
        paths.append(Path(pycache_prefix))
    paths.append(_PACKAGE)
    paths += [Path(p).parent for p in _FOUND.values()]
    real = (Path(os.path.realpath(p)) for p in paths)
    return [p for p in dict.fromkeys(real) if p != Path("/")]


def placeholder_folders(env: Mapping[str, str]) -> list[Path]:
    """The folders of `outside_code` a box must find in place even when absent (an empty one is
    made, so there is something to bind read-only): a folder on PATH, the per-user program
    folders, the user site folder (Python adds it once it exists)."""
    paths = [Path(p) for p in _absolute_folders(os.environ.get("PATH", ""))]
    paths += [Path(p) for p in _absolute_folders(env.get("PATH", ""))]
    paths += per_user_bins(env) + per_user_bins(os.environ)
    if site.ENABLE_USER_SITE:
        paths.append(Path(site.getusersitepackages()))
    return list(dict.fromkeys(paths))


def box_search_path(env: Mapping[str, str]) -> str:
    """The boxed process's PATH: its absolute folders only (each read-only in the box); a
    relative entry would search the writable tree."""
    return os.pathsep.join(_absolute_folders(env.get("PATH", "")))


def _absolute_folders(search_path: str) -> list[str]:
    """PATH's absolute folders, in order (a relative or empty entry names the current folder:
    never searched for a program bmad-loop runs itself)."""
    return [p for p in search_path.split(os.pathsep) if p and os.path.isabs(p)]
