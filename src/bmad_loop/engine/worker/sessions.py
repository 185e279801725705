"""One agent session (create, dev, review, fix or repair) of one story: prompt, argv, environment,
run; whether it changed anything; and where a re-run of it starts.

The session opens its `attempts` row as `running` before the agent starts; the caller closes
it in the same transaction that records what the session's outcome means for the story (see
walk.py), so a crash either re-runs an unfinished session (not counted) or never re-runs a
finished one.

**The empty session.** An agent that printed an error and exited 0 must not pass as a finished
story. Before a dev or fix session the worker takes a `snapshot` of the story's work: every
path that differs from the story's base commit — committed by the agent or not, tracked or new —
with the id of its content. The same snapshot after the session tells whether the session
changed anything; changes to lane-owned files (the board, ledgers) and the prompt folder do not
count, since the worker reverts or ignores them. The snapshot asks git, never the agent (in a
story's worktree, index flags that hide edits are taken off first, `git/worktrees.py`):
`diff --name-only <base>` (the worktree against the base, committed and uncommitted),
`ls-files --others --exclude-standard` (new files), and `hash-object --stdin-paths` for their
contents.

**A re-run starts from the tree its cut-short run started from.** A session (any phase) killed
half way — a kill -9 of bmad-loop, a lost lease, ``stop --now``, an agent fault that charges
nothing — is run again with the same phase and number. Its first run may have left files
behind (an appending agent appended), and the re-run must not start from them, or the story's
commit takes the work twice.

- **Keep** (before the agent starts): the worktree as it is becomes one commit, made the way a
  story verify records the agent's output (engine/verification/record.py: tracked and untracked
  files, seeds and ignored files left out, parent HEAD), at
  ``refs/bmad-loop/<run>/sessions/<story>/<phase>-<number>``; the story row names it (its
  feedback's ``session_record``: phase, number, sha) until the session's outcome is written,
  in that same transaction (`forget_session_record`).
- **Restore** (a session that starts while the row names its own record, same phase and
  number, whose ref still holds it): the worktree as the cut-short run left it is kept at
  ``<ref>.cut`` (the evidence: what that run wrote), then put back to exactly the record (and
  HEAD where the record's parent is, should that run have committed), seeds copied in again,
  and ``session.restored`` journaled.

The start records go when the story is ready (`drop_session_records`); the ``.cut`` refs stay,
under the run's own ref namespace, until ``cleanup --runs`` prunes the finished run. Only a
story's own worktree is recorded and restored, never a person's checkout (``isolation =
"none"``), as for verify.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Iterable, Mapping, cast

from sqlalchemy import Table, bindparam, select, update

from ...agents.adapter import AgentCall, agent_env, render_argv, review_approved, session_output
from ...bmad.install import detect_bmad
from ...agents.faults import AgentFault, classify
from ...agents.output import SessionReport, Usage, parse_output
from ...agents.process import AgentResult, Command, Limits, supervise
from ...agents.profiles import Profile
from ...db.database import insert_now
from ...db.models import Attempt, Run, Story, utcnow
from ...fileio import LinkRefused, read_beneath, shown, unlink_beneath, write_beneath
from ...git.config_guard import ConfigWatch
from ...git.trees.compose import SESSION_FOLDER
from ...agents.prompts import PHASE_INSTRUCTIONS, PromptSpec, build_prompt
from ...agents.profiles import resolve_command
from ...agents.tmux_session import session_name, tmux_available
from ...states import AttemptState, Phase, RunState, StopMode
from ..crashpoints import crash_point
from ...sandbox import SANDBOX_VAR, Box
from ..verification.childenv import agent_box, settle_after_box, child_env, sandbox_vars
from ..workspace.guard import read_guard_log
from ..journal import EventKind, record
from .repair import repair_env, repair_prompt_text
from ..usage import USAGE_FILE_VAR, budget_set, read_usage_file, usage_file
from ...git.worktrees import clear_flags
from ..workspace.base import matches_any
from ..verification.record import keep, put_back
from .context import Claim
from ...git.runner import Git
from ...policy import Policy
from ...policy.schema import PhaseOverride
from .context import StoryContext

__all__ = ["SessionResult", "run_session", "Heartbeat", "SESSION_DIR", "verdict_mode", "snapshot",
           "changed_paths_between", "SESSION_RECORD_KEY", "SESSION_REF_PATTERN", "session_ref",
           "session_ref_owner", "before_session", "forget_session_record", "drop_session_records"]


log = logging.getLogger(__name__)

# The agent's pid, written as it starts (built once: every session runs it).
_ATTEMPTS = cast(Table, Attempt.__table__)  # a mapped class's table (typed as a FromClause)
_SET_PID = (update(_ATTEMPTS).where(_ATTEMPTS.c.id == bindparam("attempt_id"))
            .values(pid=bindparam("pid")))
# A running session's look for `stop --now`, twice a second.
_STOP_ASKED = select(Run.state, Run.stop_mode).where(Run.id == bindparam("run_id"))

SESSION_DIR = SESSION_FOLDER  # prompt files, in the worktree (never followed through a link)


@dataclass
class SessionResult:
    attempt_id: int
    phase: str
    number: int
    state: str  # succeeded | failed | timed-out | interrupted
    ok: bool  # for review: approved
    summary: str
    output: str
    exit_code: int | None
    duration_s: float
    head_sha: str | None
    guard_refusals: list[str]
    config_changes: list[str] = field(default_factory=list)  # git configuration the session changed
    reason: str | None = None  # attempts.reason: why it did not pass ("stalled", ...)
    usage: Usage = field(default_factory=Usage)  # tokens and cost, as the CLI reported them
    # An environment fault (rate or usage limit, auth, trust, model, network): no attempt charged.
    fault: AgentFault | None = None

    def attempt_values(self) -> dict[str, Any]:
        return {"state": self.state, "exit_code": self.exit_code, "ended_at": utcnow(),
                "duration_s": round(self.duration_s, 3), "counted": self.state != AttemptState.INTERRUPTED,
                "head_sha": self.head_sha, "reason": self.reason, **self.usage.columns()}


def verdict_mode(policy: Policy, profile: Profile | None) -> str:
    """`[adapter] verdict` when set; else profiles whose CLI always exits 0 mark their verdict in
    the output, and custom commands use exit codes (the contract)."""
    adapter = policy.adapter
    if adapter.verdict:
        return adapter.verdict
    if profile and not adapter.command and not adapter.phase(Phase.REVIEW).command:
        return profile.verdict
    return "exit"


def profile_in_use(policy: Policy, profile: Profile | None, phase: str) -> Profile | None:
    """The profile whose CLI this phase runs (its output format and fault words), or None for a
    custom command."""
    adapter = policy.adapter
    if profile and not adapter.command and not adapter.phase(phase).command:
        return profile
    return None


@dataclass
class _Launch:
    """One session, ready to start: what runs, where its output and guard refusals go."""

    argv: list[str]
    env: dict[str, str]
    journaled_argv: list[str]  # the agent's own command line; the log's header shows the box too
    box: Box | None
    session: str  # the tmux session, or a name for the session
    worktree: Path
    log_path: Path
    usage_path: Path
    guard_log: Path
    guard_offset: int
    timeout: float
    phase: str = ""


def run_session(ctx: StoryContext, claim: Claim, phase: str, number: int,
                story: Story | None = None) -> SessionResult:
    """Run one agent session of the claimed story; its attempt row is left for the caller to close.
    `story`: the row as the caller just read it (else it is read here)."""
    story = story if story is not None else claim.load()
    policy = ctx.policy
    before_session(ctx, claim, story, phase, number)  # a re-run starts where the first began
    launch = _launch(ctx, story, phase, number)
    # What the story's work is before the session, to tell an empty dev or fix session. Only a
    # profile's CLI is judged so: for a custom command exit 0 is success (the contract).
    unflag = ctx.workspace.story_worktrees  # never a person's flags in their own checkout
    base = story.base_sha
    before = snapshot(ctx.git, launch.worktree, base, unflag=unflag) \
        if phase in (Phase.DEV, Phase.FIX) \
        and base and profile_in_use(policy, ctx.profile, phase) else None
    # Git configuration, hooks and drivers before the agent runs; compared before any other git.
    watch = ConfigWatch(ctx.git, launch.worktree, ctx.scratch.parent / f"{ctx.key}.git-config.json")
    watch.begin()
    attempt_id = _open_attempt(ctx, claim, story, phase, number, launch)
    result = _supervised(ctx, claim, attempt_id, launch)
    crash_point("worker.after_agent")
    _journal_log_cut(ctx, phase, number, launch.log_path, result)
    config_changes = watch.end()
    if launch.box is not None and not config_changes:
        settle_after_box(ctx.git, launch.worktree, story.branch, ctx.scratch)
    verdict = _verdict(ctx, phase, number, launch, result)
    head = None if config_changes else ctx.git.rev("HEAD", cwd=launch.worktree)
    if verdict.ok and before is not None and base and not config_changes:  # (before: a base)
        ignore = [*policy.scm.lane_owned, *([ctx.board_rel] if ctx.board_rel else []), f"/{SESSION_DIR}/"]
        after = snapshot(ctx.git, launch.worktree, base, unflag=unflag)
        if not changed_paths_between(before, after, ignore):
            verdict = dataclasses.replace(
                verdict, state=AttemptState.FAILED, ok=False, reason="no changes",
                summary=f"no changes: the {phase} session exited 0 but changed no file of the story")
    return SessionResult(attempt_id, phase, number, verdict.state, verdict.ok, verdict.summary,
                         verdict.text, result.exit_code, result.duration_s, head,
                         read_guard_log(launch.guard_log, launch.guard_offset), config_changes,
                         verdict.reason, verdict.usage, verdict.fault)


def _launch(ctx: StoryContext, story: Story, phase: str, number: int) -> _Launch:
    """The prompt written, the argv and environment rendered, the box chosen."""
    policy = ctx.policy
    tier_name = story.tier or ""
    tier = policy.adapter.tiers.get(tier_name) if tier_name else None
    phase_over = policy.adapter.phase(phase)
    assert story.worktree is not None  # the prepare phase made it
    worktree = Path(story.worktree)
    log_path = ctx.layout.log(ctx.key, phase, number)
    prompt_path = _write_session_prompt(ctx, story, phase, number, worktree)
    extra_env, box = _session_env(ctx, phase_over, worktree, log_path)
    if phase == Phase.REPAIR:  # the cause, and what failed as a file (repair.py)
        extra_env.update(repair_env(ctx, story, number, worktree, SESSION_DIR))
    usage_path = usage_file(ctx.scratch, phase, number)
    # A killed earlier run of this session may have left one (the box writes the scratch).
    unlink_beneath(ctx.scratch, str(usage_path.relative_to(ctx.scratch)))
    extra_env[USAGE_FILE_VAR] = str(usage_path)
    guard_log = ctx.scratch / "guard.log"
    guard_offset = guard_log.stat().st_size if guard_log.exists() else 0
    if box is None:  # boxed, no ref is writable: the guard has nothing to stop
        extra_env.update(ctx.workspace.guard_env(worktree, ctx.guard_hooks, guard_log))
    template = resolve_command(
        profile=policy.adapter.profile, command=policy.adapter.command,
        phase_command=phase_over.command, model=tier.model if tier else "",
        tier_args=tier.args if tier else (), extra_args=policy.adapter.extra_args,
        boxed=box is not None,
    )
    call = AgentCall(phase=phase, story_key=ctx.key,
                     story_file=str(worktree / story.story_path) if story.story_path else "",
                     prompt_file=str(prompt_path), worktree=str(worktree), run_id=ctx.run_id,
                     attempt=number, base_sha=story.base_sha or "",
                     model=tier.model if tier else "", tier=tier_name, extra_env=extra_env)
    journaled_argv = render_argv(template, call)
    argv = box.wrap(journaled_argv) if box is not None else journaled_argv
    session = f"{ctx.run_id}/{ctx.key}/{phase}-{number}"
    if policy.adapter.tmux and tmux_available():
        # Live in tmux for `attach`; the wrapper mirrors the pane into the same session log.
        session = session_name(ctx.run_id, ctx.key, phase, number)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "bmad_loop.agents.tmux_session", session, str(log_path), "--", *argv]
    return _Launch(argv, agent_env(call, child_env(policy)), journaled_argv, box, session, worktree,
                   log_path, usage_path, guard_log, guard_offset,
                   policy.adapter.timeout_for(phase, tier_name), phase)


def _write_session_prompt(ctx: StoryContext, story: Story, phase: str, number: int,
                          worktree: Path) -> Path:
    # Inside the worktree: headless agents may not read files outside their folder.
    assert story.worktree is not None  # `worktree` is it
    prompt_path = worktree / SESSION_DIR / f"{phase}-{number}.md"
    _exclude_session_dir(ctx.git)
    source = ctx.target.story_source(worktree)
    story_text = _read(source, story.story_path) if story.story_path else ""
    instructions = (ctx.profile.instructions.get(phase) if ctx.profile else None) \
        or PHASE_INSTRUCTIONS[phase]
    if ctx.profile and profile_in_use(ctx.policy, ctx.profile, phase):
        _write_session_files(worktree, ctx.profile.session_files)
    prompt = build_prompt(PromptSpec(
        phase=phase, story_key=ctx.key, story_title=story.title, story_text=story_text,
        instructions=instructions, attempt=number,
        verify_output=story.feedback.get("verify_output", ""),
        review_notes=story.feedback.get("review_notes", "") if phase == Phase.FIX else "",
        worktree=story.worktree,
        story_file=str(worktree / story.story_path) if story.story_path else "", epic=str(story.epic),
        bmad=detect_bmad(ctx.workspace.root).guidance(phase),
        repair=repair_prompt_text(story, ctx.target_branch) if phase == Phase.REPAIR else "",
    ))
    # The agent may have made the session folder a symlink: it is replaced, never followed. A
    # file name that is not UTF-8 (a repair's conflict) is written escaped, as every text shows it.
    write_beneath(worktree, f"{SESSION_DIR}/{prompt_path.name}", shown(prompt).encode(), own=True)
    return prompt_path


def _open_attempt(ctx: StoryContext, claim: Claim, story: Story, phase: str, number: int,
                  launch: _Launch) -> int:
    """The attempt row and its journal line, written under the claim: no session starts for a
    worker that lost its story."""
    with ctx.db.transaction() as s:
        claim.write(s, story, session=launch.session, log=str(launch.log_path))
        attempt_id = insert_now(s, Attempt(
            run_id=ctx.run_id, story_id=ctx.story_id, phase=phase, number=number,
            state=AttemptState.RUNNING, worktree=str(launch.worktree), branch=story.branch,
            base_sha=story.base_sha, session=launch.session, log=str(launch.log_path),
            host=ctx.host, heartbeat_at=utcnow(), boxed=launch.box is not None))
        record(s, ctx.run_id, EventKind.ATTEMPT_STARTED, ctx.key, phase=phase, attempt=number,
               argv=launch.journaled_argv, log=str(launch.log_path), tier=story.tier or None,
               boxed=launch.box is not None,
               **({"box_argv": launch.argv} if launch.box is not None else {}))
    return attempt_id


def _supervised(ctx: StoryContext, claim: Claim, attempt_id: int,
                launch: _Launch) -> AgentResult:
    def started(pid: int) -> None:
        with ctx.db.transaction() as s:
            s.connection().execute(_SET_PID, {"attempt_id": attempt_id, "pid": pid})
        crash_point("worker.in_repair" if launch.phase == Phase.REPAIR else "worker.in_agent")

    policy = ctx.policy
    limits = Limits(timeout_s=launch.timeout, stall_s=policy.adapter.stall_s or None,
                    max_log_bytes=policy.limits.max_log_bytes,
                    thaw_after_s=policy.leases.ttl_s)  # an agent that SIGSTOPs us
    with Heartbeat(ctx, claim, attempt_id):
        command = Command(launch.argv, launch.worktree, launch.env,
                          shown=shlex.join(launch.journaled_argv),
                          note=launch.box.summary() if launch.box is not None else None)
        return supervise(command, launch.log_path,
                         limits, stop_event=claim.stop_event, on_start=started)


@dataclass(frozen=True)
class _Verdict:
    state: str
    ok: bool
    summary: str
    reason: str | None
    text: str  # the agent's words, not the event stream
    usage: Usage
    fault: AgentFault | None


def _verdict(ctx: StoryContext, phase: str, number: int, launch: _Launch,
             result: AgentResult) -> _Verdict:
    """How the session went: its attempt state, the summary and reason, its words, its usage and
    any environment fault of the CLI."""
    policy, timeout = ctx.policy, launch.timeout
    state: str = (AttemptState.INTERRUPTED if result.interrupted else AttemptState.TIMED_OUT if result.timed_out
             else AttemptState.SUCCEEDED if result.exit_code == 0 else AttemptState.FAILED)
    summaries: dict[str, str] = {
        AttemptState.INTERRUPTED: "interrupted by stop",
        AttemptState.TIMED_OUT: f"agent timed out after {timeout}s (process tree killed)",
        AttemptState.SUCCEEDED: "agent exited 0",
        AttemptState.FAILED: f"agent exited {result.exit_code}"}
    summary = summaries[state]
    reason: str | None = None
    if result.stalled:  # silent and idle for stall_s: a failed attempt (stallwatch.py)
        state, reason = AttemptState.FAILED, "stalled"
        summary = f"stalled: no output and no CPU for {policy.adapter.stall_s}s (process tree killed)"
    output = session_output(launch.log_path, result)
    cli = profile_in_use(policy, ctx.profile, phase)
    report = parse_output(cli.output if cli else "text", output)
    report = _with_usage(ctx, phase, number, report, launch.usage_path if cli is None else None, result)
    fault = None
    if cli is not None and result.exit_code is not None:
        fault = classify(report, result.exit_code, patterns=cli.faults, exit_codes=cli.fault_exit_codes)
    state, summary, reason = _judge(state, summary, reason, fault, report, result, timeout)
    text = report.text if report.structured else output
    ok = state == AttemptState.SUCCEEDED
    if phase == Phase.REVIEW and ok:
        ok = review_approved(result, text, verdict=verdict_mode(policy, ctx.profile))
        if not ok:
            summary = reason = "review requested changes"
    return _Verdict(state, ok, summary, reason, text, report.usage, fault)


def _with_usage(ctx: StoryContext, phase: str, number: int, report: SessionReport,
                usage_path: Path | None,
                result: AgentResult) -> SessionReport:
    """The report with a custom command's usage file read into it (`usage_path`; a bad file is
    journaled, not recorded); a session that reported nothing under a budget is journaled."""
    if usage_path is not None:
        usage, problem = read_usage_file(usage_path, ctx.scratch)
        report = dataclasses.replace(report, usage=usage)
        if problem is not None:
            with ctx.db.transaction() as s:
                record(s, ctx.run_id, EventKind.USAGE_INVALID, ctx.key, phase=phase, attempt=number,
                       file=str(usage_path), reason=f"{USAGE_FILE_VAR} {problem}")
    if budget_set(ctx.policy) and not report.usage.reported and not result.interrupted:
        with ctx.db.transaction() as s:
            record(s, ctx.run_id, EventKind.USAGE_MISSING, ctx.key, phase=phase, attempt=number,
                   reason="the session reported no tokens or cost while a [limits] budget is set")
    return report


def _journal_log_cut(ctx: StoryContext, phase: str, number: int, log_path: Path,
                     result: AgentResult) -> None:
    """The session's log passed `[limits] max_log_bytes` (or could not be written): say so."""
    if result.log_cut is not None:
        with ctx.db.transaction() as s:
            record(s, ctx.run_id, EventKind.LOG_TRUNCATED, ctx.key, phase=phase, attempt=number,
                   log=str(log_path), **result.log_cut.event_data())


