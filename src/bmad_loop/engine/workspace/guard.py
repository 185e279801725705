"""The target guard: agents in story worktrees cannot move the target branch, not even briefly.

Every git process an agent starts (and verification in its worktree) gets, through git's
environment-only configuration (`GIT_CONFIG_COUNT`/`KEY`/`VALUE`), a `core.hooksPath` pointing
at a hook folder bmad-loop owns. Its `reference-transaction` hook runs in the "prepared" state
of every ref update — commit, `update-ref`, `branch -f`, `reset`, and the receiving side of
and aborts the whole transaction when it would change the target
ref, before the ref is written; its `pre-push` hook refuses any push to the target's name
(`git push . HEAD:<target>`, or to a remote) before anything is sent. The attempt is appended to a guard log the worker reads after
the session; the story then escalates. Every other hook in the folder hands over to the
repository's own hook of that name, so the project's pre-commit and friends still run.

The repository's own hooks are where the project's configuration puts them (`core.hooksPath`,
else the common `hooks` folder), found without bmad-loop's own `-c core.hooksPath=/dev/null`.
bmad-loop's own git never runs this folder (see git/runner.py); it is only for the agents' processes.

Limits (documented): an agent that edits `.git` files directly, or clears its environment
before calling git, is outside what a hook can see.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from ...git.config_guard import project_hooks_dir
from ...git.runner import Git

__all__ = ["guard_env", "read_guard_log", "install_hooks"]

PASS_THROUGH = (
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
    "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout",
    "post-merge", "pre-receive", "update", "proc-receive", "post-receive",
    "post-update", "push-to-checkout", "pre-auto-gc", "post-rewrite", "sendemail-validate",
    "fsmonitor-watchman", "post-index-change",
)

REFERENCE_TRANSACTION = """#!/bin/sh
# bmad-loop target guard (see bmad_loop/engine/workspace/guard.py)
input=$(cat)
if [ "$1" = "prepared" ] && [ -n "$BMAD_LOOP_GUARD_REF" ]; then
  refused=$(printf '%s\\n' "$input" | while read -r old new ref; do
    if [ "$ref" = "$BMAD_LOOP_GUARD_REF" ] && [ "$old" != "$new" ]; then
      echo "$old $new $ref"
    fi
  done)
  if [ -n "$refused" ]; then
    printf '%s\\n' "$refused" >> "$BMAD_LOOP_GUARD_LOG"
    echo "bmad-loop: refused: $BMAD_LOOP_GUARD_REF is the target branch; only the integration lane moves it" >&2
    exit 1
  fi
fi
orig="$BMAD_LOOP_ORIG_HOOKS/reference-transaction"
if [ -n "$BMAD_LOOP_ORIG_HOOKS" ] && [ -x "$orig" ]; then
  printf '%s\\n' "$input" | "$orig" "$@"
  exit $?
fi
exit 0
"""

# `git push` hands the receiving side a cleaned environment (no GIT_CONFIG_*), so a push is
# stopped on the sending side instead, before anything is transferred.
PRE_PUSH = """#!/bin/sh
# bmad-loop target guard (see bmad_loop/engine/workspace/guard.py)
input=$(cat)
if [ -n "$BMAD_LOOP_GUARD_REF" ]; then
  refused=$(printf '%s\\n' "$input" | while read -r local_ref local_sha remote_ref remote_sha; do
    if [ "$remote_ref" = "$BMAD_LOOP_GUARD_REF" ]; then
      echo "$remote_sha $local_sha $remote_ref (push to $2)"
    fi
  done)
  if [ -n "$refused" ]; then
    printf '%s\\n' "$refused" >> "$BMAD_LOOP_GUARD_LOG"
    echo "bmad-loop: refused: pushing to $BMAD_LOOP_GUARD_REF; only the integration lane moves the target" >&2
    exit 1
  fi
fi
orig="$BMAD_LOOP_ORIG_HOOKS/pre-push"
if [ -n "$BMAD_LOOP_ORIG_HOOKS" ] && [ -x "$orig" ]; then
  printf '%s\\n' "$input" | "$orig" "$@"
  exit $?
fi
exit 0
"""

PASS_THROUGH_HOOK = """#!/bin/sh
# bmad-loop: hand over to the repository's own {name} hook, if it has one.
orig="$BMAD_LOOP_ORIG_HOOKS/{name}"
if [ -n "$BMAD_LOOP_ORIG_HOOKS" ] && [ -x "$orig" ]; then
  exec "$orig" "$@"
fi
exit 0
"""


def install_hooks(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    files = {"reference-transaction": REFERENCE_TRANSACTION, "pre-push": PRE_PUSH}
    files.update({name: PASS_THROUGH_HOOK.format(name=name) for name in PASS_THROUGH})
    for name, text in files.items():
        path = folder / name
        if not path.exists() or path.read_text() != text:
            # A temp name per writer: workers install the same folder at the same moment.
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(text)
            tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            os.replace(tmp, path)
    return folder


def guard_env(git: Git, worktree: Path, target_branch: str, hooks_dir: Path,
              guard_log: Path) -> dict:
    """Environment that arms the guard for every git process started with it."""
    install_hooks(hooks_dir)
    original_path = project_hooks_dir(git, worktree)
    guard_log.parent.mkdir(parents=True, exist_ok=True)
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "core.hooksPath",
        "GIT_CONFIG_VALUE_0": str(hooks_dir),
        "BMAD_LOOP_GUARD_REF": f"refs/heads/{target_branch}",
        "BMAD_LOOP_GUARD_LOG": str(guard_log),
        "BMAD_LOOP_ORIG_HOOKS": str(original_path),
    }


def read_guard_log(path: Path, offset: int = 0) -> list[str]:
    try:
        with open(path) as handle:
            handle.seek(offset)
            return [line.strip() for line in handle if line.strip()]
    except OSError:
        return []
