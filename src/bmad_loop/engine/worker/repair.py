"""The repair phase in a story's worker: the target merged in by bmad-loop, the agent mends it.

The lane sends a story back here when its candidate failed on the current target while its own
verify passed, or did not compose (engine/lane/blame.py; the request: engine/repairs.py). Then:

1. **The merge** (bmad-loop itself, outside the box). It is composed like a candidate: git's
   merge of the story's head with the target the lane named (`merge-tree`, the target's
   committed `.gitattributes`), the `[integration] merge` rules, lane-owned files as the target
   has them. The merged tree — with git's conflict markers where it could not merge — is kept as
   a commit whose parents are the story's head and the target, at `refs/bmad-loop/repair/<run>/
   <story>`, named in the row (`MERGE_KEY`), and the worktree is made exactly that tree while
   its branch stays at the story's head. In that same transaction the story's `base_sha` moves to
   the merged-in target (journaled in `repair.started`): drift, the review's diff,
   `BMAD_LOOP_BASE_SHA` and the ledger guard measure from it from now on.
2. **The session** (`repair`, one of `[limits] max_repairs`): the prompt says what failed and
   which stories landed since the story began; a custom command also gets the cause and a JSON
   evidence file. A session cut short (a crash, a stop) starts again from the recorded merge, never
   from what it left. A conflict marker left in a conflicted file fails the repair.
3. **The usual loop**: verify (fix rounds count like dev attempts, `max_dev_attempts` afresh for
   each repair), review if enabled, then the commit: the two-parent merge with exactly the
   parents bmad-loop chose (never what a `MERGE_HEAD` says), dated from its inputs. Back to the
   lane for a fresh candidate.

A repair that fails (the session, a marker left, verify out of fix rounds) starts another one
from a fresh merge while `max_repairs` lasts; then the story escalates, its worktree left as the
last repair left it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from ...fileio import write_beneath
from ...git.trees.compose import Settling, compose
from ...git.trees.settle import Generators
from ...db.models import Story
from ...states import Phase
from ..crashpoints import crash_point
from ..mergerules import run_merge_rules
from ..journal import EventKind, record
from .context import Outcome, StoryContext, Walker
from ..repairs import MERGE_KEY, REPAIR_KEY, in_repair, repair_markdown, repair_ref
from ..verification.record import put_back

__all__ = ["Repair", "markers_left", "repair_env", "repair_prompt_text", "EVIDENCE_VAR",
           "CAUSE_VAR"]

EVIDENCE_VAR = "BMAD_LOOP_REPAIR_EVIDENCE"  # a repair session's evidence file (JSON)
CAUSE_VAR = "BMAD_LOOP_REPAIR_CAUSE"  # conflict | verify-failed
_MARKERS = (b"<<<<<<< ", b">>>>>>> ")


def markers_left(worktree: Path, paths: Iterable[str]) -> list[str]:
    """The `paths` (repository-relative) whose file still holds a conflict marker line."""
    left: list[str] = []
    for rel in paths:
        path = Path(worktree) / rel
        if path.is_symlink() or not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if any(line.startswith(_MARKERS) for line in data.splitlines()):
            left.append(rel)
    return left


def repair_prompt_text(story: Story, target_branch: str) -> str:
    """The repair session's account of what failed (`PromptSpec.repair`)."""
    feedback = story.feedback or {}
    merge = feedback.get(MERGE_KEY) or {}
    return repair_markdown(feedback.get(REPAIR_KEY) or {}, target_branch, merge.get("conflicts") or ())


