"""A story's own verify repeated after a crash starts from exactly what the agent left.

A story's verify runs on the agent's uncommitted output in the story's worktree, which must never
be cleaned away; but a verify killed half way (a crash, a lost lease, ``stop --now``) may have
left files, changed tracked ones or set index flags, and the repeat must not see any of it (a
stamp file of the killed run would make it pass).

- **Keep** (`keep`, before a verify starts): the worktree as the agent left it becomes one commit,
  parent HEAD, whose tree is its tracked and untracked files — what ``git stash create`` keeps
  plus the untracked files — made through a temporary index (``read-tree HEAD``, ``add -A``,
  ``write-tree``; not ``stash create`` itself, which refuses an intent-to-add entry). The
  worktree's own index keeps all but its flags (taken off first, as the commit step does,
  `git/worktrees.py`: an edit hidden behind one is recorded). Ignored files and the seed files
  are left out (build output; copied-in files, which may hold secrets). The commit goes to ``refs/bmad-loop/verify/<run>/<story>`` and the story row names it (its
  feedback's ``verify_record``) until the verify's verdict is written, in the same transaction.
- **Restore** (`restore`, a verify that starts while the row still names a record whose ref
  holds it): first the worktree as it is now is kept the same way at ``…/<story>.replaced`` (so
  nothing is ever lost), HEAD's branch put back where the record's parent is (should the killed
  verify have committed), then ``read-tree <record>`` (a plain one: it drops every index flag),
  ``checkout-index --all --force`` (the record's files), ``clean -ffdx`` (whatever the record does
  not hold, ignored files included; the ``[scm] reuse_keep`` folders and the session folder
  stay) and ``read-tree HEAD`` (the index back to the commit, the agent's changes unstaged again
  as they were), and the seed files are copied in again.

Both refs go when the story is ready (`drop_records`: its work is committed); an escalated story keeps
them with its worktree, and ``bmad-loop cleanup`` removes them with it.

Only a story's own worktree is recorded and restored (``isolation = "worktree"``): never a
person's checkout (``isolation = "none"``).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import GitError
from ...git.worktrees import clear_flags
from ...states import Phase
from ..journal import EventKind, record
from ...git.runner import Git

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from ...db.database import Database
    from ...db.models import Story
    from ...policy import Policy
    from ..runpaths import Layout
    from ..workspace.base import Workspace

__all__ = ["put_back", "RECORD_KEY", "VERIFY_RECORD_NAMESPACE", "record_ref", "verify_record_refs",
           "before_verify", "back_to_record", "forget_record", "keep", "restore", "drop_records",
           "kept_evidence", "continue_commands", "continue_lines"]

log = logging.getLogger(__name__)

RECORD_KEY = "verify_record"  # the story row's feedback entry naming the record
VERIFY_RECORD_NAMESPACE = "refs/bmad-loop/verify/"
_SESSION_FOLDER = "/.bmad-loop-session/"  # prompts of the story's sessions (ignored; kept)


def record_ref(run_id: str, story_key: str) -> str:
    return f"{VERIFY_RECORD_NAMESPACE}{run_id}/{story_key}"


def kept_evidence(git: Git, run_id: str, story_key: str) -> str | None:
    """The record ref of an escalated story when it holds the agent's last output (its
    verify failed), else None. The story branch is never moved to it: `resume` would read a
    moved branch as a person's fix and ship the failing work."""
    ref = record_ref(run_id, story_key)
    return ref if git.rev(ref) else None


def continue_commands(run_id: str, story_key: str, ref: str, worktree: str | None) -> list[str]:
    """What a person runs to continue from the kept output, in order: its files into the
    story's worktree (staged); after their fix, one commit of theirs on the story branch;
    resume (which verifies and integrates it as a person's fix)."""
    where = f"git -C {worktree}" if worktree else "git"
    return [f"{where} checkout {ref} -- .",
            f"{where} add -A && {where} commit -m '{story_key}: fix'",
            f"bmad-loop resume {run_id}"]


