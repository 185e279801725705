"""A repair request: what the lane hands a story's worker when it sends the story back to its agent.

The lane writes it (engine/lane/aftermath.py, `repair_or_escalate`) into the story row's feedback
under `REPAIR_KEY`, in the transaction that moves the story `integrating → pending` at phase
`repair`; the worker reads it (engine/worker/repair.py) for the merge, the prompt and the
evidence file, and keeps the merge it made under `MERGE_KEY`. Both entries go when the story is
ready again (its feedback is cleared then).

A request is a plain dict (it lives in a JSON column):

- `cause`: `conflict` (no merge rule settled a conflict with the target) or `verify-failed` (the
  candidate failed verification on the current target, which itself passes);
- `reason`: the candidate's reason, as the lane would have escalated with it;
- `candidate`: the failed candidate's attempt; `target_sha`: the target it was composed on,
  which the repair merges in;
- `conflicts`: the conflicting paths (cause `conflict`); `command`, `log`, `output`: the failing
  verify command, its log and the output's tail (cause `verify-failed`);
- `landed`: the stories integrated since the story's base, in plan order, each `key`, `title`,
  `paths` (what it changed) and `sha` (its commit on the target).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..db.models import Story
from ..states import CandidateState, Phase

__all__ = ["REPAIR_KEY", "MERGE_KEY", "REPAIR_REF_NAMESPACE", "repair_ref", "in_repair",
           "repair_markdown", "OUTPUT_LINES"]

REPAIR_KEY = Phase.REPAIR.value  # story feedback: the lane's request
MERGE_KEY = "repair_merge"  # story feedback: the merge the worker made for it
REPAIR_REF_NAMESPACE = "refs/bmad-loop/repair/"
OUTPUT_LINES = 80  # of a failing command's output, in the prompt (the log has all of it)


def repair_ref(run_id: str, story_key: str) -> str:
    """The merge a repair started from (the target merged in, markers and all), as a commit
    whose parents are the story's head and the target: a repair session cut short starts from
    it again."""
    return f"{REPAIR_REF_NAMESPACE}{run_id}/{story_key}"


def in_repair(story: Story) -> bool:
    """Is the story on its way through a repair (from the lane's request until it is ready)?"""
    return bool((story.feedback or {}).get(REPAIR_KEY))


def repair_markdown(request: dict[str, Any], target_branch: str,
                    conflicts: Iterable[str] = ()) -> str:
    """The prompt's account of why the story is repaired: what failed, and what landed."""
    target = (request.get("target_sha") or "")[:12]
    lines = []
    if request.get("cause") == CandidateState.CONFLICT:
        paths = list(conflicts) or list(request.get("conflicts") or ())
        lines.append(f"Your story's branch does not merge with {target_branch} (at {target}): "
                     "git could not merge these files, which now hold conflict markers:")
        lines += [f"- `{p}`" for p in paths] or ["- (no path listed)"]
    else:
        lines.append(f"Your story passed its own verification, but on top of {target_branch} (at "
                     f"{target}) the command `{request.get('command')}` fails. Its output "
                     f"ends with (full log: {request.get('log')}):")
        tail = "\n".join(str(request.get("output") or "").rstrip().splitlines()[-OUTPUT_LINES:])
        lines += ["", "```text", tail, "```"]
    landed = request.get("landed") or []
    lines += ["", f"Stories that landed on {target_branch} since your story began:"]
    if not landed:
        lines.append("- (none in this run: the target moved outside it)")
    for story in landed:
        title = f" — {story['title']}" if story.get("title") else ""
        files = ", ".join(f"`{p}`" for p in story.get("paths") or ()) or "(no file)"
        lines.append(f"- {story['key']}{title}: {files}")
    return "\n".join(lines)
