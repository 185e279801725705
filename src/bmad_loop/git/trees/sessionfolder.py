"""The session folder (`.bmad-loop-session/`): bmad-loop's prompt files in a story worktree,
never part of a story's work.

`info/exclude` keeps the folder out of `git add -A`, but an agent can still stage it: as a
symlink (which `/.bmad-loop-session/`, a folder pattern, does not match), with `git add -f`,
or in a commit of its own. A story commit whose tree holds the name in any form is refused.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import GitError
from ..runner import Git

__all__ = ["SESSION_FOLDER", "SessionFolderStaged", "refuse_session_folder"]

SESSION_FOLDER = ".bmad-loop-session"


class SessionFolderStaged(GitError):
    """The story's work would add the session folder (a symlink, a folder, a file)."""


def refuse_session_folder(git: Git, worktree: Path) -> None:
    """Raise SessionFolderStaged when the index of `worktree` (everything staged: what the
    story commit would hold) names the session folder at the top, in any form."""
    listed = git.run("ls-files", "--cached", "-z", "--", f":(literal){SESSION_FOLDER}",
                     cwd=worktree).stdout
    staged = [entry for entry in listed.split("\0") if entry]
    if staged:
        raise SessionFolderStaged(
            f"the story's work adds bmad-loop's session folder {SESSION_FOLDER} (its prompt "
            f"files, never committed): {staged[0]!r} is staged; refused")
