"""Code an agent could plant in git's configuration: kept out of bmad-loop's own git, or detected.

Hooks, ``core.hooksPath`` and ``core.fsmonitor`` run inside *any* git process in a repository.
bmad-loop's own git runs with ``-c core.hooksPath=/dev/null -c core.fsmonitor=false`` (see
`runner`), so none of them runs there. The hooks a project names in ``[scm] run_hooks`` (say
``["pre-commit"]``) run from a private folder, ``<git-common-dir>/bmad-loop-hooks/``, made by
`pin_hooks`: one small wrapper per named hook, holding the absolute path of the project's hook
(``core.hooksPath`` as the project's own configuration sets it, else ``<git-common-dir>/hooks``)
and its blob id when it was pinned. The wrapper runs the hook at its own path (so a hook that
sources files beside it still works) only while its content is still the pinned one; a changed
hook is refused. It is pinned the first time a `Git` with `run_hooks` runs a command in a
repository without pins, and again by `Git.repin_hooks()` when a human is in charge.

Filters (Git LFS must keep storing pointers), merge and diff drivers, ``core.sshCommand``,
``gpg.program`` and the rest stay on; the defence there is detection. `fingerprint` digests the
repository's git configuration as git reads it (every scope but the command line, includes
followed, per key), every ``config.worktree``, the hooks folders (the project's, the common
``hooks`` and the pinned one) and ``info/attributes``. The worker takes one when an agent
session starts and compares when it ends, before bmad-loop runs any other git for that story;
`changes` names what differs (``<file>: <key>`` or ``<file>``). ``branch.*`` keys (upstream
tracking an agent's ``push -u`` writes) run no code and are left out.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import stat
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

__all__ = ["project_hooks_dir", "pin_hooks", "fingerprint", "changes", "changed_files",
           "config_entries",
           "ConfigWatch", "PINNED_DIRNAME", "CONFIG_CHANGED_PREFIX"]

PINNED_DIRNAME = "bmad-loop-hooks"
CONFIG_CHANGED_PREFIX = "git configuration changed"
_MANIFEST = ".pinned.json"
_BENIGN_PREFIXES = ("branch.",)
_MAX_HOOK_FILES = 500

WRAPPER = """#!/bin/sh
# bmad-loop: the project's {name} hook, pinned (see bmad_loop/git/config_guard.py)
hook={path}
if [ "$(git hash-object --no-filters -- "$hook" 2>/dev/null)" != "{blob}" ]; then
  echo "bmad-loop: refusing to run $hook: it changed since bmad-loop pinned it" >&2
  exit 1