def _session_env(ctx: StoryContext, phase_over: PhaseOverride, worktree: Path,
                 log_path: Path) -> tuple[dict[str, str], Box | None]:
    """The session's extra environment (profile, [adapter.env], the phase's, its scratch, its
    box's) and its box (None: unboxed). The box sees the HOME the agent will have."""
    policy = ctx.policy
    # Profile defaults first, so the user's [adapter.env] wins.
    extra_env = dict(ctx.profile.env) if ctx.profile and not policy.adapter.command else {}
    extra_env.update(policy.adapter.env)
    extra_env.update(phase_over.env)
    extra_env.update(sandbox_vars(ctx))
    box = agent_box(ctx, worktree, log_path, {**os.environ, **extra_env})
    extra_env.update(box.env if box else {})
    extra_env[SANDBOX_VAR] = box.backend if box else ""
    return extra_env, box


def _judge(state: str, summary: str, reason: str | None, fault: AgentFault | None,
           report: SessionReport, result: AgentResult,
           timeout: float) -> tuple[str, str, str | None]:
    """The attempt's state, summary and reason once the CLI's own report is read: an environment
    fault charges nothing (interrupted), an error the CLI reported with exit 0 fails."""
    words = report.error.strip().splitlines()[-1][:300] if report.error.strip() else ""
    if fault is not None:
        return (AttemptState.INTERRUPTED, f"agent unavailable ({fault.category}): {fault.words}",
                fault.reason())
    if state == AttemptState.SUCCEEDED and report.is_error:
        return AttemptState.FAILED, f"the agent reported an error: {words}", words or "error"
    if reason is None and state == AttemptState.FAILED:
        reason = f"exited {result.exit_code}" + (f": {words}" if words else "")
    elif reason is None and state == AttemptState.TIMED_OUT:
        reason = f"timed out after {timeout}s"
    elif reason is None and state == AttemptState.INTERRUPTED:
        reason = "stopped"
    return state, summary, reason


