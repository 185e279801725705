"""The writable set of one boxed process, as an ordered list of mounts (later ones win).

Everything is readable and nothing writable, then, in this order:
1. writable: the system temp folders, the user's home, `[adapter] sandbox_writable`;
2. read-only again: git's configuration and credential stores in the home, and what bmad-loop
   runs outside the box (`programs.outside_code`: every folder on PATH, its interpreter, its
   packages, every `sys.path` entry);
3. the project: read-only (worktree isolation) or writable (in place, the checkout is the tree);
   its git directory read-only either way (remote mode: the project the policy lives in too);
   in place, what of step 2 lies inside the checkout read-only again;
4. bmad-loop's state folder hidden (an empty tmpfs): databases, queue, policy, logs, other
   stories (remote mode: the project's and the clone's);
5. shown again inside it: the guard hooks (read-only), then writable: the process's own tree
   (story worktree or candidate worktree), its worktree admin entry in the git directory (index,
   HEAD) and its scratch folder (temp files, the git object quarantine). Its log is not: the
   output reaches the log through a pipe only;
6. read-only again: what would redirect bmad-loop's own git afterwards (the tree's `.git` file,
   the admin entry's `gitdir` and `commondir`);
7. out of reach: the Unix sockets of servers that run commands or hold keys outside the box
   (`server_sockets`): tmux's socket folder (bmad-loop's own `[adapter] tmux` server and the
   user's), the user's runtime folder (D-Bus, `systemd --user`, gpg-agent), the X11 socket
   folder, screen's, hidden; the Docker socket and the SSH agent's masked (`/dev/null` over
   them). A socket is a file a read-only mount still connects to, so read-only is not enough.
No ref is writable: refs live in the git directory, outside every writable folder.

A protected path is only as safe as its folders: moving `~/.config` aside would move the
read-only `~/.config/git` with it. So every folder between a writable mount and a read-only or
hidden path inside it is pinned (`pin`: bound onto itself, writable as before, but a mount point,
which nobody can rename or remove); `unpinned_ancestors` checks a plan for any it missed.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

__all__ = ["BoxRequest", "Mount", "plan_mounts", "home_git_files", "REDIRECTING_FILES",
           "unpinned_ancestors", "writable_in", "server_sockets", "tmux_socket_folder",
           "box_writable_roots"]

PROTECTED = ("ro", "hide", "mask")  # kinds whose folders above must not be renameable
# The Docker daemon's socket: whoever connects runs containers as root.
DOCKER_SOCKETS = (Path("/var/run/docker.sock"), Path("/run/docker.sock"))
# In a worktree admin entry: the files that say where the repository is.
REDIRECTING_FILES = ("gitdir", "commondir")


@dataclass(frozen=True)
class Mount:
    # "rw" | "ro" | "hide" (an empty read-only folder) | "pin" (as writable as before, but not
    # renameable) | "mask" (a socket or file covered by /dev/null)
    kind: str
    path: Path


@dataclass(frozen=True)
class BoxRequest:
    """What one boxed process works on."""

    project_root: Path
    state_dir: Path  # bmad-loop's own folder (.bmad-loop): hidden
    git_dir: Path  # the git common dir: read-only
    tree: Path  # the folder it works in: writable
    scratch: Path  # its scratch folder: writable
    checkout_tree: bool = False  # the tree is the project's own checkout (isolation "none")
    # What bmad-loop runs outside the box (programs.outside_code): read-only.
    outside_code: tuple[Path, ...] = ()
    shown: tuple[Path, ...] = ()  # folders inside the state folder it may read (guard hooks)
    extra_writable: tuple[str, ...] = ()  # [adapter] sandbox_writable
    # Remote mode: the project the policy and the state database live in, when the tree's
    # repository is a clone elsewhere (read-only, its state folder hidden too).
    home_project: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # HOME, TMPDIR, XDG_CONFIG_HOME


def plan_mounts(req: BoxRequest) -> list[Mount]:
    general = _general_writable(req)
    code = [p for p in req.outside_code if p not in general]  # the home itself stays writable
    # Code around a writable folder (`python -m` run from the folder that holds the home) is
    # read-only first and the writable folders inside it open again; the rest is read-only
    # after them. A mount covers what was mounted inside it before, so ancestors go first.
    around = [p for p in code if any(g.is_relative_to(p) for g in general)]
    mounts = sorted([Mount("rw", p) for p in general] + [Mount("ro", p) for p in around],
                    key=lambda m: len(m.path.parts))
    user_home = _home(req.env)
    if user_home is not None and any(m.path == user_home for m in mounts):
        mounts += [Mount("ro", p) for p in home_git_files(req.env)]
    mounts += [Mount("ro", p) for p in code if p not in around]
    mounts.append(Mount("rw" if req.checkout_tree else "ro", req.project_root))
    if req.checkout_tree:  # the checkout is writable again: bmad-loop's code in it is not
        mounts += [Mount("ro", p) for p in req.outside_code if p.is_relative_to(req.project_root)
                   and p != req.project_root]
    mounts.append(Mount("ro", req.git_dir))
    home = req.home_project
    if home is not None and home != req.project_root:
        mounts += [Mount("ro", home), Mount("hide", home / req.state_dir.name)]
    mounts.append(Mount("hide", req.state_dir))
    mounts += [Mount("ro", p) for p in req.shown]
    if not req.checkout_tree:
        mounts.append(Mount("rw", req.tree))
    admin = admin_entry(req.tree, req.git_dir)
    if admin is not None:
        mounts.append(Mount("rw", admin))
    mounts.append(Mount("rw", req.scratch))
    if admin is not None:
        mounts += [Mount("ro", admin / name) for name in REDIRECTING_FILES
                   if (admin / name).exists()]
        mounts.append(Mount("ro", req.tree / ".git"))
    folders, sockets = server_sockets(req.env)
    mounts += [Mount("hide", p) for p in folders] + [Mount("mask", p) for p in sockets]
    return _pinned(mounts)


def _covering(mounts: list[Mount], path: Path, before: int | None = None) -> int | None:
    """The index of the last mount in `mounts` (of the first `before`, when given) that shows
    `path` (it or a folder above it). A plan has a hundred mounts or more and is asked this a
    few hundred times per box, so it compares parts (``is_relative_to`` cost 15 ms a plan)."""
    parts = path.parts
    end = len(mounts) if before is None else before
    for i in range(end - 1, -1, -1):
        folder = mounts[i].path.parts
        if parts[:len(folder)] == folder:
            return i
    return None


def _pinned(mounts: list[Mount]) -> list[Mount]:
    """`mounts` with every folder between a writable mount and a protected path inside it
    pinned, right after that writable mount (before anything mounted inside the folder, which
    a later bind of it would cover)."""
    out = list(mounts)
    i = 0
    while i < len(out):
        if out[i].kind in PROTECTED:
            for folder in reversed(out[i].path.parents):
                at = _covering(out, folder, before=i)
                if at is not None and out[at].kind in ("rw", "pin") and out[at].path != folder:
                    out.insert(at + 1, Mount("pin", folder))
                    i += 1
        i += 1
    return out


def writable_in(mounts: list[Mount], path: Path) -> bool:
    """Would a process in a box of `mounts` be able to write `path`?"""
    at = _covering(mounts, path)
    return at is not None and mounts[at].kind in ("rw", "pin")


def unpinned_ancestors(mounts: list[Mount]) -> list[tuple[Path, Path]]:
    """(folder, protected path) for each folder a boxed process could rename to move a
    read-only or hidden path: writable where the protected path is mounted, and not itself a
    mount point laid before it. Empty for every plan `plan_mounts` makes."""
    found = []
    for i, mount in enumerate(mounts):
        if mount.kind not in PROTECTED:
            continue
        for folder in mount.path.parents:
            at = _covering(mounts, folder, before=i)
            if at is not None and mounts[at].kind in ("rw", "pin") and mounts[at].path != folder:
                found.append((folder, mount.path))
    return found


def tmux_socket_folder(env: Mapping[str, str] = os.environ) -> Path:
    """Where tmux keeps its servers' sockets for this user (`-L NAME` is a socket in it)."""
    uid = os.geteuid() if hasattr(os, "geteuid") else 0
    base = env.get("TMUX_TMPDIR") or "/tmp"
    return Path(os.path.realpath(base)) / f"tmux-{uid}"


