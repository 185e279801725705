"""The prompt file an agent session reads: the phase's instructions, the story, and the evidence.

Instructions are two parts: the phase's *task* (what to do — replaceable by a profile, e.g. "run
the BMAD dev-story workflow") and the *ground rules* (what never to do — always there). `compose`
joins them; `PHASE_INSTRUCTIONS` holds the default, composed, per phase.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from ..fileio import write_atomic
from ..states import AGENT_PHASES, Phase

__all__ = [
    "PromptSpec",
    "DEFAULT_TASKS",
    "GROUND_RULES",
    "PHASE_INSTRUCTIONS",
    "MAX_EVIDENCE_CHARS",
    "compose",
    "build_prompt",
    "write_prompt",
]

MAX_EVIDENCE_CHARS = 40_000  # verify output or review notes beyond this keep only their tail

_COMMON_RULES = """\
- You run unattended: nobody will answer a question. Never stop to wait for input; where a workflow
  asks the user to choose, take the choice that lets the work continue and note it in the story's
  Dev Agent Record.
- Work only inside your worktree, the current directory (also in $BMAD_LOOP_WORKTREE). Do not
  change any file outside it.
- Do not edit the sprint board (sprint-status.yaml) or any other ledger of the sprint: bmad-loop
  records story statuses itself, and reverts any change an agent makes to them. Skip any workflow
  step that would update them. The story file itself is yours to update.