def continue_lines(run_id: str, story_key: str, ref: str, worktree: str | None) -> list[str]:
    """`continue_commands` for people: what the ref holds, then each step on its own line."""
    checkout, commit, resume = continue_commands(run_id, story_key, ref, worktree)
    return [f"{story_key}: the agent's last output is kept at {ref} (the story branch is not "
            "moved); to continue from it:",
            f"  1. {checkout}", f"  2. fix what failed, then: {commit}", f"  3. {resume}"]


def verify_record_refs(run_id: str, story_key: str) -> tuple[str, str]:
    """The story's record and what a restore replaced."""
    ref = record_ref(run_id, story_key)
    return ref, f"{ref}.replaced"


class RecordingStory(Protocol):
    """What the verify record needs of a story worker's context (a `StoryContext`)."""

    @property
    def run_id(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def git(self) -> Git: ...

    @property
    def db(self) -> Database: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def workspace(self) -> Workspace: ...


class StoryClaim(Protocol):
    """The worker's claim on the story row: every write it makes is fenced by it."""

    def own(self, session: Session) -> Story: ...

    def write(self, session: Session, known: Story | None, /, **values: Any) -> str: ...


def forget_record(known: Story, values: dict[str, Any]) -> None:
    """The worker writes a verify's verdict (`values`, for the row `known`): the row stops
    naming the record in that same write."""
    if (known.feedback or {}).get(RECORD_KEY) and known.phase == Phase.VERIFY:
        values["feedback"] = {**values.get("feedback", known.feedback), RECORD_KEY: None}


def drop_records(ctx: RecordingStory) -> None:
    """The story is ready (its work is committed): its records go."""
    if ctx.policy.verify.commands and ctx.workspace.story_worktrees:
        ctx.git.run("update-ref", "--stdin", input="".join(
            f"delete {ref}\n" for ref in verify_record_refs(ctx.run_id, ctx.key)))


def before_verify(ctx: RecordingStory, claim: StoryClaim, story: Story,
                  worktree: Path) -> str | None:
    """Before the story's verify: keep the worktree as the agent left it, naming the record in
    the row; or, when the row names a record still (this verify repeats one a crash or a stop
    cut short), put the worktree back to it first. The record's SHA; None without verify
    commands, or in a person's checkout (nothing is recorded there)."""
    if not (ctx.policy.verify.commands and ctx.workspace.story_worktrees):
        return None
    ref = record_ref(ctx.run_id, story.key)
    named = (story.feedback or {}).get(RECORD_KEY)
    scratch = ctx.layout.scratch(story.key)
    if named and ctx.git.rev(ref) == named:
        replaced = put_back(ctx, worktree, named, scratch, aside=f"{ref}.replaced")
        with ctx.db.transaction() as s:
            claim.own(s)
            record(s, ctx.run_id, EventKind.VERIFY_RESTORED, story.key, record=named, ref=ref,
                   replaced=replaced)
        return named
    sha = keep(ctx.git, worktree, ref, scratch, ctx.workspace.seeds)
    with ctx.db.transaction() as s:
        claim.write(s, story, feedback={**(story.feedback or {}), RECORD_KEY: sha})
    return sha


def back_to_record(ctx: RecordingStory, key: str, worktree: Path, sha: str) -> None:
    """A retry of the story's verify (`[verify] retries`) starts from exactly what the agent
    left, as a repeated verify does: the worktree put back to its record `sha`."""
    ref = record_ref(ctx.run_id, key)
    put_back(ctx, worktree, sha, ctx.layout.scratch(key), aside=f"{ref}.replaced")


def put_back(ctx: RecordingStory, worktree: Path, sha: str, scratch: Path, *,
             aside: str) -> str | None:
    """`restore` a story's worktree to a record of it (its verify's, a session's start, a
    repair's merge) the one way: with the workspace's seeds and the policy's kept folders, the
    seeds laid again after. Returns what `restore` returns."""
    replaced = restore(ctx.git, worktree, sha, scratch, aside=aside, seeds=ctx.workspace.seeds,
                       keep_folders=ctx.policy.scm.reuse_keep)
    ctx.workspace.reseed(worktree)
    return replaced


def keep(git: Git, worktree: Path, ref: str, scratch: Path, seeds: Iterable[str] = (), *,
         what: str = "verify record") -> str:
    """Record `worktree` as it is at `ref`; the record's SHA (`what`: its commit message)."""
    sha = _snapshot(git, worktree, scratch, seeds, what)
    git.run("update-ref", ref, sha)
    return sha


def restore(git: Git, worktree: Path, sha: str, scratch: Path, *, aside: str,
            seeds: Iterable[str] = (), keep_folders: Iterable[str] = ()) -> str | None:
    """Put `worktree` back to the record `sha` (the row names it). What the worktree held
    before is kept at the ref `aside` (``<record ref>.replaced``); its SHA is returned (None: git could
    not record it, e.g. the killed verify left a nested repository with no commit, which
    ``add`` refuses; the restore goes on, since the record is what counts)."""
    try:
        replaced = _snapshot(git, worktree, scratch, seeds, "what a repeated verify replaced")
        git.run("update-ref", aside, replaced)
    except GitError as exc:
        log.warning("could not keep what %s held before its restore (%s)", worktree, exc)
        replaced = None
    head = git.out("rev-parse", f"{sha}^", cwd=worktree)
    if git.rev("HEAD", cwd=worktree) != head:  # the killed verify committed: not the agent's
        git.run("update-ref", "-m", "bmad-loop: restore the agent's output", "HEAD", head,
                cwd=worktree)
    git.run("read-tree", sha, cwd=worktree)
    git.run("checkout-index", "--all", "--force", cwd=worktree)
    _clean(git, worktree, keep_folders)
    git.run("read-tree", "HEAD", cwd=worktree)
    return replaced


def _snapshot(git: Git, worktree: Path, scratch: Path, seeds: Iterable[str], what: str) -> str:
    """A commit (parent HEAD) of `worktree`'s tracked and untracked files, seeds left out,
    through a temporary index. (Not ``stash create``: it refuses an intent-to-add entry.)"""
    clear_flags(git, worktree)  # the commit step takes them off too: an edit hidden is an edit
    scratch.mkdir(parents=True, exist_ok=True)
    index = scratch / "verify-record.index"
    index.unlink(missing_ok=True)
    env = {"GIT_INDEX_FILE": os.fspath(index.resolve()), "GIT_LITERAL_PATHSPECS": "1"}
    try:
        # HEAD's tree into the temporary index, with the worktree index's stat data for the
        # entries that match it, so `add` hashes only what changed (from an empty index it
        # hashed every file: 35 of 45 ms on 2,000 files). `--reset`: an unmerged entry an agent
        # left is dropped, not refused; the worktree's own index is read, never written.
        git.run("read-tree", "--reset", f"--index-output={env['GIT_INDEX_FILE']}", "HEAD",
                cwd=worktree)
        git.run("add", "-A", cwd=worktree, env=env)
        names = [s.rstrip("/") for s in seeds]
        if names:  # never recorded: copied-in files may hold secrets
            git.run("rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", *names,
                    cwd=worktree, env=env)
        tree = git.out("write-tree", cwd=worktree, env=env)
    finally:
        index.unlink(missing_ok=True)
    return git.out("commit-tree", tree, "-p", "HEAD", "-m", f"bmad-loop: {what}", cwd=worktree,
                   env=git.identity_env())


def _clean(git: Git, worktree: Path, keep_folders: Iterable[str]) -> None:
    """``clean -ffdx`` but for the kept folders and the session folder; a folder the verify
    made read-only is made writable and the clean run again."""
    args = ["clean", "-q", "-ffdx", "-e", _SESSION_FOLDER]
    for pattern in keep_folders:
        args += ["-e", pattern if pattern.startswith("/") else "/" + pattern]
    try:
        git.run(*args, cwd=worktree)
    except GitError:
        _writable_folders(worktree)
        git.run(*args, cwd=worktree)


def _writable_folders(top: Path) -> None:
    for root, dirs, _files in os.walk(top):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | stat.S_IRWXU)
