"""The create phase in a story's worker: the agent writes the story file, only that is kept.

A story planned with `to_create` (see engine/run/planning.py) is prepared like any other (its worktree and
branch from the target), then runs one `create` session per attempt. The attempt passes when
the agent exits 0 and the file `BMAD_LOOP_STORY_FILE` names exists and reads as a story file.
Then the worker commits that one file on the story branch and resets the worktree to that
commit: whatever else the agent changed or committed (BMAD's create-story also edits the
sprint board, for one) is discarded and journaled, never committed. The row takes its title,
footprint, dependencies, merge class and tier from the committed file, `to_create` ends, and the
story goes back to `pending`: dev is admitted with the footprint the file declares.

A failed attempt (non-zero exit, no file, a file whose metadata cannot be read) uses one of
`[limits] max_create_attempts`; the worktree is reset before the next. The story's attempt
counter counts create attempts until create ends, then starts again at 0 for dev.

Before dev, `carry_forward` moves the one-file create commit onto the target as it is then, so
dev starts from everything integrated meanwhile (admission waited for what it conflicts with).

**The created file, checked** (`check_created`) as planning checks a committed one. Planning
refuses a committed story file whose metadata is wrong (bmad/story_files.py for the file itself,
`selection.check_dependencies` for its `depends_on`): not a list of story keys, an unknown
story, itself, a story later in the plan, a cycle, or unfinished work the run will not do. A
created file gets the same checks with the same one-line message, against the run's plan (its
rows in plan order, their dependencies as resolved) and the board as the story's worktree has
it. A problem fails the create attempt; the `depends_on` that passes is stored resolved to full
keys, as planning stores a committed file's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

from ...git.trees.compose import blob_at, changed_paths, dirty_paths, replace_blob
from ...errors import GitError, ConfigError
from ...bmad.footprint import footprint_from_mapping, Footprint
from ...states import AttemptState, Phase
from ...bmad.story_files import StoryMeta, parse_story_text
from ...db.models import Story
from .context import Outcome, StepResult, Walker
from ..workspace.base import Prepared
from ...bmad.board import parse_board
from ...bmad.selection import StorySpec, check_dependencies, resolve_dependencies
from ..runrows import stories_of
from ...git.runner import Git
from .context import StoryContext
from ..journal import EventKind

__all__ = ["phase_create", "carry_forward", "CREATED_KEY", "check_created"]


CREATED_KEY = "created"  # feedback entry: the create commit that dev has not started from yet

# (kind, data) of the journal events an `Outcome` records.
Events = list[tuple[str, dict[str, Any]]]


def phase_create(worker: Walker) -> Outcome:
    """One create session of the claimed story, and what it means for the story. A story
    file a person committed on the story branch (after the create attempts ran out) is read
    instead, with no session."""
    ctx, git = worker.ctx, worker.ctx.git
    story = worker.claim.load()
    # Prepared (its worktree made), and planned with the path its file is written to.
    assert story.worktree is not None and story.story_path is not None
    worktree = Path(story.worktree)
    start = git.rev("HEAD", cwd=worktree)
    assert start is not None  # a prepared worktree has a commit checked out
    written = worktree / story.story_path
    if blob_at(git, start, story.story_path) is not None:
        return _committed_by_a_person(worker, story, start, written)
    number = story.dev_attempts + 1
    result = worker.session(Phase.CREATE, number)
    meta: StoryMeta | None = None
    failure: str | None = None
    if not result.ok:
        failure = result.summary
    else:
        meta, failure = _read_written(ctx, story, written)
    if failure:
        discarded = _reset(git, worktree, start, worker.ctx.workspace.seeds, keep=None)
        if result.state == AttemptState.SUCCEEDED:  # exited 0, but no usable file: a failure
            result.state = AttemptState.FAILED
        result.ok, result.reason, result.summary = False, failure, failure
        events: Events = [(EventKind.CREATE_FAILED, {"attempt": number, "reason": failure})]
        if discarded:
            events.append((EventKind.CREATE_DISCARDED, {"paths": discarded}))
        if number >= worker.policy.limits.max_create_attempts:
            return Outcome(escalate=f"create attempts exhausted ({number}): {failure}",
                           counters={"dev_attempts": 1}, session=result, events=events)
        return Outcome(Phase.CREATE, counters={"dev_attempts": 1}, session=result, events=events,
                       feedback={"verify_output": f"The previous attempt failed: {failure}\n"
                                                  + result.output[-4000:]})
    head = _commit_file(git, start, story.story_path, written.read_bytes(),
                        f"{story.key}: create the story file\n")
    assert meta is not None  # read without a failure
    return _created(worker, story, head, meta, result)


def _read_written(ctx: StoryContext, story: Story,
                  written: Path) -> tuple[StoryMeta, None] | tuple[None, str]:
    """(metadata, None) of a usable story file, else (None, why not)."""
    if not written.is_file():
        return None, f"the agent exited 0 but wrote no story file at {story.story_path}"
    try:
        meta = parse_story_text(written.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, OSError) as exc:
        return None, f"cannot read the story file it wrote: {exc}"
    depends_on, problem = check_created(ctx, story, meta, written)  # as a committed file
    if problem:
        return None, problem
    return replace(meta, depends_on=depends_on), None


def _committed_by_a_person(worker: Walker, story: Story, head: str, written: Path) -> Outcome:
    """The story branch already holds the story file: a person wrote or fixed it there. It is
    checked like a created one; a bad one escalates at once (no agent second-guesses it)."""
    meta, failure = _read_written(worker.ctx, story, written)
    if failure:
        return Outcome(escalate=f"the story file on the story branch is still invalid: {failure}",
                       events=[(EventKind.CREATE_FAILED, {"attempt": None, "reason": failure})])
    assert meta is not None  # read without a failure
    return _created(worker, story, head, meta, None)


def _created(worker: Walker, story: Story, head: str, meta: StoryMeta,
             result: StepResult | None) -> Outcome:
    """The story file is committed at `head`: the row takes what it says, back to pending."""
    ctx, git = worker.ctx, worker.ctx.git
    assert story.worktree is not None  # the prepare phase made it
    discarded = _reset(git, Path(story.worktree), head, ctx.workspace.seeds, keep=story.story_path)
    values = _row_values(ctx, story, meta)
    events: Events = [(EventKind.STORY_CREATED, {"story_file": story.story_path, "commit": head,
                                 "footprint": values["footprint"],
                                 "footprint_reason": values["footprint_reason"]})]
    if discarded:
        events.append((EventKind.CREATE_DISCARDED, {"paths": discarded}))
    if values["footprint_reason"]:
        events.append((EventKind.FOOTPRINT_EXCLUSIVE, {"reason": values["footprint_reason"]}))
    assert story.branch is not None  # the prepare phase named it
    try:  # remote mode: dev may be claimed on another host, which must find the created file
        if ctx.target.publish_story(story.branch, head):
            events.append((EventKind.STORY_PUSHED, {"branch": story.branch, "head_sha": head,
                                            "remote": ctx.target.location}))
    except GitError as exc:
        return Outcome(escalate=f"cannot push the story branch: {exc}", session=result,
                       events=events, values={"head_sha": head})
    values.update(to_create=False, dev_attempts=0, head_sha=head, human_fix=False)
    return Outcome(pending=True, session=result, values=values, events=events,
                   feedback={"verify_output": "", CREATED_KEY: head})


def _row_values(ctx: StoryContext, story: Story, meta: StoryMeta) -> dict[str, Any]:
    """What the committed story file says, as the row's columns (a policy override of the
    footprint still wins, and the story file itself is always part of it)."""
    policy = ctx.policy
    footprint = meta.footprint
    override = policy.footprints.overrides.get(story.key)
    if override is not None:
        footprint = footprint_from_mapping({"files": list(override.files), "shared": list(override.shared),
                                            "resources": list(override.resources)})
    path = story.story_path
    assert path is not None  # a story to create is planned with its file's path
    footprint = footprint.with_files(path if "/" in path else "/" + path)
    tier = meta.tier if meta.tier in policy.adapter.tiers else story.tier
    return {"title": meta.title or story.title, "footprint": footprint.to_dict(),
            "footprint_reason": footprint.reason, "depends_on": list(meta.depends_on),
            "merge_class": meta.merge_class or story.merge_class, "tier": tier,
            "done_checkpoint": meta.done_checkpoint}


def _commit_file(git: Git, parent: str, path: str, content: bytes | None, message: str,
                 date: str | None = None) -> str:
    """A commit on `parent` that adds (or replaces) `path` and nothing else."""
    tree = replace_blob(git, git.out("rev-parse", f"{parent}^{{tree}}"), path, content)
    return git.out("commit-tree", "--no-gpg-sign", tree, "-p", parent, input=message,
                   env=git.identity_env(date))


def _reset(git: Git, worktree: Path, to: str, seeds: Iterable[str], keep: str | None) -> list[str]:
    """Put the worktree (and its branch) exactly at `to`; return what the agent changed that is
    thereby discarded (`keep`, the committed story file, is not listed)."""
    head = git.rev("HEAD", cwd=worktree)
    touched = dirty_paths(git, worktree)
    if head and head != to:
        touched |= set(changed_paths(git, to, head))
    git.run("reset", "-q", "--hard", to, cwd=worktree)
    # Seeded untracked files (agent configuration) stay; the prompt folder is git-excluded.
    git.run("clean", "-fdq", *[f"--exclude=/{seed}" for seed in seeds], cwd=worktree)
    seeded = tuple(seeds)
    return sorted(p for p in touched if p != keep
                  and not any(p == seed or p.startswith(f"{seed}/") for seed in seeded))


def carry_forward(ctx: StoryContext, story: Story, prepared: Prepared, target_sha: str) -> Prepared:
    """Dev of a story created in this run starts from the target as it is now: its one-file
    create commit is made again on top of the target (same file, same message and date, so a
    repeated prepare gives the same commit). Anything else on the branch is left alone."""
    created = (story.feedback or {}).get(CREATED_KEY)
    if not created:
        return prepared
    git = ctx.git
    worktree = Path(prepared.worktree)
    done = {**prepared.feedback, CREATED_KEY: None}
    head = git.rev("HEAD", cwd=worktree)
    if head is None or head != created or git.is_ancestor(target_sha, head):  # (created: a sha)
        return Prepared(prepared.worktree, prepared.base_sha, feedback=done)
    assert story.story_path is not None  # a created story has its file
    content = blob_at(git, head, story.story_path)
    message = git.out("log", "-1", "--format=%B", head) + "\n"
    date = git.out("log", "-1", "--format=%cI", head)
    moved = _commit_file(git, target_sha, story.story_path, content, message, date)
    git.run("reset", "-q", "--hard", moved, cwd=worktree)
    return Prepared(prepared.worktree, target_sha, feedback=done)


def check_created(ctx: StoryContext, story: Story, meta: StoryMeta,
                  written: Path) -> tuple[tuple[str, ...], str | None]:
    """(the file's `depends_on` resolved to full keys, or the problem in one line naming
    `written` and the story)."""
    if meta.errors:
        return (), f"{written}: {'; '.join(meta.errors)}"
    with ctx.db.read() as s:
        rows = [(r.key, r.epic, list(r.depends_on or ())) for r in stories_of(s, ctx.run_id)]
    assert story.worktree is not None  # the prepare phase made it
    board = _board_statuses(ctx, Path(story.worktree))
    planned = {key for key, _, _ in rows}

    def spec(key: str, epic: str, deps: Iterable[str], position: int,
             status: str = "ready-for-dev", where: Path | None = None) -> StorySpec:
        return StorySpec(key=key, epic=epic, status=status, title=key, story_file=where,
                         story_path=None, footprint=Footprint(), depends_on=tuple(deps),
                         merge_class=None, tier=None, done_checkpoint=False, position=position)

    created = spec(story.key, story.epic, meta.depends_on, 0, where=written)
    plan = [created if key == story.key else spec(key, epic, deps, 0)
            for key, epic, deps in rows]
    others = [spec(key, epic, (), i, status) for i, (key, epic, status) in enumerate(board)
              if key not in planned]
    try:
        resolved = resolve_dependencies(plan + others, [created])[0].depends_on
        check_dependencies(plan + others, plan)
    except ConfigError as exc:
        return (), str(exc)
    return resolved, None


def _board_statuses(ctx: StoryContext, worktree: Path) -> list[tuple[str, str, str]]:
    """(key, epic, status) of every story on the board in the story's worktree."""
    if not ctx.board_rel:
        return []
    path = worktree / ctx.board_rel
    try:
        board = parse_board(path.read_text(encoding="utf-8"), Path(ctx.board_rel))
    except (OSError, UnicodeDecodeError, ConfigError):
        return []  # the lane's own board edit reports a broken board
    return [(e.key, e.epic or "", e.status) for e in board.stories()]
