"""One agent session (dev, review or fix) of one story: prompt, argv, environment, run.

The session opens its `attempts` row as `running` before the agent starts; the caller closes
it in the same transaction that records what the session's outcome means for the story (see
worker.py), so a crash either re-runs an unfinished session (not counted) or never re-runs a
finished one.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..adapter import AgentCall, agent_env, render_argv, review_approved, run_agent, session_output
from ..db.models import Attempt, Run, Story, utcnow
from ..gitconfig_guard import ConfigWatch
from ..prompts import PHASE_INSTRUCTIONS, build_prompt, write_prompt
from ..profiles import resolve_command
from ..tmux_session import session_name, tmux_available
from ..states import AttemptState, Phase, RunState, StopMode
from .faults import crash_point
from .childenv import child_env, sandbox_vars
from .guard import read_guard_log
from .journal import record

__all__ = ["SessionResult", "run_session", "Heartbeat", "SESSION_DIR", "verdict_mode"]

log = logging.getLogger(__name__)

SESSION_DIR = ".bmad-loop-session"


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

    def attempt_values(self) -> dict:
        return {"state": self.state, "exit_code": self.exit_code, "ended_at": utcnow(),
                "duration_s": round(self.duration_s, 3), "counted": self.state != AttemptState.INTERRUPTED,
                "head_sha": self.head_sha}


def verdict_mode(policy, profile) -> str:
    """Profiles whose CLI always exits 0 mark their verdict in the output; commands use exit codes."""
    adapter = policy.adapter
    if profile and not adapter.command and not adapter.phase(Phase.REVIEW).command:
        return profile.verdict
    return "exit"


def run_session(ctx, claim, phase: str, number: int) -> SessionResult:
    """Run one agent session of the claimed story; its attempt row is left for the caller to close."""
    story = claim.load()
    policy = ctx.policy
    tier_name = story.tier or ""
    tier = policy.adapter.tiers.get(tier_name) if tier_name else None
    phase_over = policy.adapter.phase(phase)
    template = resolve_command(
        profile=policy.adapter.profile, command=policy.adapter.command,
        phase_command=phase_over.command, model=tier.model if tier else "",
        tier_args=tier.args if tier else (),
    )
    timeout = policy.adapter.timeout_for(phase, tier_name)
    worktree = Path(story.worktree)
    # Inside the worktree: headless agents may not read files outside their folder.
    prompt_path = worktree / SESSION_DIR / f"{phase}-{number}.md"
    _exclude_session_dir(ctx.git)
    log_path = ctx.layout.log(ctx.key, phase, number)
    source = ctx.target.story_source(worktree)
    story_text = _read(source / story.story_path) if story.story_path else ""
    instructions = (ctx.profile.instructions.get(phase) if ctx.profile else None) \
        or PHASE_INSTRUCTIONS[phase]
    write_prompt(prompt_path, build_prompt(
        phase=phase, story_key=ctx.key, story_title=story.title, story_text=story_text,
        instructions=instructions, attempt=number,
        verify_output=story.feedback.get("verify_output", ""),
        review_notes=story.feedback.get("review_notes", "") if phase == Phase.FIX else "",
        worktree=story.worktree,
        story_file=str(worktree / story.story_path) if story.story_path else "", epic=str(story.epic),
    ))
    story_file = str(worktree / story.story_path) if story.story_path else ""
    # Profile defaults first, so the user's [adapter.env] wins.
    extra_env = dict(ctx.profile.env) if ctx.profile and not policy.adapter.command else {}
    extra_env.update(policy.adapter.env)
    extra_env.update(phase_over.env)
    extra_env.update(sandbox_vars(ctx))
    guard_log = ctx.scratch / "guard.log"
    guard_offset = guard_log.stat().st_size if guard_log.exists() else 0
    extra_env.update(ctx.workspace.guard_env(worktree, ctx.guard_hooks, guard_log))
    call = AgentCall(phase=phase, story_key=ctx.key, story_file=story_file,
                     prompt_file=str(prompt_path), worktree=str(worktree), run_id=ctx.run_id,
                     attempt=number, base_sha=story.base_sha or "",
                     model=tier.model if tier else "", tier=tier_name, extra_env=extra_env)
    argv = render_argv(template, call)
    env = agent_env(call, child_env())
    session = f"{ctx.run_id}/{ctx.key}/{phase}-{number}"
    if policy.adapter.tmux and tmux_available():
        # Live in tmux for `attach`; the wrapper mirrors the pane into the same session log.
        session = session_name(ctx.run_id, ctx.key, phase, number)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "bmad_loop.tmux_session", session, str(log_path), "--", *argv]
    # Git configuration, hooks and drivers before the agent runs; compared before any other git.
    watch = ConfigWatch(ctx.git, worktree, ctx.scratch.parent / f"{ctx.key}.git-config.json")
    watch.begin()
    with ctx.db.transaction() as s:
        claim.own(s)  # fenced workers start no session
        att = Attempt(run_id=ctx.run_id, story_id=ctx.story_id, phase=phase, number=number,
                      state=AttemptState.RUNNING, worktree=str(worktree), branch=story.branch,
                      base_sha=story.base_sha, session=session, log=str(log_path),
                      host=ctx.host, heartbeat_at=utcnow())
        s.add(att)
        s.flush()
        attempt_id = att.id
        row = s.get(Story, ctx.story_id)
        row.session, row.log = session, str(log_path)
        record(s, ctx.run_id, "attempt.started", ctx.key, phase=phase, attempt=number,
               argv=argv, log=str(log_path), tier=tier_name or None)

    def started(pid: int) -> None:
        with ctx.db.transaction() as s:
            s.get(Attempt, attempt_id).pid = pid
        crash_point("worker.in_agent")

    with Heartbeat(ctx, claim, attempt_id):
        result = run_agent(argv, cwd=worktree, env=env, log_path=log_path, timeout_s=timeout,
                           stop_event=claim.stop_event, on_start=started,
                           thaw_after_s=policy.leases.ttl_s)  # an agent that SIGSTOPs us
    crash_point("worker.after_agent")
    config_changes = watch.end()
    state = (AttemptState.INTERRUPTED if result.interrupted else AttemptState.TIMED_OUT if result.timed_out
             else AttemptState.SUCCEEDED if result.exit_code == 0 else AttemptState.FAILED)
    summary = {AttemptState.INTERRUPTED: "interrupted by stop",
               AttemptState.TIMED_OUT: f"agent timed out after {timeout}s (process tree killed)",
               AttemptState.SUCCEEDED: "agent exited 0",
               AttemptState.FAILED: f"agent exited {result.exit_code}"}[state]
    output = session_output(log_path, result)
    ok = state == AttemptState.SUCCEEDED
    if phase == Phase.REVIEW:
        ok = review_approved(result, output, verdict=verdict_mode(policy, ctx.profile))
        if not ok and state == AttemptState.SUCCEEDED:
            summary = "review requested changes"
    head = None if config_changes else ctx.git.rev("HEAD", cwd=worktree)
    return SessionResult(attempt_id, phase, number, state, ok, summary, output, result.exit_code,
                         result.duration_s, head, read_guard_log(guard_log, guard_offset),
                         config_changes)


class Heartbeat:
    """Renews the story's lease while slow work runs, and turns `stop --now` into a kill."""

    def __init__(self, ctx, claim, attempt_id: int | None = None):
        self.ctx = ctx
        self.claim = claim
        self.attempt_id = attempt_id
        self.interval = max(ctx.policy.leases.ttl_s / 3.0, 0.2)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bmad-heartbeat")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()

    def _loop(self):
        poll = min(self.interval, 0.5)
        elapsed = 0.0
        while not self._done.wait(poll):
            elapsed += poll
            try:
                with self.ctx.db.transaction() as s:
                    run = s.get(Run, self.ctx.run_id)
                    if run.state in (RunState.STOPPING, RunState.STOPPED) and run.stop_mode == StopMode.NOW:
                        self.claim.stop_event.set()
                if elapsed >= self.interval:
                    elapsed = 0.0
                    self.claim.beat(self.attempt_id)
            except Exception:  # a missed heartbeat is not worth killing the session over
                log.exception("heartbeat failed")


def _exclude_session_dir(git) -> None:
    """Keep the per-worktree session folder (prompt files) out of every `git add -A`."""
    exclude = git.common_dir() / "info" / "exclude"
    line = f"/{SESSION_DIR}/"
    try:
        current = exclude.read_text() if exclude.exists() else ""
    except OSError:
        return
    if line not in current.splitlines():
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a") as handle:
            handle.write(("" if current.endswith("\n") or not current else "\n")
                         + f"# bmad-loop prompt files\n{line}\n")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
