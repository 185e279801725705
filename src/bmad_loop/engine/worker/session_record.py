"""An agent session re-run after a crash starts from the tree its cut-short run started from.

A session (any phase: create, dev, review, fix, repair, ...) killed half way — a kill -9 of
bmad-loop, a lost lease, ``stop --now``, an agent fault that charges nothing — is run again
with the same phase and number. Its first run may have left files behind (an appending agent
appended), and the re-run must not start from them, or the story's commit takes the work twice.

- **Keep** (before the agent starts): the worktree as it is becomes one commit, made the way a
  story verify records the agent's output (verify_record.py: tracked and untracked files,
  seeds and ignored files left out, parent HEAD), at
  ``refs/bmad-loop/<run>/sessions/<story>/<phase>-<number>``; the story row names it (its
  feedback's ``session_record``: phase, number, sha) until the session's outcome is written,
  in that same transaction (`forget_session_record`).
- **Restore** (a session that starts while the row names its own record, same phase and
  number, whose ref still holds it): the worktree as the cut-short run left it is kept at
  ``<ref>.cut`` (the evidence: what that run wrote), then put back to exactly the record (and
  HEAD where the record's parent is, should that run have committed), seeds copied in again,
  and ``session.restored`` journaled.

The start records go when the story is ready (`drop_session_records`); the ``.cut`` refs stay,
under the run's own ref namespace, until ``cleanup --runs`` prunes the finished run. Only a
story's own worktree is recorded and restored, never a person's checkout (``isolation =
"none"``), as for verify.
"""

from __future__ import annotations

from pathlib import Path

from ..journal import record
from ..verification.record import keep, restore

__all__ = ["SESSION_RECORD_KEY", "SESSION_REF_PATTERN", "session_ref", "session_ref_owner",
           "before_session", "forget_session_record", "drop_session_records"]

SESSION_RECORD_KEY = "session_record"  # the story row's feedback entry naming the record
CUT_SUFFIX = ".cut"
SESSION_REF_PATTERN = "refs/bmad-loop/*/sessions/*/*"  # every run's, for `for-each-ref`


def session_ref(run_id: str, story_key: str, phase: str, number: int) -> str:
    return f"refs/bmad-loop/{run_id}/sessions/{story_key}/{phase}-{number}"


def session_ref_owner(ref: str) -> tuple[str, str, bool] | None:
    """(run, story, is it a cut-short run's evidence) of a session ref; None for another ref."""
    parts = ref.split("/")
    if len(parts) != 6 or parts[:2] != ["refs", "bmad-loop"] or parts[3] != "sessions":
        return None
    return parts[2], parts[4], parts[5].endswith(CUT_SUFFIX)


def before_session(ctx, claim, story, phase: str, number: int) -> None:
    """Before an agent session of the claimed story: record where it starts, or, when the row
    names this very session's record (it is a re-run), put the worktree back to it first."""
    if not ctx.workspace.story_worktrees or not story.worktree:
        return
    worktree = Path(story.worktree)
    ref = session_ref(ctx.run_id, story.key, phase, number)
    named = (story.feedback or {}).get(SESSION_RECORD_KEY) or {}
    sha = named.get("sha")
    scratch = ctx.layout.scratch(story.key)
    if (named.get("phase"), named.get("number")) == (phase, number) and sha \
            and ctx.git.rev(ref) == sha:
        cut = restore(ctx.git, worktree, sha, scratch, aside=f"{ref}{CUT_SUFFIX}",
                      seeds=ctx.workspace.seeds, keep_folders=ctx.policy.scm.reuse_keep)
        ctx.workspace.reseed(worktree)
        with ctx.db.transaction() as s:
            claim.own(s)
            record(s, ctx.run_id, "session.restored", story.key, phase=phase, attempt=number,
                   record=sha, ref=ref, cut=cut, cut_ref=f"{ref}{CUT_SUFFIX}" if cut else None)
        return
    sha = keep(ctx.git, worktree, ref, scratch, ctx.workspace.seeds, what="session start")
    with ctx.db.transaction() as s:
        claim.write(s, story, feedback={**(story.feedback or {}), SESSION_RECORD_KEY:
                                        {"phase": phase, "number": number, "sha": sha}})


def forget_session_record(known, values: dict) -> None:
    """A session's outcome is written (for the row `known`): the row stops naming its record
    in that same write."""
    if (known.feedback or {}).get(SESSION_RECORD_KEY):
        values["feedback"] = {**values.get("feedback", known.feedback), SESSION_RECORD_KEY: None}


def drop_session_records(ctx) -> None:
    """The story is ready (its work is committed): its start records go; what a cut-short
    session left (``.cut``) stays as evidence until the run is pruned."""
    if not ctx.workspace.story_worktrees:
        return
    prefix = f"refs/bmad-loop/{ctx.run_id}/sessions/{ctx.key}/"
    refs = [r for r in ctx.git.out("for-each-ref", "--format=%(refname)", prefix).splitlines()
            if r and not r.endswith(CUT_SUFFIX)]
    if refs:
        ctx.git.run("update-ref", "--stdin", input="".join(f"delete {r}\n" for r in refs))
