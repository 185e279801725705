"""A story branch pushed to the remote target, taken over by the clone that prepares the story.

In remote mode a story's branch is pushed when it is ready (and a human may push a fix to it).
A story prepared in another clone (its first host died after pushing) or fixed by a human
starts from what was pushed, not from what this clone happens to hold.
"""

from __future__ import annotations

__all__ = ["adopt_pushed_branch"]


def adopt_pushed_branch(ctx, story, branch: str) -> None:
    """The pushed story branch wins when this clone has none (the story began on a host that
    died after pushing) or a human pushed a fix to it."""
    git = ctx.git
    pushed = ctx.target.story_head(branch)
    local = git.rev(f"refs/heads/{branch}")
    if pushed is None or pushed == local:
        return
    if local is not None and not story.human_fix:
        return
    if local is None:
        git.run("update-ref", f"refs/heads/{branch}", pushed)
        return
    git.run("update-ref", f"refs/heads/{branch}", pushed, local)
    worktree = ctx.layout.story_worktree(story.key, ctx.policy.scm.branch_per)
    if worktree.exists():
        git.run("reset", "-q", "--hard", pushed, cwd=worktree)
