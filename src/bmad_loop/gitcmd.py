"""A thin, thread-safe wrapper around the git command line.

Every git operation in bmad-loop goes through `Git.run`, which starts one `git` subprocess per
call. We use the CLI through `subprocess` deliberately rather than GitPython: GitPython is not
thread-safe (its maintainer says so), several of its index operations `chdir` the whole process,
and long-lived `Repo` objects keep `cat-file` children alive. The integration lane, the workers
and the reconciler run in threads and processes side by side; a stateless subprocess per call is
the only model that is safe for all of them, and it behaves exactly like the git a human runs.

Each call gets a clean environment: every inherited ``GIT_*`` variable that redirects git to
another repository, index, object store or configuration (``GIT_DIR``, ``GIT_WORK_TREE``,
``GIT_INDEX_FILE``, ``GIT_OBJECT_DIRECTORY``, ``GIT_CONFIG_*``, identities, dates …) is dropped
before our own variables are added, so bmad-loop started from inside a git hook, or by an agent,
cannot be pointed at the wrong place. Transport and tracing variables (``GIT_SSH*``,
``GIT_ASKPASS``, ``GIT_TRACE*`` …) and ``GIT_CONFIG_NOSYSTEM`` are kept. ``LC_ALL=C`` makes
messages parseable, ``GIT_TERMINAL_PROMPT=0`` keeps git from ever waiting on a terminal, and
``GIT_OPTIONAL_LOCKS=0`` keeps read-only commands such as ``status`` from taking the index lock of
a worktree an agent is working in.

`repo_lock` serialises ref and worktree mutations inside one repository across threads and
processes (concurrent ``git worktree add`` in one repository fails intermittently otherwise).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bmad_loop.board import branch_name_ok  # re-exported: the one check, git's rules in pure Python
from bmad_loop.errors import GitError

__all__ = ["Identity", "Git", "branch_name_ok", "repo_lock", "clean_env", "LOCK_FILE_NAME"]

LOCK_FILE_NAME = "bmad-loop.lock"

# Inherited GIT_* variables we keep: they only say how to reach remotes or how to trace.
_KEEP_GIT_VARS = frozenset(
    {
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_SSH_VARIANT",
        "GIT_ASKPASS",
        "GIT_PROXY_COMMAND",
        "GIT_SSL_NO_VERIFY",
        "GIT_SSL_CAINFO",
        "GIT_SSL_CAPATH",
        "GIT_HTTP_USER_AGENT",
        "GIT_CURL_VERBOSE",
        "GIT_EXEC_PATH",
        "GIT_CONFIG_NOSYSTEM",  # can only make git read less configuration
    }
)


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ without git redirections, plus our fixed settings, plus `extra` (which wins)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GIT_") or k in _KEEP_GIT_VARS or k.startswith("GIT_TRACE")
    }
    env["LC_ALL"] = "C"
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_OPTIONAL_LOCKS"] = "0"
    if extra:
        env.update({str(k): str(v) for k, v in extra.items()})
    return env


@dataclass(frozen=True)
class Identity:
    """Name and e-mail of the commits bmad-loop makes (the worker's and the lane's)."""

    name: str = "bmad-loop"
    email: str = "bmad-loop@localhost"


class Git:
    """One repository, reached through the git CLI. Stateless apart from a cached common dir."""

    def __init__(self, repo_dir: Path, identity: Identity = Identity()) -> None:
        self.repo_dir = Path(repo_dir)
        self.identity = identity
        self._common_dir: Path | None = None

    def __repr__(self) -> str:
        return f"Git({str(self.repo_dir)!r})"

    # -- running ---------------------------------------------------------------------------

    def run(
        self,
        *args: object,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        input: str | bytes | None = None,
        timeout: float | None = None,
        text: bool | None = None,
    ) -> subprocess.CompletedProcess:
        """Run ``git *args`` in `cwd` (default: the repository) and capture its output.

        Text mode (UTF-8, undecodable bytes kept as surrogates) unless `input` is bytes or
        `text=False`. With `check`, a non-zero exit raises `GitError` carrying stderr.
        """
        argv = ["git", *(os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args)]
        if text is None:
            text = not isinstance(input, bytes)
        if text and isinstance(input, bytes):
            input = input.decode("utf-8", "surrogateescape")
        if not text and isinstance(input, str):
            input = input.encode("utf-8", "surrogateescape")
        kwargs: dict = {"encoding": "utf-8", "errors": "surrogateescape"} if text else {}
        try:
            proc = subprocess.run(
                argv,
                cwd=os.fspath(cwd if cwd is not None else self.repo_dir),
                env=clean_env(env),
                input=input,
                capture_output=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL if input is None else None,
                **kwargs,
            )
        except FileNotFoundError as exc:
            raise GitError(f"cannot run git in {cwd or self.repo_dir}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise GitError(f"{_show(argv)}: timed out after {timeout} s") from exc
        if check and proc.returncode != 0:
            raise _error(argv, proc)
        return proc

    def out(self, *args: object, **kw) -> str:
        """stdout of ``git *args``, stripped (decoded even when the input was bytes)."""
        stdout = self.run(*args, **kw).stdout
        if isinstance(stdout, bytes):
            stdout = stdout.decode("utf-8", "surrogateescape")
        return stdout.strip()

    # -- reading ---------------------------------------------------------------------------

    def rev(self, ref: str, cwd: Path | None = None) -> str | None:
        """Full sha of the commit `ref` names, or None when it names none."""
        proc = self.run(
            "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}",
            cwd=cwd, check=False,
        )
        if proc.returncode == 0:
            return proc.stdout.strip()
        if proc.returncode == 1:
            return None
        raise _error(["git", "rev-parse", ref], proc)

    def common_dir(self) -> Path:
        """Absolute git common directory (the main ``.git``, shared by every worktree)."""
        if self._common_dir is None:
            raw = self.out("rev-parse", "--path-format=absolute", "--git-common-dir")
            self._common_dir = Path(raw).resolve()
        return self._common_dir

    def toplevel(self) -> Path | None:
        """Root of the repository's working tree, or None for a bare repository."""
        proc = self.run("rev-parse", "--show-toplevel", check=False)
        if proc.returncode != 0 or not proc.stdout.strip():
            return None
        return Path(proc.stdout.strip())

    def current_branch(self, cwd: Path | None = None) -> str | None:
        """Short name of the branch checked out in `cwd`, or None when HEAD is detached."""
        proc = self.run("symbolic-ref", "--quiet", "HEAD", cwd=cwd, check=False)
        if proc.returncode == 1:
            return None
        if proc.returncode != 0:
            raise _error(["git", "symbolic-ref", "HEAD"], proc)
        ref = proc.stdout.strip()
        return ref.removeprefix("refs/heads/")

    def is_ancestor(self, a: str, b: str) -> bool:
        """True when commit `a` is `b` or an ancestor of it."""
        proc = self.run("merge-base", "--is-ancestor", a, b, check=False)
        if proc.returncode in (0, 1):
            return proc.returncode == 0
        raise _error(["git", "merge-base", "--is-ancestor", a, b], proc)

    def commit_date(self, sha: str) -> str:
        """Committer date of `sha` as ``@<unix> <tz>``, a value GIT_COMMITTER_DATE accepts."""
        return self.commit_header(sha)["committer"][2]

    def commit_header(self, sha: str) -> dict:
        """Parsed headers of a commit: ``tree``, ``parents`` (list), ``author`` and ``committer``
        as ``(name, email, "@<unix> <tz>")``, and ``message`` (exact text)."""
        raw = self.run("cat-file", "commit", sha).stdout
        head, _, message = raw.partition("\n\n")
        info: dict = {"parents": [], "message": message}
        for line in head.split("\n"):
            if line.startswith(" "):  # continuation of a multi-line header (gpgsig)
                continue
            key, _, value = line.partition(" ")
            if key == "tree":
                info["tree"] = value
            elif key == "parent":
                info["parents"].append(value)
            elif key in ("author", "committer"):
                name, _, rest = value.partition(" <")
                email, _, date = rest.rpartition("> ")
                info[key] = (name, email, "@" + date.strip())
        return info

    def identity_env(self, date: str | None = None) -> dict[str, str]:
        """Environment giving our identity to author and committer (and both dates, if given)."""
        env = {
            "GIT_AUTHOR_NAME": self.identity.name,
            "GIT_AUTHOR_EMAIL": self.identity.email,
            "GIT_COMMITTER_NAME": self.identity.name,
            "GIT_COMMITTER_EMAIL": self.identity.email,
        }
        if date is not None:
            env["GIT_AUTHOR_DATE"] = date
            env["GIT_COMMITTER_DATE"] = date
        return env


