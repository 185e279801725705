"""Run `[verify].commands` in a folder: each a shell command, in order, stopping at the first
failure; a failure retried on the same tree, and the flakes that finds recorded.

Each command runs like an agent session (`agents.process.supervise`): in its own session and process
group, its output straight into the log file, its whole process tree ended on timeout, on
`stop_event` (`stop --now`) and when it exits, and tagged with the session token and
`BMAD_LOOP_OWNER`. With `run_id` and `story_key` it also carries `BMAD_LOOP_RUN_ID` and
`BMAD_LOOP_STORY_KEY`, so orphan recovery finds what a dead worker's verify left running and
kills it before the story is retried; with `thaw_after_s` a command that stops bmad-loop is
undone after that long (the process's thaw helper, `agents/thaw.py`). Only a bounded tail of the
output is read back.

With `Retry` (`[verify] retries`), a run that fails is not believed at once: the tree is put
back exactly as the first run found it (`Retry.reset`: the story's verify record restored, a
candidate's tree made exact) and every command runs again, into a log of its own
(`…-retry<n>.log`). A pass on a retry passes, and says which command flaked (`Flaky`). A
command that timed out, or a run that was interrupted, is not run again: a timeout would cost
its whole timeout again, and a stop means stop.

**Flakes** (a command that failed, then passed on a retry of the very same tree) are written in
one place, whoever verified (a story's worker, the lane's candidate verification, the target
check): a `flakes` row (the `v_flaky_commands` view counts them per command) and a
`verify.flaky` journal event naming the command and both logs, in the caller's transaction.

The lane's verifications of detached trees (a candidate, the target itself) run through its
`LaneVerifier`: boxed, retried on the tree made exact again, with the lane's ports.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

from sqlalchemy.orm import Session

from ...agents.adapter import read_tail
from ...agents.process import Command, Limits, LogCut, supervise
from ...db.models import Flake
from ...git.worktrees import make_exact
from ...git.runner import Git
from ...git.worktrees import ensure_detached_worktree
from ...policy import Policy
from ...sandbox import SANDBOX_VAR, Box
from ..crashpoints import crash_point
from ..journal import EventKind, record
from ..runpaths import Layout
from .childenv import (BoxSite, child_env, lane_block, lane_slot_block, port_env, settle_after_box,
                       verify_box)

__all__ = ["VerifyResult", "Flaky", "Retry", "run_verify", "verify_tags", "retry_log",
           "OUTPUT_TAIL_CHARS", "NOTHING_TO_RUN", "SITES", "record_flakes", "LaneVerifier"]

OUTPUT_TAIL_CHARS = 20_000  # what is handed to the next prompt and kept in evidence


@dataclass(frozen=True)
class Flaky:
    """A command that failed, then passed when the same tree was verified again."""

    command: str
    failed_log: str
    passed_log: str
    exit_code: int | None  # of the failed run
    retry: int  # which retry passed (1: the first)

    def event_data(self) -> dict[str, Any]:
        return {"command": self.command, "failed_log": self.failed_log,
                "passed_log": self.passed_log, "exit_code": self.exit_code, "retry": self.retry}


@dataclass(frozen=True)
class Retry:
    """Run a failing verification again, `times` at most, each on the tree `reset()` puts back."""

    times: int
    reset: Callable[[], object]  # what it returns is not read


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    failed_command: str | None
    exit_code: int | None
    timed_out: bool
    output: str  # tail of the combined output of the failing (or last) command
    duration_s: float
    log: str | None
    interrupted: bool = False
    log_cut: LogCut | None = None  # the log passed [limits] max_log_bytes (or a write failed)
    commands: tuple[str, ...] = ()  # what ran, in order
    boxed: bool = False  # ran in the OS sandbox (bmad_loop.sandbox)
    flakes: tuple[Flaky, ...] = ()  # failures a retry of the same tree did not repeat

    def event(self) -> tuple[EventKind, dict[str, Any]]:
        """The journal event of this verification: `verify.passed` (`command`: the commands
        that ran, joined by ` && `; None when there were none) or `verify.failed` (`command`:
        the one that failed), with `log_truncated` when its log was cut, and `boxed`."""
        ran = " && ".join(self.commands) or None
        data: dict[str, Any] = {
                "command": ran if self.ok else self.failed_command, "exit_code": self.exit_code,
                "timed_out": self.timed_out, "duration_s": round(self.duration_s, 3),
                "log": self.log, "boxed": self.boxed}
        if self.log_cut is not None:
            data["log_truncated"] = self.log_cut.event_data()
        return (EventKind.VERIFY_PASSED if self.ok else EventKind.VERIFY_FAILED, data)


# What verifying with no commands gives: passed, at once, with no log.
NOTHING_TO_RUN = VerifyResult(True, None, 0, False, "", 0.0, None)


def verify_tags(run_id: str | None, story_key: str | None) -> dict[str, str]:
    """The variables that tie a verify process to its run and story (for orphan recovery)."""
    if not (run_id or story_key):
        return {}
    tags = {"BMAD_LOOP_PHASE": "verify"}
    if run_id:
        tags["BMAD_LOOP_RUN_ID"] = run_id
    if story_key:
        tags["BMAD_LOOP_STORY_KEY"] = story_key
    return tags


@dataclass(frozen=True)
class VerifySite:
    """Where verify commands run: in `cwd`, logged to `log_path`, with `env` (None: this
    process's), in `box` (None: unboxed, else the box's own environment added), tagged with
    the run and story they verify (for orphan recovery)."""

    cwd: Path
    log_path: Path
    env: Mapping[str, str] | None = None
    box: Box | None = None
    run_id: str | None = None
    story_key: str | None = None


def retry_log(log_path: Path, n: int) -> Path:
    """Where the `n`-th retry of a verification writes its output, beside the first log."""
    return log_path.with_name(f"{log_path.stem}-retry{n}{log_path.suffix}")


def run_verify(commands: Sequence[str], site: VerifySite, limits: Limits, *,
               stop_event: threading.Event | None = None,
               retry: Retry | None = None) -> VerifyResult:
    """Run `commands` in order until one fails, each supervised with `limits`; a failure is
    retried on the reset tree as `retry` says (see the module's docstring)."""
    started = time.monotonic()
    if not commands:
        return NOTHING_TO_RUN
    result = _run_once(commands, site, limits, stop_event, started)
    first = result
    for n in range(1, (retry.times if retry else 0) + 1):
        if result.ok or result.timed_out or result.interrupted:
            break
        crash_point("verify.before_retry")
        assert retry is not None  # the loop runs only with one
        retry.reset()
        result = _run_once(commands, replace(site, log_path=retry_log(site.log_path, n)), limits,
                           stop_event, started)
        if result.ok:
            # A failed run names its command; every run that ran a command, its log.
            flaky = Flaky(cast(str, first.failed_command), cast(str, first.log),
                          cast(str, result.log), first.exit_code, n)
            return replace(result, flakes=(flaky,))
    return result


def _run_once(commands: Sequence[str], site: VerifySite, limits: Limits,
              stop_event: threading.Event | None, started: float) -> VerifyResult:
    """One run of `commands`, in order, until one fails."""
    cwd, log_path, env, box = site.cwd, site.log_path, site.env, site.box
    run_id, story_key = site.run_id, site.story_key
    base_env = dict(os.environ if env is None else env)
    base_env.update(verify_tags(run_id, story_key))
    base_env[SANDBOX_VAR] = box.backend if box else ""
    base_env.update(box.env if box else {})
    cuts = []
    for command in commands:
        argv = ["/bin/sh", "-c", command]
        label = f"verify{' story ' + story_key if story_key else ''}"
        boxed = box.wrap(argv, str(Path(cwd).resolve())) if box else argv  # in cwd, as unboxed
        shown = Command(boxed, cwd, base_env, label, shown=command,
                        note=box.summary() if box else None)
        result = supervise(shown, log_path, limits, stop_event=stop_event)
        cuts += [result.log_cut] if result.log_cut else []
        if result.exit_code != 0 or result.timed_out or result.interrupted:
            return VerifyResult(
                ok=False, failed_command=command, exit_code=result.exit_code,
                timed_out=result.timed_out,
                output=read_tail(log_path, result.log_start, result.log_end,
                                 max_bytes=4 * OUTPUT_TAIL_CHARS, max_chars=OUTPUT_TAIL_CHARS),
                duration_s=time.monotonic() - started, log=str(log_path),
                interrupted=result.interrupted, log_cut=_summed(cuts), boxed=box is not None,
            )
    return VerifyResult(True, None, 0, False, "", time.monotonic() - started, str(log_path),
                        log_cut=_summed(cuts), commands=tuple(commands), boxed=box is not None)


def _summed(cuts: list[LogCut]) -> LogCut | None:
    """One log's cuts over its commands, as one."""
    if not cuts:
        return None
    return LogCut(sum(c.dropped for c in cuts), sum(c.lost for c in cuts),
                  next((c.error for c in cuts if c.error), None), cuts[-1].max_log_bytes)


SITES = ("story", "candidate", "target")  # where the flaky verification ran


def record_flakes(s: Session, run_id: str, story: str | None, site: str, flakes: Iterable[Flaky], *,
                  attempt: int | None = None, tree: str | None = None) -> None:
    """Write each of `flakes` (`Flaky`) as a row and a journal event."""
    if site not in SITES:
        raise ValueError(f"unknown verify site {site!r}")
    for flaky in flakes:
        s.add(Flake(run_id=run_id, story=story, site=site, attempt=attempt, command=flaky.command,
                    tree=tree, retry=flaky.retry, failed_log=flaky.failed_log,
                    passed_log=flaky.passed_log, exit_code=flaky.exit_code))
        record(s, run_id, EventKind.VERIFY_FLAKY, story, site=site, tree=tree,
               **({"attempt": attempt} if attempt is not None else {}), **flaky.event_data())


@dataclass(frozen=True)
class LaneVerifier:
    """The lane's verifications of detached trees (a candidate, or the target itself): boxed
    as `[verify] sandbox` says (the worktree is the box's writable tree), a retry run on the
    tree made exact again, with the lane's ports. `home_state`: the project's own state folder,
    when the repository is a clone elsewhere (remote mode)."""

    policy: Policy
    git: Git
    layout: Layout
    run_id: str
    max_parallel: int  # the run's, from its snapshot: how the lane's ports are shared out
    home_state: Path | None = None

    def env(self, slot: int | None = None) -> dict[str, str]:
        """What a command the lane runs gets: the lane's ports, or verification `slot`'s share
        of them when the stack verifies several at once."""
        env = child_env(self.policy)
        block = (lane_block(self.policy) if slot is None else
                 lane_slot_block(self.policy, slot, self.policy.verify.depth(self.max_parallel)))
        env.update(port_env(block))
        return env

    def box(self, site: BoxSite, env: dict[str, str]) -> Box | None:
        """The box of a command the lane runs in `site.tree` (None: unboxed)."""
        return verify_box(self.policy, self.git, self.layout.state_dir, site, env,
                          self.home_state)

    def candidate_checkout(self, key: str, attempt: int, sha: str) -> Path | None:
        """The detached worktree a candidate is verified in (none without verify commands)."""
        if not self.policy.verify.commands:
            return None
        worktree = self.layout.candidate_worktree(key, attempt)
        ensure_detached_worktree(self.git, worktree, sha)
        return worktree

    def verify_candidate(self, key: str, attempt: int, worktree: Path | None, sha: str,
                         env: dict[str, str],
                         stop_event: threading.Event | None = None) -> VerifyResult:
        """Verify candidate `sha`, checked out in `worktree`; a retry runs on its tree made
        exact again, so nothing the failed run left (nor a HEAD it moved) is seen."""
        if worktree is None:  # no commands: nothing runs
            return NOTHING_TO_RUN
        return self.verify_tree(self.policy.verify.commands, worktree,
                                self.layout.verify_log(key, f"candidate-{attempt}"),
                                self.layout.scratch(key) / f"candidate-{attempt}", env,
                                stop_event=stop_event, exact_sha=sha)

    def verify_tree(self, commands: Sequence[str], worktree: Path, log_path: Path, scratch: Path,
                    env: dict[str, str], *, stop_event: threading.Event | None = None,
                    exact_sha: str | None = None) -> VerifyResult:
        """Run `commands` in the detached `worktree`, boxed; with `exact_sha`, a failure is
        retried (`[verify] retries`) on the worktree made exactly that commit again."""
        git = self.git
        retry = (None if exact_sha is None else
                 Retry(self.policy.verify.retries, lambda: make_exact(git, worktree, exact_sha)))
        box = self.box(BoxSite(worktree, scratch, log_path), env)
        result = run_verify(
            commands, VerifySite(worktree, log_path, env, box, self.run_id),
            Limits(timeout_s=self.policy.verify.timeout_s, thaw_after_s=self.policy.leases.ttl_s,
                   max_log_bytes=self.policy.limits.max_log_bytes),
            stop_event=stop_event, retry=retry)
        if box is not None:
            settle_after_box(git, worktree, None, scratch)
        return result