fi
exec "$hook" "$@"
"""


class GitCommands(Protocol):
    """What the guard needs of a repository's git (`runner.Git`, which pins its hooks here and
    so cannot be imported): its folder and common dir, and commands run there."""

    repo_dir: Path

    def common_dir(self) -> Path: ...

    def run(self, *args: object, cwd: Path | None = None,
            check: bool = True) -> subprocess.CompletedProcess[Any]: ...

    def out(self, *args: object, **kw: Any) -> str: ...


# -- the project's hooks ------------------------------------------------------------------------


Entry = tuple[str, str, str, str]  # (scope, origin, key, value) of one configuration entry


def config_entries(git: GitCommands, cwd: Path) -> list[Entry] | None:
    """Every configuration entry git reads in `cwd`, or None when git could not read them (a
    broken configuration file: git's own commands will say why)."""
    found, error = _config_entries(git, Path(cwd))
    return None if error is not None else found


def _config_entries(git: GitCommands, cwd: Path) -> tuple[list[Entry], str | None]:
    """(scope, origin, key, value) of every configuration entry git reads in `cwd`, the command
    line's left out; and git's complaint when it cannot read them."""
    proc = git.run("config", "--list", "-z", "--show-origin", "--show-scope", "--includes",
                   cwd=cwd, check=False)
    if proc.returncode != 0:
        return [], (proc.stderr or "").strip() or f"git config exit {proc.returncode}"
    fields = proc.stdout.split("\0")
    entries: list[Entry] = []
    for i in range(0, len(fields) - 2, 3):
        scope, origin, item = fields[i], fields[i + 1], fields[i + 2]
        if scope == "command":
            continue
        key, _, value = item.partition("\n")
        entries.append((scope, _origin(origin, cwd), key.lower(), value))
    return entries, None


def _origin(origin: str, cwd: Path) -> str:
    kind, _, where = origin.partition(":")
    if kind == "file" and where and not os.path.isabs(where):
        return os.path.normpath(os.path.join(cwd, where))
    return where or origin


def project_hooks_dir(git: GitCommands, cwd: Path | None = None) -> Path:
    """Where the project's own hooks are: its ``core.hooksPath`` (relative to the worktree root,
    ``~`` expanded) or ``<git-common-dir>/hooks``. bmad-loop's command-line override is not
    counted."""
    cwd = Path(cwd if cwd is not None else git.repo_dir)
    entries, _ = _config_entries(git, cwd)
    values = [value for _s, _o, key, value in entries if key == "core.hookspath"]
    if values and values[-1]:
        path = Path(os.path.expanduser(values[-1]))
        if not path.is_absolute():
            top = git.run("rev-parse", "--show-toplevel", cwd=cwd, check=False).stdout.strip()
            path = Path(top or cwd) / path
        return path
    return git.common_dir() / "hooks"


def pin_hooks(git: GitCommands, names: Iterable[str], *, refresh: bool = False) -> Path:
    """The private hooks folder holding a pinned wrapper for each named hook the project has
    (see the module's docstring); made when missing or naming other hooks, or on `refresh`."""
    folder = git.common_dir() / PINNED_DIRNAME
    wanted = sorted(set(names))
    manifest = folder / _MANIFEST
    if not refresh:
        try:
            if json.loads(manifest.read_text()).get("names") == wanted:
                return folder
        except (OSError, ValueError):
            pass
    source = project_hooks_dir(git)
    folder.mkdir(exist_ok=True)
    pinned: dict[str, dict[str, str]] = {}
    for name in wanted:
        hook = source / name
        if hook.is_file() and os.access(hook, os.X_OK):
            blob = git.out("hash-object", "--no-filters", "--", hook)
            _write(folder / name, WRAPPER.format(name=name, path=shlex.quote(str(hook)),
                                                 blob=blob), executable=True)
            pinned[name] = {"path": str(hook), "blob": blob}
        else:
            (folder / name).unlink(missing_ok=True)
    for entry in os.listdir(folder):
        if entry not in pinned and entry != _MANIFEST and not entry.endswith(".tmp"):
            path = folder / entry
            if path.is_file() or path.is_symlink():
                path.unlink(missing_ok=True)
    _write(manifest, json.dumps({"names": wanted, "hooks": pinned}, indent=1))
    return folder


def _write(path: Path, text: str, *, executable: bool = False) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    if executable:
        tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(tmp, path)


# -- the fingerprint ----------------------------------------------------------------------------


def fingerprint(git: GitCommands, worktree: Path | None = None) -> dict[str, str]:
    """label -> digest of everything in git's configuration that can make git run code."""
    cwd = Path(worktree if worktree is not None else git.repo_dir)
    common = git.common_dir()
    parts: dict[str, str] = {}
    entries, error = _config_entries(git, cwd)
    if error is not None:
        parts["git config"] = _digest(error.encode())
    grouped: dict[str, list[str]] = {}
    for _scope, origin, key, value in entries:
        if not key.startswith(_BENIGN_PREFIXES):
            grouped.setdefault(f"{origin}: {key}", []).append(value)
    parts.update({label: _digest("\0".join(v).encode()) for label, v in grouped.items()})
    for path in _config_worktree_files(common):
        parts[str(path)] = _file_digest(path)
    hook_dirs = {common / "hooks", common / PINNED_DIRNAME}
    for _scope, origin, key, value in entries:
        if key == "core.hookspath" and value:
            path = Path(os.path.expanduser(value))
            hook_dirs.add(path if path.is_absolute() else Path(git.repo_dir) / path)
        if key == "core.attributesfile" and value:
            path = Path(os.path.expanduser(value))
            parts[f"attributes file {path}"] = _file_digest(path)
    for folder in sorted(hook_dirs):
        for path in _files(folder):
            parts[str(path)] = _file_digest(path)
    attributes = common / "info" / "attributes"
    if attributes.exists():
        parts[str(attributes)] = _file_digest(attributes)
    return parts


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Labels added, removed or changed between two fingerprints, sorted."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def changed_files(labels: Iterable[str]) -> list[str]:
    """The files behind `changes` labels (``<file>: <key>`` -> ``<file>``), in order, once."""
    return list(dict.fromkeys(label.split(": ", 1)[0] for label in labels))


def _config_worktree_files(common: Path) -> list[Path]:
    found = [common / "config.worktree"]
    try:
        found += [common / "worktrees" / name / "config.worktree"
                  for name in sorted(os.listdir(common / "worktrees"))]
    except OSError:
        pass
    return [p for p in found if os.path.lexists(p)]


def _files(folder: Path) -> list[Path]:
    found: list[Path] = []
    try:
        for root, dirs, files in os.walk(folder):
            depth = len(Path(root).relative_to(folder).parts)
            if depth >= 2:
                dirs[:] = []
            found.extend(Path(root) / f for f in files
                         if not f.endswith(".tmp") and f != _MANIFEST)
            if len(found) > _MAX_HOOK_FILES:
                break
    except (OSError, ValueError):
        pass
    return sorted(found)[:_MAX_HOOK_FILES]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_digest(path: Path) -> str:
    try:
        if path.is_symlink():
            return "link:" + os.readlink(path)
        mode = "x" if os.access(path, os.X_OK) else "-"
        return mode + _digest(path.read_bytes())
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


class ConfigWatch:
    """Fingerprint before an agent session, compare after it.

    `state_file` keeps the baseline on disk while the session runs: if bmad-loop dies during
    the session, the next session of the story starts from that baseline instead of a new one,
    so a change made by the session that was cut short is still found."""

    def __init__(self, git: GitCommands, worktree: Path, state_file: Path | None = None) -> None:
        self.git, self.worktree, self.state_file = git, Path(worktree), state_file
        self.baseline: dict[str, str] | None = None

    def begin(self) -> None:
        if self.state_file is not None:
            try:
                self.baseline = json.loads(self.state_file.read_text())
            except (OSError, ValueError):
                self.baseline = None
        if self.baseline is None:
            self.baseline = fingerprint(self.git, self.worktree)
        if self.state_file is not None:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            _write(self.state_file, json.dumps(self.baseline))

    def end(self) -> list[str]:
        """What changed since `begin` (empty: nothing). The baseline is dropped either way: a
        change is reported once, and a human who keeps it has accepted it."""
        found = changes(self.baseline or {}, fingerprint(self.git, self.worktree))
        if self.state_file is not None:
            self.state_file.unlink(missing_ok=True)
        return found
