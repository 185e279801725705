"""The one error hierarchy of bmad-loop.

Every user-facing failure is a `BmadLoopError` carrying the process exit code the CLI uses.
"""

__all__ = [
    "BmadLoopError",
    "ConfigError",
    "GitError",
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
    """Bad input found before anything ran: policy, board, footprint, story key, git set-up.

    The message is one line naming the file, key or story. Nothing has been changed.
    """

    exit_code = EXIT_USAGE


class GitError(BmadLoopError):
    """A git command failed in a way the caller did not expect."""

    def __init__(self, message, *, returncode=None, stderr=""):
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


class StopRequested(BaseException):
    """Raised inside a worker when the run is being stopped now.

    A BaseException so that a broad `except Exception` in a phase cannot swallow it.
    """