class Heartbeat:
    """Renews the story's lease while slow work runs, and turns `stop --now` into a kill."""

    def __init__(self, ctx: StoryContext, claim: Claim, attempt_id: int | None = None):
        self.ctx = ctx
        self.claim = claim
        self.attempt_id = attempt_id
        self.interval = max(ctx.policy.leases.ttl_s / 3.0, 0.2)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"bmad-heartbeat-{ctx.key}")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()

    def _loop(self) -> None:
        poll = min(self.interval, 0.5)
        elapsed = 0.0
        while not self._done.wait(poll):
            elapsed += poll
            try:
                with self.ctx.db.read() as s:  # two columns; no write lock for a look
                    state, mode = s.connection().execute(
                        _STOP_ASKED, {"run_id": self.ctx.run_id}).one()
                if state in (RunState.STOPPING, RunState.STOPPED) and mode == StopMode.NOW:
                    self.claim.stop_event.set()
                if elapsed >= self.interval:
                    elapsed = 0.0
                    self.claim.beat(self.attempt_id)
            except Exception:  # a missed heartbeat is not worth killing the session over
                log.exception("heartbeat failed")


def _exclude_session_dir(git: Git) -> None:
    """Keep the per-worktree session folder (prompt files) out of every `git add -A`, in any
    form: no trailing slash, so a symlink or a file of that name is ignored too."""
    exclude = git.common_dir() / "info" / "exclude"
    line = f"/{SESSION_DIR}"
    try:
        current = exclude.read_text() if exclude.exists() else ""
    except OSError:
        return
    if line not in current.splitlines():
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a") as handle:
            handle.write(("" if current.endswith("\n") or not current else "\n")
                         + f"# bmad-loop prompt files\n{line}\n")