def server_sockets(env: Mapping[str, str]) -> tuple[list[Path], list[Path]]:
    """(folders to hide, sockets to mask): every place a server outside the box listens that
    exists now. `env`: the boxed process's; bmad-loop's own environment counts too (its tmux
    server, the user's SSH agent)."""
    uid = os.geteuid() if hasattr(os, "geteuid") else 0
    folders = [tmux_socket_folder(env), tmux_socket_folder(os.environ), Path("/tmp/.X11-unix"),
               Path("/run/screen"), Path(f"/run/user/{uid}")]
    sockets = list(DOCKER_SOCKETS)
    for source in (env, os.environ):
        runtime = source.get("XDG_RUNTIME_DIR") or ""
        if os.path.isabs(runtime):
            folders.append(Path(runtime))
        agent = source.get("SSH_AUTH_SOCK") or ""
        if os.path.isabs(agent):
            sockets.append(Path(agent))
    real_folders = [Path(os.path.realpath(p)) for p in folders]
    real_sockets = [Path(os.path.realpath(p)) for p in sockets]
    return ([p for p in dict.fromkeys(real_folders) if p.is_dir() and p != Path("/")],
            [p for p in dict.fromkeys(real_sockets) if p.exists() and not p.is_dir()])


def home_git_files(env: Mapping[str, str]) -> list[Path]:
    """Git's configuration and credential stores in the home: never writable in the box."""
    home = _home(env)
    if home is None:
        return []
    paths = [home / ".gitconfig", home / ".git-credentials", home / ".config" / "git"]
    xdg = env.get("XDG_CONFIG_HOME")
    if xdg and os.path.isabs(xdg):
        paths.append(Path(xdg) / "git")
    return list(dict.fromkeys(paths))


