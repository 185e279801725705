"""bmad-loop's own git processes: a thin, thread-safe wrapper around the git command line.

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

Every git process bmad-loop starts runs with ``-c core.hooksPath=/dev/null -c
core.fsmonitor=false`` (command-line configuration wins over every file): no hook or fsmonitor
an agent planted in the repository runs inside bmad-loop's own git. `/dev/null` is not a folder
on Linux or macOS, so git finds no hook there and says nothing. The hooks a project names in
``[scm] run_hooks`` run from a private folder of pinned wrappers instead (`config_guard`).
Filters, merge and diff drivers stay on (Git LFS must keep storing pointers): the defence
against a planted one is detection, by the fingerprint `config_guard` takes around every
agent session.

Git's lock files (``index.lock``, ``HEAD.lock``, ``refs/heads/<b>.lock``, ``packed-refs.lock``,
``config.lock``, a racing fetch's "cannot lock ref … is at X but expected Y") are recognised in
what a failing command prints. A lock a dead step of bmad-loop's own left is removed at once
(`on_stale_lock`); any other is waited for, with a bounded back-off, for up to `lock_wait_s`
(``[scm] lock_wait_s``), and then the step fails with a `TransientError` naming the file
(`on_lock_wait` is told once per file). Mutating steps are written down before they start so a
stale lock can be told apart: see `locks`, which also holds the repository's own mutation
lock (`repo_lock`).

The git executable is the trusted git of this process (`sandbox.programs`, looked up once).
Branch names are judged in pure Python (`branch_name_ok`, git's refs.c `check_refname_format`
with flags 0, plus ``--branch``), so a story key or a branch name costs no git process.

``git commit`` and ``fetch`` start ``git maintenance run --auto`` when they are done: one more
git process per commit (~2 ms here), which mostly finds nothing to do. bmad-loop's own commits
and fetches pass ``-c maintenance.auto=false`` (`NO_AUTO_MAINTENANCE`), and the run settles with
the same check once (`run_deferred_maintenance`: completed, paused, stopped, failed), so the
repository is still kept as git would keep it. A user who turned ``maintenance.auto`` off gets
none from us either. Older git (before ``git maintenance``, 2.29) runs ``gc --auto`` instead.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from . import locks as gitlocks
from ..errors import GitError, TransientError
from ..caches import CACHES
from ..sandbox.programs import trusted_program, untrusted_reason

__all__ = ["Identity", "CommitHeader", "Git", "branch_name_ok", "branch_name_problem",
           "clean_env", "git_program", "is_full_sha", "NO_AUTO_MAINTENANCE",
           "run_deferred_maintenance"]

NO_HOOKS = "/dev/null"  # core.hooksPath that holds no hook, on Linux and macOS alike

log = logging.getLogger(__name__)

_COMMON_DIRS: dict[str, Path] = {}  # folder -> its git common dir (see Git.common_dir)
CACHES.register("git.common_dirs", _COMMON_DIRS.clear, bound="one per repository",
               holds="main checkout -> its git common dir (asked again once that is gone)")
_FULL_SHA = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")


def is_full_sha(rev: str | None) -> bool:
    """A full object name (SHA-1 or SHA-256) names itself: callers that hold one need no
    ``rev-parse`` to know what it is (a missing object still fails the command that uses it)."""
    return rev is not None and _FULL_SHA.fullmatch(rev) is not None


# -- the environment and the executable ----------------------------------------------------

# Inherited GIT_* variables we keep: they only say how to reach remotes or how to trace.
_KEEP_GIT_VARS = frozenset({
    "GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_ASKPASS", "GIT_PROXY_COMMAND",
    "GIT_SSL_NO_VERIFY", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH", "GIT_HTTP_USER_AGENT",
    "GIT_CURL_VERBOSE", "GIT_EXEC_PATH",
    "GIT_CONFIG_NOSYSTEM",  # can only make git read less configuration
})


def git_program(path: str | None = None) -> str:
    """The git executable bmad-loop runs: the trusted one (`sandbox.programs`), looked up once
    per process on its PATH, never a git planted later in a folder the box writes; `path` is
    not searched (kept for callers). GitError when PATH has no git, or none it can trust."""
    found = trusted_program("git")
    if not found:
        planted = shutil.which("git")
        raise GitError(f"cannot run git: {untrusted_reason(planted) if planted else 'not on PATH'}")
    return found


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


# -- ref names ------------------------------------------------------------------------------

_REF_BAD_CHARS = frozenset(" ~^:?*[\\\x7f") | frozenset(chr(c) for c in range(0x20))
_REF_BAD_RE = re.compile("[" + re.escape("".join(sorted(_REF_BAD_CHARS))) + "]")


def _component_problem(component: str) -> str | None:
    if component == "":
        return "empty path component (leading, trailing or double '/')"
    if component.startswith("."):
        return f"component '{component}' starts with '.'"
    if component.endswith(".lock"):
        return f"component '{component}' ends with '.lock'"
    if ".." in component:
        return "contains '..'"
    if "@{" in component:
        return "contains '@{'"
    bad = _REF_BAD_RE.search(component)  # the first one, as a loop over the characters would
    if bad is not None:
        return f"contains the forbidden character {bad.group()!r}"
    return None


def branch_name_problem(name: str) -> str | None:
    """Why git would refuse `name` as a branch name (`git check-ref-format --branch`), or None.

    Names git would expand rather than judge (`@{-1}`, `@{upstream}`) are refused too: any `@{`.
    """
    if name.startswith("-"):
        return "starts with '-'"
    if name == "HEAD":
        return "is 'HEAD'"
    if name.endswith("."):
        return "ends with '.'"
    for component in name.split("/"):
        problem = _component_problem(component)
        if problem is not None:
            return problem
    return None


def branch_name_ok(name: str) -> bool:
    """True when git accepts `name` as a new branch name; checked without running git."""
    return branch_name_problem(name) is None


# -- running git ----------------------------------------------------------------------------

# Subcommands that write something a lock guards (`config` only when it sets a value).
_MUTATING = frozenset({
    "add", "am", "apply", "branch", "checkout", "checkout-index", "cherry-pick", "clean", "commit",
    "config", "fetch", "gc", "maintenance", "merge", "mv", "notes", "pack-refs", "prune", "pull",
    "push", "read-tree", "rebase", "reflog", "remote", "repack", "replace", "reset", "restore",
    "revert", "rm", "sparse-checkout", "stash", "submodule", "switch", "symbolic-ref", "tag",
    "update-index", "update-ref", "worktree", "write-tree",
})
# Subcommands of a writing command that only read (see `_mutates`).
_READ_SUBCOMMANDS = {"worktree": frozenset({"list"}), "stash": frozenset({"list", "show"}),
                     "notes": frozenset({"list", "show"}), "reflog": frozenset({"show", "exists"})}
# Steps that leave half-made state when a lock stops them: not re-run here (their callers
# clean up and the engine retries the whole step).
_NO_RETRY = {("worktree", "add"), ("clone",)}
# "cannot lock ref …: is at X but expected Y" is a lost race worth another try only for these;
# for an update-ref with an expected old value it is the compare-and-swap's answer.
_RACE_RETRY = frozenset({"fetch", "pull", "remote"})
_MAX_BACKOFF_S = 1.0


class CommitHeader(TypedDict):
    """A commit's headers: `author` and `committer` as (name, email, "@<unix> <tz>"), and its
    `message` as stored (exact text)."""

    tree: str
    parents: list[str]
    author: tuple[str, str, str]
    committer: tuple[str, str, str]
    message: str


@dataclass(frozen=True)
class Identity:
    """Name and e-mail of the commits bmad-loop makes (the worker's and the lane's)."""

    name: str = "bmad-loop"
    email: str = "bmad-loop@localhost"


@dataclass(frozen=True)
class _Call:
    """One `Git.run`, as its helpers need it: the command shown and its words, its subcommand,
    where it runs, its environment, input, timeout and text mode, and its write-ahead step."""

    shown: list[str]
    words: list[str]
    sub: list[str]
    where: Path
    env: Mapping[str, str] | None
    input: str | bytes | None
    timeout: float | None
    text: bool
    step: gitlocks.StepRecord | None


class Git:
    """One repository, reached through the git CLI. Stateless apart from a cached common dir
    and the pinned hooks folder.

    `lock_wait_s`: how long a step waits for a lock another process holds ([scm] lock_wait_s).
    `run_hooks`: hook names ([scm] run_hooks) bmad-loop's own git runs, pinned; none otherwise.
    `on_lock_wait(path, command)` is called once per lock file a step starts waiting for,
    `on_stale_lock(path, command)` for each lock a dead step of ours left and this one removed;
    `lock_waits` and `stale_locks_removed` count the same. Callbacks must not raise (what they
    raise is logged and dropped) and run on the thread of the git step.
    """

    def __init__(self, repo_dir: Path, identity: Identity = Identity(), *,
                 lock_wait_s: float = 30.0, run_hooks: tuple[str, ...] = (),
                 on_lock_wait: Callable[[str, str], None] | None = None,
                 on_stale_lock: Callable[[str, str], None] | None = None) -> None:
        self.repo_dir = Path(repo_dir)
        self.identity = identity
        self.lock_wait_s = float(lock_wait_s)
        self.run_hooks = tuple(run_hooks)
        self.on_lock_wait = on_lock_wait
        self.on_stale_lock = on_stale_lock
        self.lock_waits = 0
        self.stale_locks_removed: list[str] = []
        self.clock: Callable[[], float] = time.monotonic
        self.sleep: Callable[[float], None] = time.sleep
        self._common_dir: Path | None = None
        self._hooks: str | None = None

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
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``git *args`` in `cwd` (default: the repository) and capture its output.

        Text mode (UTF-8, undecodable bytes kept as surrogates) unless `input` is bytes or
        `text=False`. With `check`, a non-zero exit raises `GitError` carrying stderr. A lock
        held by another process is waited for (then `TransientError`, whatever `check` says);
        a stale one of ours is removed and the step run again.
        """
        words = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
        shown = ["git", *words]
        if text is None:
            text = not isinstance(input, bytes)
        if text and isinstance(input, bytes):
            input = input.decode("utf-8", "surrogateescape")
        if not text and isinstance(input, str):
            input = input.encode("utf-8", "surrogateescape")
        where = Path(cwd if cwd is not None else self.repo_dir)
        sub = _subcommand(words)
        step = gitlocks.begin_step(where, sub, dict(env or {})) if _mutates(sub) else None
        try:
            proc = self._run_waiting(_Call(shown, words, sub, where, env, input, timeout, text, step))
        finally:
            if step is not None:
                step.end()
        if check and proc.returncode != 0:
            raise _error(shown, proc)
        return proc

    def _run_waiting(self, call: _Call) -> subprocess.CompletedProcess[Any]:
        argv = ["git", "-c", f"core.hooksPath={self.hooks_path()}", "-c", "core.fsmonitor=false",
                *call.words]
        extra = dict(call.env or {})
        if call.step is not None:
            extra[gitlocks.STEP_ENV] = call.step.name
        command, sub, where, step = _show(call.shown), call.sub, call.where, call.step
        no_retry = tuple(sub[:2]) in _NO_RETRY or tuple(sub[:1]) in _NO_RETRY
        deadline: float | None = None
        delay, told = 0.05, set[str]()
        while True:
            proc = self._spawn(call, argv, extra)
            if proc.returncode == 0:
                return proc
            dirs = gitlocks.git_dirs(where)
            common = dirs[1] if dirs else None
            hit = gitlocks.lock_in(proc.stderr, where, common)
            if hit is None or (hit.race and (not sub or sub[0] not in _RACE_RETRY)):
                return proc
            removed = not hit.race and gitlocks.stale_lock(
                hit.path, common, mine=step, on_stale=lambda path: self._stale(path, command))
            if no_retry:
                return proc  # its caller cleans up; the engine runs the whole step again
            if removed:
                continue
            now = self.clock()
            if deadline is None:
                deadline = now + self.lock_wait_s
            if now >= deadline:
                held = ("moved under it again and again" if hit.race
                        else "is held by another process")
                raise TransientError(
                    f"{hit.path} {held} and stayed so for {self.lock_wait_s:g} s "
                    f"({command}); bmad-loop cannot attribute it to a step of its own",
                    where=hit.path)
            if hit.path not in told:
                told.add(hit.path)
                self.lock_waits += 1
                _call(self.on_lock_wait, hit.path, command)
            self.sleep(min(delay, max(deadline - now, 0.0)))
            delay = min(delay * 2, _MAX_BACKOFF_S)

    def _spawn(self, call: _Call, argv: list[str],
               extra: dict[str, str]) -> subprocess.CompletedProcess[Any]:
        shown, where, input, timeout, step = call.shown, call.where, call.input, call.timeout, call.step
        kwargs: dict[str, Any] = {"encoding": "utf-8", "errors": "surrogateescape"} if call.text else {}
        env = clean_env(extra)
        try:
            child = subprocess.Popen(
                [git_program(env.get("PATH")), *argv[1:]], cwd=os.fspath(where), env=env,
                stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise GitError(f"cannot run git in {where}: {exc}") from exc
        if step is not None:
            try:
                step.set_child(child.pid)
            except OSError:
                pass
        try:
            stdout, stderr = child.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            child.kill()
            child.communicate()
            self._abandon(step, _show(shown))
            raise GitError(f"{_show(shown)}: timed out after {timeout} s") from exc
        except BaseException:
            child.kill()
            child.wait()
            self._abandon(step, _show(shown))
            raise
        if child.returncode < 0:  # killed by a signal: whatever it locked is left behind
            self._abandon(step, _show(shown))
        return subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)

    def _abandon(self, step: gitlocks.StepRecord | None, command: str) -> None:
        if step is None:
            return
        try:
            step.orphan()
            gitlocks.sweep(step.path.parent.parent, on_stale=lambda p: self._stale(p, command))
        except OSError:
            log.warning("could not clear the locks of a killed git step (%s)", command,
                        exc_info=True)

    def _stale(self, path: str, command: str) -> None:
        self.stale_locks_removed.append(path)
        _call(self.on_stale_lock, path, command)

    def clear_stale_locks(self) -> list[str]:
        """Remove the lock files git steps of ours that died left in this repository (recovery);
        `on_stale_lock` is told of each. Returns their paths."""
        dirs = gitlocks.git_dirs(self.repo_dir)
        if dirs is None:
            return []
        return gitlocks.sweep(dirs[1], on_stale=lambda p: self._stale(p, "recovery"))

    def hooks_path(self) -> str:
        """The core.hooksPath of bmad-loop's own git: /dev/null, or the pinned `run_hooks`."""
        if not self.run_hooks:
            return NO_HOOKS
        if self._hooks is None:
            self._hooks = NO_HOOKS  # pinning runs git itself: without hooks
            from .config_guard import pin_hooks

            try:
                self._hooks = str(pin_hooks(self, self.run_hooks))
            except (GitError, OSError):
                log.warning("cannot pin the hooks %s in %s: bmad-loop's git runs none",
                            ", ".join(self.run_hooks), self.repo_dir, exc_info=True)
        return self._hooks

    def repin_hooks(self) -> str:
        """Pin `run_hooks` again from the repository's hooks as they are now (call it when a
        human is in charge: at run start and resume)."""
        if not self.run_hooks:
            return NO_HOOKS
        from .config_guard import pin_hooks

        self._hooks = NO_HOOKS
        self._hooks = str(pin_hooks(self, self.run_hooks, refresh=True))
        return self._hooks

    def out(self, *args: object, **kw: Any) -> str:
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
        """Absolute git common directory (the main ``.git``, shared by every worktree).

        Asked once per main checkout and process (each story's context makes a new `Git` for
        the same repository); a repository's own ``.git`` stays where it is, and one that was
        deleted is asked again. Other folders (worktrees) are asked once per `Git`.
        """
        if self._common_dir is None:
            key = os.fspath(self.repo_dir.absolute())
            known = _COMMON_DIRS.get(key)
            if known is None or not known.is_dir():
                raw = self.out("rev-parse", "--path-format=absolute", "--git-common-dir")
                known = Path(raw).resolve()
                if known == (self.repo_dir / ".git").resolve():  # a main checkout's own .git
                    _COMMON_DIRS[key] = known
            self._common_dir = known
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

    def commit_header(self, sha: str) -> CommitHeader:
        """Parsed headers of a commit: its tree, parents, author and committer, and message."""
        raw = self.run("cat-file", "commit", sha).stdout
        head, _, message = raw.partition("\n\n")
        tree = ""
        parents: list[str] = []
        people: dict[str, tuple[str, str, str]] = {}
        for line in head.split("\n"):
            if line.startswith(" "):  # continuation of a multi-line header (gpgsig)
                continue
            key, _, value = line.partition(" ")
            if key == "tree":
                tree = value
            elif key == "parent":
                parents.append(value)
            elif key in ("author", "committer"):
                name, _, rest = value.partition(" <")
                email, _, date = rest.rpartition("> ")
                people[key] = (name, email, "@" + date.strip())
        return CommitHeader(tree=tree, parents=parents, author=people["author"],
                            committer=people["committer"], message=message)

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