# Per-thread depth of the locks this thread holds, keyed by lock file: makes repo_lock re-entrant
# within a thread (a caller may hold it around several mutations that each take it again).
_held = threading.local()


@contextmanager
def repo_lock(git: Git) -> Iterator[None]:
    """Hold the repository's mutation lock: ``fcntl.flock`` on ``<common_dir>/bmad-loop.lock``.

    Each outermost acquisition opens its own file description, so threads of one process exclude
    each other as well as processes do; the kernel releases it if the holder is killed (even with
    SIGKILL). Re-entrant within one thread. Do not fork while holding it (the child would share
    it). Works only among processes on one machine (the scale-out mode needs a lease instead).
    """
    path = str(git.common_dir() / LOCK_FILE_NAME)
    depths = _held.__dict__.setdefault("depths", {})
    if depths.get(path):
        depths[path] += 1
        try:
            yield
        finally:
            depths[path] -= 1
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        depths[path] = 1
        try:
            yield
        finally:
            depths[path] = 0
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _show(argv: list[str]) -> str:
    shown = " ".join(argv)
    return shown if len(shown) <= 200 else shown[:197] + "..."


def _error(argv: list[str], proc: subprocess.CompletedProcess) -> GitError:
    stderr = proc.stderr
    if isinstance(stderr, bytes):
        stderr = stderr.decode("utf-8", "replace")
    stderr = stderr or ""
    first = next((ln for ln in stderr.splitlines() if ln.strip()), "")
    message = f"{_show(argv)} failed (exit {proc.returncode})" + (f": {first}" if first else "")
    return GitError(message, returncode=proc.returncode, stderr=stderr)