def admin_entry(tree: Path, git_dir: Path) -> Path | None:
    """The worktree admin entry `tree` uses in the git directory (None: `tree` is the main
    checkout, or not a linked worktree of this repository). Read from the tree's `.git` file,
    as git does."""
    dot_git = tree / ".git"
    try:
        if not dot_git.is_file():
            return None
        line = dot_git.read_text().strip()
    except OSError:
        return None
    if not line.startswith("gitdir:"):
        return None
    entry = Path(line[len("gitdir:"):].strip())
    entry = (tree / entry) if not entry.is_absolute() else entry
    entry = Path(os.path.realpath(entry))
    worktrees = Path(os.path.realpath(git_dir)) / "worktrees"
    return entry if entry.parent == worktrees and entry.is_dir() else None


def box_writable_roots(env: Mapping[str, str]) -> list[Path]:
    """The folders every box of a process with `env` (its TMPDIR and HOME) may write, before
    a project's `[adapter] sandbox_writable`: the system temp folders, `$TMPDIR`, the home."""
    paths = [Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")]
    tmpdir = env.get("TMPDIR")
    if tmpdir and os.path.isabs(tmpdir):
        paths.append(Path(tmpdir))
    home = _home(env)
    if home is not None:
        paths.append(home)
    return paths


def _general_writable(req: BoxRequest) -> list[Path]:
    paths = box_writable_roots(req.env) + [_expand(p, req) for p in req.extra_writable]
    seen: list[Path] = []
    for path in paths:
        path = Path(os.path.realpath(path))
        if path.is_dir() and path != Path("/") and path not in seen:
            seen.append(path)
    return seen


def _expand(raw: str, req: BoxRequest) -> Path:
    """`~/x` in the session's home, an absolute path as it is, a relative one in the project."""
    home = _home(req.env)
    if home is not None and (raw == "~" or raw.startswith("~/")):
        return home / raw[2:]
    path = Path(raw)
    return path if path.is_absolute() else req.project_root / path


def _home(env: Mapping[str, str]) -> Path | None:
    home = env.get("HOME") or ""
    if not os.path.isabs(home):
        return None
    path = Path(os.path.realpath(home))
    return None if path == Path("/") else path