def _subcommand(words: list[str]) -> list[str]:
    """The subcommand and what follows it (global options such as ``-c k=v`` skipped)."""
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in ("-c", "-C") else 1
    return words[i:]


def _mutates(sub: list[str]) -> bool:
    """Could this step take one of git's lock files? Read forms of the writing commands
    (`symbolic-ref HEAD`, `worktree list`, `stash list`...) cannot, and are not written down:
    a command that only reads must leave nothing behind in the git directory."""
    if not sub or sub[0] not in _MUTATING:
        return False
    if sub[0] == "config":
        return not any(w in ("-l", "--list") or w.startswith("--get") for w in sub[1:])
    operands = [w for w in sub[1:] if not w.startswith("-")]
    options = [w for w in sub[1:] if w.startswith("-")]
    if sub[0] == "symbolic-ref":  # one operand reads it; two, or -d, write
        return len(operands) > 1 or any(w in ("-d", "--delete") for w in options)
    if sub[0] in _READ_SUBCOMMANDS:
        return not operands or operands[0] not in _READ_SUBCOMMANDS[sub[0]]
    return True


def _call(callback: Callable[..., None] | None, *args: object) -> None:
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        log.warning("a git lock callback failed", exc_info=True)


def _show(argv: list[str]) -> str:
    shown = " ".join(argv)
    return shown if len(shown) <= 200 else shown[:197] + "..."


