"""The one error hierarchy of bmad-loop.

Every user-facing failure is a `BmadLoopError` carrying the process exit code the CLI uses
(`exit_code`; the CLI prints the message and exits with it):

    BmadLoopError              exit 1
    ├── ConfigError            exit 2: refused, nothing changed
    │   ├── NotFound           a run, story or session named that is not there
    │   ├── Ambiguous          a name that matches several runs or stories
    │   └── StateError         a run or story whose state does not allow the command
    ├── GitError               exit 1: a git command failed unexpectedly
    └── TransientError         a fault a retry may cure: a lock someone else holds, a full
                               disk, an I/O error; the lane retries, then pauses the run

`StopRequested` is not an error: it is how a worker learns that its run is being stopped now.
"""

__all__ = [
    "BmadLoopError",
    "ConfigError",
    "NotFound",
    "Ambiguous",
    "StateError",
    "GitError",
    "TransientError",
    "StopRequested",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_NEEDS_HUMAN",
    "EXIT_STOPPED",
    "EXIT_INTERRUPTED",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NEEDS_HUMAN = 3
EXIT_STOPPED = 4
EXIT_INTERRUPTED = 130


class BmadLoopError(Exception):
    """Base of every error bmad-loop raises on purpose."""

    exit_code = EXIT_FAILED


class ConfigError(BmadLoopError):
    """The command cannot go ahead as asked (exit 2); nothing has been changed.

    Itself: bad input found before anything ran — policy, board, footprint, story key, git
    set-up, command-line options; the message is one line naming the file, key or story. The
    refusals that depend on what is recorded (runs, stories, sessions) are its subclasses below,
    so an `except ConfigError` still sees them.
    """

    exit_code = EXIT_USAGE


class NotFound(ConfigError):
    """A run, story or session the command names is not there ("no run matches 'x'")."""


class Ambiguous(ConfigError):
    """A name matches several runs or stories; the message lists them."""


class StateError(ConfigError):
    """The run or story is in a state that does not allow the command
    ("run X is completed: nothing to resume", another live run on the same target)."""


class GitError(BmadLoopError):
    """A git command failed in a way the caller did not expect."""

    def __init__(self, message: str, *, returncode: int | None = None, stderr: str = ""):
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


class TransientError(BmadLoopError):
    """A step failed for a reason that may go away on its own or once a person acts: a lock
    held by another process, a full disk, an I/O error. `where` names the file or command."""

    def __init__(self, message: str, *, where: str = ""):
        super().__init__(message)
        self.where = where


class StopRequested(BaseException):
    """Raised inside a worker when the run is being stopped now.

    A BaseException so that a broad `except Exception` in a phase cannot swallow it.
    """