def _write_session_files(worktree: Path, files: Mapping[str, str]) -> None:
    """A profile's own files beside the prompt (gemini: the ignore rule that lets its file tools
    read the git-ignored session folder in place)."""
    for name, text in files.items():
        write_beneath(worktree, f"{SESSION_DIR}/{name}", text.encode(), own=True)


def _read(root: Path, rel: str) -> str:
    """The story file's text; a symlink (to the policy, say) is never read into a prompt."""
    try:
        data = read_beneath(root, rel)
    except LinkRefused:
        log.warning("story file %s in %s is a symlink: not read into the prompt", rel, root)
        return ""
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace") if data is not None else ""


_GONE = "-"  # a path that differs from the base by not being there


def snapshot(git: Git, worktree: Path, base_sha: str, *, unflag: bool = False) -> dict[str, str]:
    """Path -> content id of each path of `worktree` that differs from `base_sha`. With
    `unflag` (a story's own worktree, never a person's checkout) index flags are taken off
    first: an edit hidden behind one is a change all the same."""
    if unflag:
        clear_flags(git, worktree)
    tracked = git.run("diff", "--name-only", "-z", "--no-renames", base_sha, "--", cwd=worktree).stdout
    new = git.run("ls-files", "--others", "--exclude-standard", "-z", cwd=worktree).stdout
    paths = sorted({p for p in (tracked + "\0" + new).split("\0") if p})
    present = [p for p in paths if (worktree / p).is_file()]
    ids: list[str] = []
    if present:
        out = git.run("hash-object", "--stdin-paths", cwd=worktree, input="\n".join(present) + "\n").stdout
        ids = out.split()
    found = dict(zip(present, ids))
    return {p: found.get(p, _GONE) for p in paths}