def _error(argv: list[str], proc: subprocess.CompletedProcess[Any]) -> GitError:
    stderr = proc.stderr
    if isinstance(stderr, bytes):
        stderr = stderr.decode("utf-8", "replace")
    stderr = stderr or ""
    first = next((ln for ln in stderr.splitlines() if ln.strip()), "")
    message = f"{_show(argv)} failed (exit {proc.returncode})" + (f": {first}" if first else "")
    return GitError(message, returncode=proc.returncode, stderr=stderr)


# -- maintenance, once a run settles ----------------------------------------------------------

# Global options for a commit or fetch of ours: no automatic maintenance after it.
NO_AUTO_MAINTENANCE = ("-c", "maintenance.auto=false")


def run_deferred_maintenance(git: Git) -> bool:
    """What ``git commit`` would have started, once: True when maintenance was asked for. Never
    raises: housekeeping must not fail a run."""
    try:
        wanted = git.run("config", "--type=bool", "--get", "maintenance.auto", check=False)
        if wanted.returncode == 0 and wanted.stdout.strip() == "false":
            return False
        proc = git.run("maintenance", "run", "--auto", "--quiet", check=False)
        if proc.returncode != 0 and "maintenance" in (proc.stderr or ""):
            proc = git.run("gc", "--auto", "--quiet", check=False)  # git before 2.29
        return proc.returncode == 0
    except (GitError, OSError) as exc:
        log.warning("git maintenance after the run could not run (%s)", exc)
        return False