- Git: stay on the branch that is checked out. Do not create, move, reset, rebase, delete or push
  any other branch or tag, do not push at all, and do not run `git update-ref`, `git branch -f`,
  `git checkout`/`git switch` of another branch or `git worktree`. An attempt to move the target
  branch is blocked (and, outside bmad-loop's sandbox, escalates the story)."""

_CHANGE_RULES = """\
- Do not commit: leave your work uncommitted in the worktree. Whatever you leave there when you
  finish is committed by bmad-loop (in its sandbox, git cannot write any branch, so a commit
  fails). Never rewrite commits you did not make.
- Exit with status 0 when the work is done; a non-zero exit means this attempt failed."""

_REVIEW_RULES = """\
- This is a review: change no file and make no commit.
- Write your review notes to standard output: each finding with its file, line and what must
  change. They are handed to the fix session as they are.
- Your verdict: exit with status 0 to approve, non-zero to request changes. Also end your output
  with exactly one verdict line, `BMAD-LOOP-VERDICT: APPROVED` or
  `BMAD-LOOP-VERDICT: CHANGES-REQUESTED` (for agents whose CLI cannot set its exit status)."""

_CREATE_RULES = """\
- Write exactly one file: the story file at $BMAD_LOOP_STORY_FILE (named under "Story file"
  above). bmad-loop commits that file alone on the story's branch; any other change you make is
  discarded, so do not implement anything yet and do not commit.
- Exit with status 0 once the story file is written; a non-zero exit, or no file at that path,
  means this attempt failed."""

_REPAIR_RULES = """\
- bmad-loop has already merged the target branch into your worktree (outside your sandbox); the
  merge is not committed yet. Where git could not merge a file, it holds git's conflict markers
  (`<<<<<<<`, `=======`, `>>>>>>>`): resolve every one of them, keeping both sides' intent. A
  marker left in a file fails this repair.
- Do not commit, merge, rebase, reset or abort anything: only edit files. bmad-loop commits the
  result as the merge itself, with the parents it chose.
- Exit with status 0 when the story works on top of the target; a non-zero exit means this
  repair failed."""

GROUND_RULES: Mapping[str, str] = MappingProxyType({
    Phase.CREATE: f"Ground rules:\n{_COMMON_RULES}\n{_CREATE_RULES}",
    Phase.DEV: f"Ground rules:\n{_COMMON_RULES}\n{_CHANGE_RULES}",
    Phase.FIX: f"Ground rules:\n{_COMMON_RULES}\n{_CHANGE_RULES}",
    Phase.REVIEW: f"Ground rules:\n{_COMMON_RULES}\n{_REVIEW_RULES}",
    Phase.REPAIR: f"Ground rules:\n{_COMMON_RULES}\n{_REPAIR_RULES}",
})

DEFAULT_TASKS: Mapping[str, str] = MappingProxyType({
    Phase.CREATE: """\
Create the story file for the story named below, the way BMAD's create-story workflow does.
If the section "BMAD in this project" at the end of this file names a skill or a workflow for
this phase, run it for exactly this story key, writing its output to $BMAD_LOOP_STORY_FILE instead
of the default path, and skip every step that reads or updates the sprint status. Without BMAD
(or without a create-story workflow), write it by hand
from the epics, PRD and architecture documents in the repository: a title, `Status: ready-for-dev`,
the user story, numbered acceptance criteria, tasks and subtasks, and dev notes that name the
files to touch.
Then declare the story's footprint, the files its implementation will change, so that stories
that touch different files can be developed side by side: YAML front matter at the top of the
file (or a fenced `yaml` block under a `## Footprint` heading), for example

    ---
    footprint:
      files: ["src/auth/**", "tests/test_auth.py"]   # changed by this story only
      shared: ["src/app/__init__.py"]                # small additive edits other stories share
      resources: []                                  # named resources, e.g. "database"
    depends_on: []                                   # story keys that must land first
    ---

Keep `files` as narrow as the plan allows: a path listed there waits for every earlier story
that lists it too; a missing footprint makes the story wait for every other.""",
    Phase.DEV: """\
Implement the story below, completely. If the section "BMAD in this project" at the end of this
file names a skill or a workflow for this phase, run it on this story (the story file is
$BMAD_LOOP_STORY_FILE; skip every step that reads or writes the sprint status). Otherwise work
through its tasks and subtasks in order; for each,
write the code and the tests that prove it, and run the project's tests. Mark a task done in the
story file only when it is implemented and its tests pass. Fill in the story's Dev Agent Record
(notes, debug log), File List and Change Log, and set its Status to `review` when every task is
done. If a previous attempt failed verification, its output is below: fix that cause first.""",
    Phase.REVIEW: """\
Review the changes made for the story below, as a senior reviewer who expects to find problems;
if the section "BMAD in this project" names a code-review skill or workflow, follow it, only
reporting its findings (fix nothing, add no follow-up tasks, change no status).
See them with `git diff $BMAD_LOOP_BASE_SHA` (committed and uncommitted) and
`git log $BMAD_LOOP_BASE_SHA..HEAD`. Check every acceptance criterion and every task marked done
against the code; look for bugs, missing or weak tests, security and error-handling gaps, and
changes outside the story's scope. Approve only when the story is truly done.""",
    Phase.FIX: """\
The story below was implemented, but verification failed or the review requested changes; the
evidence is below. Fix every problem it names, with the smallest change that fixes it, and add or
adjust tests so each stays fixed. Run the project's tests. Record what you fixed in the story's
Dev Agent Record and Change Log.""",
    Phase.REPAIR: """\
The story below was finished and committed on its branch, but it no longer fits the target
branch: other stories landed on the target meanwhile, and either git could not merge the story
with them, or the combination failed verification. What happened, and which stories landed since
this story began, is below. The target is merged into your worktree already; make the story
work on top of it, with the smallest change that does: resolve every conflict marker, and
where a landed story renamed or changed what this story uses, follow the change (use the new
names, signatures and files). Keep what both sides meant. Run the project's tests. Record what
you changed in the story's Dev Agent Record and Change Log.""",
})


def _check_phase(phase: str) -> None:
    if phase not in AGENT_PHASES:
        raise ValueError(f"unknown phase {phase!r} (known: {', '.join(AGENT_PHASES)})")


def compose(phase: str, task: str) -> str:
    """A phase's full instructions: `task` followed by the phase's ground rules."""
    _check_phase(phase)
    return f"{task.strip()}\n\n{GROUND_RULES[phase]}"


PHASE_INSTRUCTIONS: Mapping[str, str] = MappingProxyType({p: compose(p, DEFAULT_TASKS[p]) for p in AGENT_PHASES})


@dataclass(frozen=True)
class PromptSpec:
    """What one session's prompt is made of (see `build_prompt`)."""

    phase: str
    story_key: str
    story_title: str
    story_text: str
    instructions: str
    attempt: int
    verify_output: str = ""
    review_notes: str = ""
    worktree: str = ""
    story_file: str = ""
    epic: str = ""
    bmad: str = ""
    repair: str = ""  # a repair session's evidence: what failed, the stories that landed


def build_prompt(spec: PromptSpec) -> str:
    """The text of one session's prompt file.

    It holds the phase's `instructions`, the full story file, and the evidence: for `fix`, the
    failing verify output and the review's notes; for a later `dev` attempt, the previous attempt's
    failing verify output; for `repair`, what failed on the target (`repair`, already written as
    markdown) and why an earlier repair failed. A `create` session has no story yet: it gets the key, the epic and
    where to write the file (`story_file`), and, on a later attempt, why the last one failed.
    Evidence longer than `MAX_EVIDENCE_CHARS` keeps its tail. `bmad` says how this project's
    BMAD install runs the phase (`BmadInstall.guidance`; "" when it has none): the last section,
    which the instructions refer to.
    """
    _check_phase(spec.phase)
    title = f"{spec.story_key}: {spec.story_title}" if spec.story_title else spec.story_key
    head = [f"# bmad-loop {spec.phase} session — story {title}", "", f"- Phase: {spec.phase}",
            f"- Attempt: {spec.attempt}"]
    if spec.worktree:
        head.append(f"- Worktree (your working directory): {spec.worktree}")
    if spec.story_file:
        head.append(f"- Story file: {spec.story_file}")
    parts = ["\n".join(head), "## Instructions\n\n" + spec.instructions.strip()]
    if spec.phase == Phase.CREATE:
        # There is no story yet: the board's line is all there is to go on.
        parts.append(f"## The story to create\n\n- Key: {spec.story_key}\n- Epic: {spec.epic}\n"
                     f"- Title (from the key): {spec.story_title}")
        if spec.verify_output.strip():
            parts.append("## The previous attempt failed\n\n" + _evidence(spec.verify_output))
        parts.append(_bmad_section(spec.bmad))
        return "\n\n".join(parts) + "\n"
    parts.append(f"## The story ({spec.story_key})\n\n{_fenced(spec.story_text, 'markdown')}")

    if spec.phase == Phase.FIX:
        if spec.verify_output.strip():
            parts.append("## Verification failed — its output\n\n" + _evidence(spec.verify_output))
        else:
            parts.append("## Verification\n\nVerification passed; the review requested changes.")
        if spec.review_notes.strip():
            parts.append("## The review's notes\n\n" + _evidence(spec.review_notes))
    elif spec.phase == Phase.REPAIR:
        parts.append("## Why this story needs a repair\n\n" + spec.repair.strip())
        if spec.verify_output.strip():
            parts.append("## The previous repair failed\n\n" + _evidence(spec.verify_output))
    elif spec.phase == Phase.DEV and spec.verify_output.strip():
        parts.append("## The previous attempt failed verification — its output\n\n"
                     + _evidence(spec.verify_output))
    elif spec.phase == Phase.DEV and spec.review_notes.strip():
        parts.append("## Review notes from earlier\n\n" + _evidence(spec.review_notes))
    parts.append(_bmad_section(spec.bmad))
    return "\n\n".join(parts) + "\n"


NO_BMAD = ("BMAD is not installed in this project (no BMAD skills, no workflow folders): do the "
           "work by hand, as the instructions above describe.")


def _bmad_section(guidance: str) -> str:
    return "## BMAD in this project\n\n" + (guidance.strip() or NO_BMAD)


def write_prompt(path: Path, text: str) -> Path:
    """Write `text` to `path` atomically (parents created); return the path."""
    return write_atomic(path, text)


def _evidence(text: str) -> str:
    text = text.rstrip()
    note = ""
    if len(text) > MAX_EVIDENCE_CHARS:
        text = text[-MAX_EVIDENCE_CHARS:]
        note = f"(only the last {MAX_EVIDENCE_CHARS} characters are shown)\n\n"
    return note + _fenced(text, "text")


def _fenced(text: str, lang: str) -> str:
    """`text` in a code fence longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}"