def changed_paths_between(before: dict[str, str], after: dict[str, str],
                          ignore: Iterable[str]) -> list[str]:
    """The paths whose content differs between two snapshots, except those matching `ignore`."""
    paths = set(before) | set(after)
    return sorted(p for p in paths
                  if before.get(p) != after.get(p) and not matches_any(p, list(ignore)))


SESSION_RECORD_KEY = "session_record"  # the story row's feedback entry naming the record
CUT_SUFFIX = ".cut"
SESSION_REF_PATTERN = "refs/bmad-loop/*/sessions/*/*"  # every run's, for `for-each-ref`


def session_ref(run_id: str, story_key: str, phase: str, number: int) -> str:
    return f"refs/bmad-loop/{run_id}/sessions/{story_key}/{phase}-{number}"


def session_ref_owner(ref: str) -> tuple[str, str, bool] | None:
    """(run, story, is it a cut-short run's evidence) of a session ref; None for another ref."""
    parts = ref.split("/")
    if len(parts) != 6 or parts[:2] != ["refs", "bmad-loop"] or parts[3] != "sessions":
        return None
    return parts[2], parts[4], parts[5].endswith(CUT_SUFFIX)


def before_session(ctx: StoryContext, claim: Claim, story: Story, phase: str, number: int) -> None:
    """Before an agent session of the claimed story: record where it starts, or, when the row
    names this very session's record (it is a re-run), put the worktree back to it first."""
    if not ctx.workspace.story_worktrees or not story.worktree:
        return
    worktree = Path(story.worktree)
    ref = session_ref(ctx.run_id, story.key, phase, number)
    named = (story.feedback or {}).get(SESSION_RECORD_KEY) or {}
    sha = named.get("sha")
    scratch = ctx.layout.scratch(story.key)
    if (named.get("phase"), named.get("number")) == (phase, number) and sha \
            and ctx.git.rev(ref) == sha:
        cut = put_back(ctx, worktree, sha, scratch, aside=f"{ref}{CUT_SUFFIX}")
        with ctx.db.transaction() as s:
            claim.own(s)
            record(s, ctx.run_id, EventKind.SESSION_RESTORED, story.key, phase=phase, attempt=number,
                   record=sha, ref=ref, cut=cut, cut_ref=f"{ref}{CUT_SUFFIX}" if cut else None)
        return
    sha = keep(ctx.git, worktree, ref, scratch, ctx.workspace.seeds, what="session start")
    with ctx.db.transaction() as s:
        claim.write(s, story, feedback={**(story.feedback or {}), SESSION_RECORD_KEY:
                                        {"phase": phase, "number": number, "sha": sha}})


def forget_session_record(known: Story, values: dict[str, Any]) -> None:
    """A session's outcome is written (for the row `known`): the row stops naming its record
    in that same write."""
    if (known.feedback or {}).get(SESSION_RECORD_KEY):
        values["feedback"] = {**values.get("feedback", known.feedback), SESSION_RECORD_KEY: None}


def drop_session_records(ctx: StoryContext) -> None:
    """The story is ready (its work is committed): its start records go; what a cut-short
    session left (``.cut``) stays as evidence until the run is pruned."""
    if not ctx.workspace.story_worktrees:
        return
    prefix = f"refs/bmad-loop/{ctx.run_id}/sessions/{ctx.key}/"
    refs = [r for r in ctx.git.out("for-each-ref", "--format=%(refname)", prefix).splitlines()
            if r and not r.endswith(CUT_SUFFIX)]
    if refs:
        ctx.git.run("update-ref", "--stdin", input="".join(f"delete {r}\n" for r in refs))
