"""Planning the create phase: what happens to selected stories that have no story file yet.

A BMAD `backlog` story usually has no story file until create-story writes it. `[stories]
create` decides, before anything is written:

- `"agent"` (default): the story is planned with `stories.to_create` set, and its worker runs the
  create phase before dev (engine/worker/create_step.py);
- `"skip"`: the story is left out of the plan, and the run's journal says so (`story.skipped`);
- `"require"`: the plan is refused (exit 2), naming every such story.

A story past `backlog` (`ready-for-dev`, `drafted`) without its file is an error in every mode:
the board says the file was written, so something is wrong with the board or the story folder.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import ConfigError
from ..journal import record

__all__ = ["CREATE_STATUS", "needs_creation", "plan_creation", "creation_checks", "journal_skipped"]

# The one board status whose story may not have a file yet.
CREATE_STATUS = "backlog"
SKIP_REASON = "no story file ([stories] create = \"skip\")"


def needs_creation(spec) -> bool:
    """A story the create phase would write: no story file yet, and still in the backlog."""
    return spec.story_file is None and spec.status == CREATE_STATUS


def _where(spec) -> str:
    return spec.story_path or f"<story folder>/{spec.key}.md"


def _missing_files(chosen: Sequence) -> None:
    """A story past the backlog must have its file: ConfigError naming the first that has not."""
    for spec in chosen:
        if spec.story_file is None and spec.status != CREATE_STATUS:
            raise ConfigError(f"{_where(spec)}: story {spec.key} is {spec.status} on the board "
                              "but its story file does not exist")


def _refusals(policy, uncreated: Sequence) -> str | None:
    """Why the create phase cannot run for these stories under this policy, or None."""
    if not uncreated:
        return None
    keys = ", ".join(s.key for s in uncreated)
    mode = policy.stories.create
    if mode == "require":
        return (f'{policy.source}: [stories] create = "require": no story file for {keys} '
                f"(expected at {', '.join(_where(s) for s in uncreated)})")
    if mode != "agent":
        return None
    outside = [s.key for s in uncreated if not s.story_path]
    if outside:
        return (f"{policy.source}: [stories] create: the story folder is outside the repository, "
                f"so no agent can write the story file of {', '.join(outside)}")
    scm = policy.scm
    if (scm.isolation, scm.branch_per) != ("worktree", "story"):
        # The created file is committed on the story's own branch and carried to the target
        # before dev; in place (or on a shared run branch) there is no such branch to keep it.
        return (f'{policy.source}: [stories] create = "agent" needs [scm] isolation = "worktree" '
                f'and branch_per = "story" (stories without a story file: {keys}); write their '
                'files first or set [stories] create = "skip"')
    return None


def plan_creation(policy, chosen: Sequence) -> tuple[list, list]:
    """(the stories to plan, the stories skipped for want of a file). ConfigError when the
    policy refuses them or a story past the backlog has no file. Planned stories without a
    file are the ones whose rows get `to_create`."""
    _missing_files(chosen)
    uncreated = [s for s in chosen if needs_creation(s)]
    refusal = _refusals(policy, uncreated)
    if refusal:
        raise ConfigError(refusal)
    if policy.stories.create == "skip":
        return [s for s in chosen if not needs_creation(s)], uncreated
    return list(chosen), []


def creation_checks(policy, actionable: Sequence) -> list[tuple[str, str]]:
    """`validate`'s lines about story files still to be written: (status, detail)."""
    try:
        _missing_files(actionable)
    except ConfigError as exc:
        return [("error", str(exc))]
    uncreated = [s for s in actionable if needs_creation(s)]
    if not uncreated:
        return []
    refusal = _refusals(policy, uncreated)
    if refusal:
        return [("error", refusal)]
    keys = ", ".join(s.key for s in uncreated)
    if policy.stories.create == "skip":
        return [("warn", f"{len(uncreated)} backlog stories without a story file are skipped: {keys}")]
    many = len(uncreated) != 1
    return [("ok", f"{len(uncreated)} backlog {'stories get' if many else 'story gets'} the create "
                   f"phase first: {keys}")]


def journal_skipped(session, run_id: str, skipped: Sequence) -> None:
    """One `story.skipped` per story left out of the plan for want of a file (no row: unplanned)."""
    for spec in skipped:
        record(session, run_id, "story.skipped", spec.key, reason=SKIP_REASON,
               story_file=_where(spec), planned=False)