def repair_env(ctx: StoryContext, story: Story, number: int, worktree: Path,
               session_dir: str) -> dict[str, str]:
    """A repair session's own variables: the cause and the evidence file, written now into the
    session's folder in the worktree (where a boxed agent can read it), through no link."""
    feedback = story.feedback or {}
    request, merge = feedback.get(REPAIR_KEY) or {}, feedback.get(MERGE_KEY) or {}
    evidence = {**request, "number": number, "conflicts": merge.get("conflicts")
                or request.get("conflicts") or [], "base_sha": story.base_sha,
                "previous_failure": feedback.get("verify_output") or None}
    text = json.dumps(evidence, indent=2, sort_keys=True)
    path = write_beneath(worktree, f"{session_dir}/repair-{number}.json", text.encode(), own=True)
    kept = ctx.layout.repair_evidence(ctx.key, number)  # stays after the worktree goes
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(text)
    return {CAUSE_VAR: str(request.get("cause") or ""), EVIDENCE_VAR: os.fspath(path)}


class Repair:
    """The repair of the story its `StoryWorker` walks."""

    def __init__(self, worker: Walker):
        self.worker = worker
        self.ctx = worker.ctx
        self.policy = worker.ctx.policy
        self.finished = False  # committed as the merge in this walk: its record goes at ready

    # ----------------------------------------------------------------- the phase
    def phase(self) -> Outcome:
        story = self.worker.last_row or self.worker.claim.load()
        if not in_repair(story):  # e.g. a person's retry cleared it: nothing to repair
            return Outcome(Phase.VERIFY)
        merge = self._merged(story)
        story = self.worker.last_row or self.worker.claim.load()
        number = story.repairs + 1
        result = self.worker.session(Phase.REPAIR, number)
        counted = {"repairs": 1, "dev_attempts": 1}
        if not result.ok:
            return self.failed(story, f"repair session {number} failed: {result.summary}",
                               session=result, counters=counted, used=number)
        assert story.worktree is not None  # the prepare phase made it
        left = markers_left(Path(story.worktree), merge.get("conflicts") or ())
        if left:
            return self.failed(story, f"repair session {number} left conflict markers in "
                               + ", ".join(left[:10]), session=result, counters=counted,
                               used=number)
        return Outcome(Phase.VERIFY, session=result, counters=counted,
                       feedback={"verify_output": ""}, values={"after_phase": None})

    def verify_failed(self, story: Story, event: tuple[str, dict[str, Any]],
                      feedback: dict[str, Any]) -> Outcome:
        """The story's verify failed during a repair: a fix round while dev attempts last."""
        if story.dev_attempts >= self.policy.limits.max_dev_attempts:
            return self.failed(story, f"verify failed after repair {story.repairs} and "
                               f"{story.dev_attempts - 1} fix round(s): {feedback.get('verify_command')}",
                               events=[event], output=feedback.get("verify_output", ""))
        return Outcome(Phase.FIX, events=[event], feedback=feedback)

    def failed(self, story: Story, reason: str, *, used: int | None = None, output: str = "",
               **outcome: Any) -> Outcome:
        """This repair failed: another from a fresh merge while `max_repairs` lasts, else the
        story escalates (its worktree as the repair left it)."""
        used = story.repairs if used is None else used
        request = (story.feedback or {}).get(REPAIR_KEY) or {}
        done = {"number": used, "cause": request.get("cause"), "reason": reason}
        events: list[tuple[str, dict[str, Any]]] = list(outcome.pop("events", []))
        limit = self.policy.limits.max_repairs
        if used >= limit:
            events.append((EventKind.REPAIR_FINISHED, {**done, "outcome": "escalated"}))
            return Outcome(escalate=f"repairs used up ({used} of max_repairs = {limit}): {reason}",
                           events=events, **outcome)
        events.append((EventKind.REPAIR_FINISHED, {**done, "outcome": "again"}))
        why = reason + (f"\n\n{output[-8000:]}" if output else "")
        return Outcome(Phase.REPAIR, events=events,
                       feedback={"verify_output": why, MERGE_KEY: None},
                       values={"dev_attempts": 0, "review_cycles": 0, "after_phase": None},
                       **outcome)

    # ----------------------------------------------------------------- the commit
    def merge_parents(self, story: Story) -> list[str] | None:
        """The parents of a repaired story's commit: its head and the merged-in target."""
        merge = (story.feedback or {}).get(MERGE_KEY)
        if not in_repair(story) or not merge:
            return None
        return [merge["head"], merge["target_sha"]]

    def ready_events(self, story: Story) -> list[tuple[str, dict[str, Any]]]:
        request = (story.feedback or {}).get(REPAIR_KEY) or {}
        self.finished = True
        return [(EventKind.REPAIR_FINISHED, {"number": story.repairs, "cause": request.get("cause"),
                                     "outcome": "ready", "reason": None})]

    def drop_ref(self) -> None:
        """The story is ready again: its repair's record goes."""
        ref, git = repair_ref(self.ctx.run_id, self.ctx.key), self.ctx.git
        found = git.out("for-each-ref", "--format=%(refname)", ref, f"{ref}.replaced").split()
        if found:  # the merge's record, and what a restore of it replaced
            git.run("update-ref", "--stdin", input="".join(f"delete {r}\n" for r in found))

    # ----------------------------------------------------------------- the merge
    def _merged(self, story: Story) -> dict[str, Any]:
        """The merge in the worktree: restored from its record when the row names one (a
        session cut short starts from it again), else made now."""
        ctx, git = self.ctx, self.ctx.git
        assert story.worktree is not None  # the prepare phase made it
        worktree = Path(story.worktree)
        ref = repair_ref(ctx.run_id, story.key)
        merge = (story.feedback or {}).get(MERGE_KEY)
        if merge and git.rev(ref) == merge["record"]:
            replaced = put_back(ctx, worktree, merge["record"], ctx.layout.scratch(story.key),
                                aside=f"{ref}.replaced")
            with ctx.db.transaction() as s:
                self.worker.claim.own(s)
                record(s, ctx.run_id, EventKind.REPAIR_STARTED, story.key, number=story.repairs + 1,
                       resumed=True, record=merge["record"], replaced=replaced,
                       target_sha=merge["target_sha"])
            return merge
        request = story.feedback[REPAIR_KEY]
        target_sha, head = request["target_sha"], story.head_sha
        assert head is not None  # a story sent to repair was committed
        tree, conflicts = self._compose(story, target_sha, head)
        sha = git.out("commit-tree", tree, "-p", head, "-p", target_sha, "-m",
                      f"bmad-loop: repair merge of {story.key} (not a commit of the story)",
                      env=git.identity_env(git.commit_date(head)))
        git.run("update-ref", ref, sha)
        merge = {"record": sha, "head": head, "target_sha": target_sha,
                 "conflicts": list(conflicts), "old_base": story.base_sha}
        with ctx.db.transaction() as s:
            self.worker.claim.write(s, story, base_sha=target_sha, stacked_on=None,
                                    feedback={**(story.feedback or {}), MERGE_KEY: merge})
            record(s, ctx.run_id, EventKind.REPAIR_STARTED, story.key, number=story.repairs + 1,
                   cause=request.get("cause"), target_sha=target_sha, head_sha=head,
                   old_base=story.base_sha, new_base=target_sha, conflicts=list(conflicts),
                   record=sha)
        crash_point("worker.after_repair_merge")
        put_back(ctx, worktree, sha, ctx.layout.scratch(story.key), aside=f"{ref}.replaced")
        return merge

    def _compose(self, story: Story, target_sha: str, head: str) -> tuple[str, tuple[str, ...]]:
        """The merged tree and the paths git left with markers: merged like a candidate."""
        ctx = self.ctx
        rules = run_merge_rules(self.policy, ctx.workspace.root, ctx.board_rel)
        comp = compose(ctx.git, "merge", target_sha, head, f"repair merge of {story.key}",
                       settling=Settling(rules, None if story.stacked_on else story.base_sha,
                                         Generators.KEEP_STORY))
        assert comp.tree is not None  # a merge always names its tree (with markers or not)
        return comp.tree, comp.conflicts
