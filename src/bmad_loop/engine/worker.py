"""A story worker: prepare → dev → verify → review (→ fix → verify → review)* → commit → ready.

One call of `work()` is the body of one `stories` task. It claims the story row (a duplicate
message finds it already claimed and returns), then walks the phases from the one recorded in
the row, persisting each transition, so a re-queued story continues where it stopped. Slow work
(agent sessions, verification, git) never runs inside a database transaction.
"""

from __future__ import annotations

import fnmatch
import logging
import shutil
import threading
import traceback
from pathlib import Path

from sqlalchemy import select

from ..adapter import AgentCall, agent_env, render_argv, review_approved, run_agent, session_output
from ..compose import changed_paths, commit_worktree, dirty_paths
from ..db.models import Attempt, Run, Story, utcnow
from ..errors import StopRequested
from ..prompts import PHASE_INSTRUCTIONS, build_prompt, write_prompt
from ..profiles import load_profile, resolve_command
from ..worktrees import ensure_worktree
from ..footprint import path_matches
from .journal import record
from .layout import Layout
from .rows import run_policy, transition_story
from .verify import run_verify

__all__ = ["work", "StoryWorker"]

log = logging.getLogger(__name__)


class Escalate(Exception):
    """Internal: end this story's work as escalated, with a reason and evidence."""

    def __init__(self, reason: str, **evidence):
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence


def work(project, tasks, run_id: str, story_id: int) -> None:
    """Task body: claim the story, do its work, wake the lane."""
    db = project.db
    with db.transaction() as s:
        run = s.get(Run, run_id)
        if run is None or run.state not in ("running", "pausing"):
            return
        now = utcnow()
        if not transition_story(s, story_id, "queued", state="working", host=project.host,
                                heartbeat_at=now, started_at=now):
            return  # someone else has it, or it is no longer queued: a duplicate message
        story = s.get(Story, story_id)
        record(s, run_id, "story.started", story.key, phase=story.phase or "prepare",
               host=project.host)
    try:
        StoryWorker(project, run, story).run()
    except StopRequested:
        _release_after_stop(project, run_id, story_id)
    except Exception as exc:  # a bug or an environment failure: keep the work, tell a human
        log.exception("story %s failed unexpectedly", story_id)
        with db.transaction() as s:
            story = s.get(Story, story_id)
            if story.state == "working":
                story.state, story.reason, story.ended_at = "escalated", f"internal error: {exc}", utcnow()
                record(s, run_id, "story.escalated", story.key, reason=story.reason,
                       traceback=traceback.format_exc()[-4000:])
    finally:
        tasks.enqueue_lane(run_id)


def _release_after_stop(project, run_id: str, story_id: int) -> None:
    """A stop reached this story: hand it back as pending, its phase and worktree kept."""
    with project.db.transaction() as s:
        story = s.get(Story, story_id)
        if transition_story(s, story_id, "working", state="pending", heartbeat_at=None):
            record(s, run_id, "story.interrupted", story.key, phase=story.phase)


class StoryWorker:
    def __init__(self, project, run: Run, story: Story):
        self.project = project
        self.db = project.db
        self.run_id = run.id
        self.story_id = story.id
        self.key = story.key
        self.policy = run_policy(run)
        self.git = project.git(self.policy)
        self.layout = Layout(project.state_dir, run.id)
        self.target_branch = run.target_branch
        self.board_rel = _relative(run.board_path, project.root)
        self.in_place = self.policy.scm.isolation == "none"
        self.stop_event = threading.Event()
        self.profile = load_profile(self.policy.adapter.profile) if self.policy.adapter.profile else None

    # ----------------------------------------------------------------- the walk
    def run(self) -> None:
        story = self._load()
        phase = story.phase or "prepare"
        try:
            if phase == "prepare":
                self.prepare()
                story = self._load()
                phase = "verify" if story.feedback.get("human_fix") else "dev"
            while phase != "ready":
                self._check_stop()
                self._set_phase(phase)
                phase = getattr(self, f"phase_{phase}")()
        except Escalate as esc:
            self._escalate(esc.reason, esc.evidence)

    def _check_stop(self) -> None:
        with self.db.transaction() as s:
            run = s.get(Run, self.run_id)
            if run.state in ("stopping", "stopped"):
                raise StopRequested()

    # ----------------------------------------------------------------- phases
    def prepare(self) -> None:
        self._set_phase("prepare")
        story = self._load()
        base_sha = self.git.rev(f"refs/heads/{self.target_branch}")
        branch = self.layout.story_branch(self.key, self.policy.scm.branch_per)
        if self.in_place:
            worktree = self.project.root
            self._prepare_in_place(branch, base_sha)
        else:
            worktree = self.layout.story_worktree(self.key, self.policy.scm.branch_per)
            start = base_sha
            existing = self.git.rev(f"refs/heads/{branch}")
            if self.policy.scm.branch_per == "run" and existing and self.git.is_ancestor(existing, base_sha):
                # The shared run branch was integrated: move it up to the target before reuse.
                self.git.run("update-ref", f"refs/heads/{branch}", base_sha, existing)
                if worktree.exists():
                    self.git.run("reset", "-q", "--hard", base_sha, cwd=worktree)
            elif existing:
                start = existing
                # Resumed on its own branch: the story's changes are measured from the fork point.
                base_sha = self.git.out("merge-base", existing, base_sha)
            ensure_worktree(self.git, worktree, branch, start)
            self._seed(worktree)
        # A story resumed from an earlier escalation keeps its branch and records the new base.
        with self.db.transaction() as s:
            row = s.get(Story, self.story_id)
            row.worktree, row.branch = str(worktree), branch
            row.base_sha = row.base_sha if story.feedback.get("human_fix") and row.base_sha else base_sha
            record(s, self.run_id, "story.prepared", self.key, worktree=str(worktree),
                   branch=branch, base_sha=row.base_sha)

    def phase_dev(self) -> str:
        story = self._load()
        result = self._agent("dev", story.dev_attempts + 1)
        story = self._count_dev_attempt(result)
        if result["ok"]:
            return "verify"
        self._feedback(agent_failure=result["summary"])
        if story.dev_attempts >= self.policy.limits.max_dev_attempts:
            raise Escalate(f"dev attempts exhausted ({story.dev_attempts}): {result['summary']}")
        return "dev"

    def phase_verify(self) -> str:
        story = self._load()
        label = f"{story.dev_attempts}-{story.review_cycles}"
        result = run_verify(
            self.policy.verify.commands, cwd=Path(story.worktree),
            log_path=self.layout.verify_log(self.key, label),
            timeout_s=self.policy.verify.timeout_s, env=self._sandbox_env(),
            stop_event=self.stop_event,
        )
        if result.interrupted:
            raise StopRequested()
        with self.db.transaction() as s:
            record(s, self.run_id, "verify.passed" if result.ok else "verify.failed", self.key,
                   command=result.failed_command, exit_code=result.exit_code,
                   timed_out=result.timed_out, duration_s=round(result.duration_s, 3),
                   log=result.log)
        human_fix = story.feedback.get("human_fix")
        after_fix = story.feedback.get("after") == "fix"
        if result.ok:
            self._feedback(verify_output="")
            if human_fix or not self.policy.review.enabled:
                return "commit"
            return "review"
        self._feedback(verify_output=result.output, verify_command=result.failed_command)
        if human_fix:
            raise Escalate(f"verify failed on the human-fixed branch: {result.failed_command}",
                           output=result.output[-4000:])
        if after_fix:
            return self._next_fix_cycle("verify failed after fix")
        if story.dev_attempts >= self.policy.limits.max_dev_attempts:
            raise Escalate(f"verify failed after {story.dev_attempts} dev attempts: "
                           f"{result.failed_command}", output=result.output[-4000:])
        return "dev"

    def phase_review(self) -> str:
        story = self._load()
        result = self._agent("review", story.review_cycles + 1)
        if result["interrupted"]:
            raise StopRequested()
        if result["ok"]:
            with self.db.transaction() as s:
                record(s, self.run_id, "review.approved", self.key, cycle=story.review_cycles + 1)
            return "commit"
        self._feedback(review_notes=result["output"][-20_000:])
        with self.db.transaction() as s:
            record(s, self.run_id, "review.changes_requested", self.key,
                   cycle=story.review_cycles + 1, summary=result["summary"])
        return self._next_fix_cycle("review requested changes")

    def _next_fix_cycle(self, why: str) -> str:
        with self.db.transaction() as s:
            row = s.get(Story, self.story_id)
            row.review_cycles += 1
            cycles = row.review_cycles
        if cycles > self.policy.limits.max_review_cycles:
            raise Escalate(f"{why}: review cycles exhausted ({cycles - 1} fix cycles)")
        return "fix"

    def phase_fix(self) -> str:
        story = self._load()
        result = self._agent("fix", story.review_cycles)
        if result["ok"]:
            self._feedback(after="fix")
            return "verify"
        story = self._count_dev_attempt(result)
        if story.dev_attempts >= self.policy.limits.max_dev_attempts:
            raise Escalate(f"fix session failed and dev attempts are exhausted: {result['summary']}")
        return "fix"

    def phase_commit(self) -> str:
        story = self._load()
        worktree = Path(story.worktree)
        message = self._commit_message(story)
        revert = list(self.policy.scm.lane_owned) + ([self.board_rel] if self.board_rel else [])
        if self.in_place:
            head, reverted = self._commit_in_place(story, message, revert)
        else:
            head, reverted = commit_worktree(self.git, worktree, message, story.base_sha, revert,
                                             exclude=self._seed_names())
        changed = changed_paths(self.git, story.base_sha, head)
        drift = self._drift(story, changed)
        with self.db.transaction() as s:
            row = s.get(Story, self.story_id)
            row.head_sha = head
            if reverted:
                record(s, self.run_id, "story.ledger_reverted", self.key, paths=reverted)
            if drift:
                record(s, self.run_id, "footprint.drift", self.key, paths=drift,
                       action=self.policy.footprints.drift)
        if drift and self.policy.footprints.drift == "escalate":
            raise Escalate(f"footprint drift: {', '.join(drift[:10])}", paths=drift)
        with self.db.transaction() as s:
            row = s.get(Story, self.story_id)
            if transition_story(s, self.story_id, "working", state="ready", phase="commit",
                                ready_at=utcnow(), heartbeat_at=None, feedback={}):
                record(s, self.run_id, "story.ready", self.key, head_sha=head,
                       changed=len(changed))
        return "ready"

    # ----------------------------------------------------------------- agent sessions
    def _agent(self, phase: str, attempt: int) -> dict:
        story = self._load()
        policy = self.policy
        tier_name = story.tier or policy.parallel.tier or ""
        tier = policy.adapter.tiers.get(tier_name) if tier_name else None
        phase_over = policy.adapter.phase(phase)
        template = resolve_command(
            profile=policy.adapter.profile, command=policy.adapter.command,
            phase_command=phase_over.command, model=tier.model if tier else "",
            tier_args=tier.args if tier else (),
        )
        timeout = (tier.timeout_s if tier and tier.timeout_s else None) or phase_over.timeout_s \
            or policy.adapter.timeout_s
        # Inside the worktree: headless agents may not read files outside their folder.
        prompt_path = Path(story.worktree) / SESSION_DIR / f"{phase}-{attempt}.md"
        _exclude_session_dir(self.git)
        log_path = self.layout.log(self.key, phase, attempt)
        story_text = _read(self.project.root / story.story_path) if story.story_path else ""
        instructions = (self.profile.instructions.get(phase) if self.profile else None) \
            or PHASE_INSTRUCTIONS[phase]
        write_prompt(prompt_path, build_prompt(
            phase=phase, story_key=self.key, story_title=story.title, story_text=story_text,
            instructions=instructions, attempt=attempt,
            verify_output=story.feedback.get("verify_output", ""),
            review_notes=story.feedback.get("review_notes", "") if phase == "fix" else "",
            worktree=story.worktree,
        ))
        worktree = Path(story.worktree)
        story_file = str(worktree / story.story_path) if story.story_path else ""
        # Profile defaults first, so the user's [adapter.env] wins.
        extra_env = dict(self.profile.env) if self.profile and not policy.adapter.command else {}
        extra_env.update(policy.adapter.env)
        extra_env.update(phase_over.env)
        extra_env.update(self._sandbox_vars())
        call = AgentCall(phase=phase, story_key=self.key, story_file=story_file,
                         prompt_file=str(prompt_path), worktree=str(worktree), run_id=self.run_id,
                         attempt=attempt, base_sha=story.base_sha or "",
                         model=tier.model if tier else "", tier=tier_name, extra_env=extra_env)
        argv = render_argv(template, call)
        env = agent_env(call, _clean_env())
        session = f"{self.run_id}/{self.key}/{phase}-{attempt}"
        with self.db.transaction() as s:
            att = Attempt(run_id=self.run_id, story_id=self.story_id, phase=phase, number=attempt,
                          state="running", worktree=str(worktree), branch=story.branch,
                          base_sha=story.base_sha, session=session, log=str(log_path),
                          host=self.project.host, heartbeat_at=utcnow())
            s.add(att)
            s.flush()
            attempt_id = att.id
            row = s.get(Story, self.story_id)
            row.session, row.log = session, str(log_path)
            record(s, self.run_id, "attempt.started", self.key, phase=phase, attempt=attempt,
                   argv=argv, log=str(log_path))
        with _Heartbeat(self, attempt_id):
            result = run_agent(argv, cwd=worktree, env=env, log_path=log_path, timeout_s=timeout,
                               stop_event=self.stop_event,
                               on_start=lambda pid: self._set_pid(attempt_id, pid))
        state = ("interrupted" if result.interrupted else "timed-out" if result.timed_out
                 else "succeeded" if result.exit_code == 0 else "failed")
        summary = {"interrupted": "interrupted by stop",
                   "timed-out": f"agent timed out after {timeout}s (process tree killed)",
                   "succeeded": "agent exited 0",
                   "failed": f"agent exited {result.exit_code}"}[state]
        head = self.git.rev("HEAD", cwd=worktree)
        with self.db.transaction() as s:
            att = s.get(Attempt, attempt_id)
            att.state, att.exit_code, att.ended_at = state, result.exit_code, utcnow()
            att.duration_s, att.counted, att.head_sha = round(result.duration_s, 3), not result.interrupted, head
            record(s, self.run_id, "attempt.finished", self.key, phase=phase, attempt=attempt,
                   state=state, exit_code=result.exit_code, duration_s=att.duration_s)
        if result.interrupted:
            raise StopRequested()
        output = session_output(log_path, result)
        ok = state == "succeeded"
        if phase == "review":
            ok = review_approved(result, output, verdict=self._verdict_mode())
            if not ok and state == "succeeded":
                summary = "review requested changes"
        return {"ok": ok, "interrupted": False, "summary": summary, "output": output}

    def _set_pid(self, attempt_id: int, pid: int) -> None:
        with self.db.transaction() as s:
            s.get(Attempt, attempt_id).pid = pid

    def _count_dev_attempt(self, result: dict) -> Story:
        with self.db.transaction() as s:
            row = s.get(Story, self.story_id)
            row.dev_attempts += 1
            return row

    # ----------------------------------------------------------------- helpers
    def _load(self) -> Story:
        with self.db.transaction() as s:
            return s.get(Story, self.story_id)

    def _set_phase(self, phase: str) -> None:
        with self.db.transaction() as s:
            row = s.get(Story, self.story_id)
            if row.phase != phase:
                row.phase = phase
                record(s, self.run_id, "story.phase", self.key, phase=phase)
            row.heartbeat_at = utcnow()

    def _feedback(self, **values) -> None:
        with self.db.transaction() as s:
            row = s.get(Story, self.story_id)
            merged = dict(row.feedback or {})
            merged.update(values)
            row.feedback = merged

    def _escalate(self, reason: str, evidence: dict) -> None:
        story = self._load()
        head = self.git.rev("HEAD", cwd=Path(story.worktree)) if story.worktree and Path(story.worktree).exists() else None
        if self.in_place:
            head = self._leave_in_place(story) or head
        with self.db.transaction() as s:
            row = s.get(Story, self.story_id)
            if transition_story(s, self.story_id, "working", state="escalated", reason=reason,
                                head_sha=head, ended_at=utcnow(), heartbeat_at=None):
                record(s, self.run_id, "story.escalated", self.key, reason=reason,
                       phase=row.phase, head_sha=head, **evidence)

    def _commit_message(self, story: Story) -> str:
        return self.policy.scm.commit_message_template.format(
            story_key=story.key, story_title=story.title or story.key, run_id=self.run_id,
            epic=story.epic)

    def _drift(self, story: Story, changed: list[str]) -> list[str]:
        if story.footprint_reason:  # exclusive footprints conflict with everything already
            return []
        declared = list(story.footprint.get("files", [])) + list(story.footprint.get("shared", []))
        ignored = [self.board_rel] if self.board_rel else []
        return [p for p in changed if p not in ignored and not _matches_any(p, declared)]

    def _sandbox_vars(self) -> dict:
        scratch = self.layout.scratch(self.key)
        (scratch / "state").mkdir(parents=True, exist_ok=True)
        (scratch / "tmp").mkdir(parents=True, exist_ok=True)
        return {"BMAD_LOOP_STATE_DIR": str(scratch / "state"), "TMPDIR": str(scratch / "tmp")}

    def _sandbox_env(self) -> dict:
        env = _clean_env()
        env.update(self._sandbox_vars())
        return env

    def _seed_names(self) -> list[str]:
        names = list(self.policy.scm.worktree_seed)
        if self.policy.scm.seed_adapter_defaults and self.profile:
            names += list(self.profile.seed_files)
        return names

    def _seed(self, worktree: Path) -> None:
        """Copy untracked seed files (policy list + the agent profile's config) into a worktree."""
        for name in self._seed_names():
            source = self.project.root / name
            if not source.exists() or (worktree / name).exists():
                continue
            (worktree / name).parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, worktree / name)
            else:
                shutil.copy2(source, worktree / name)

    # ----------------------------------------------------------------- in place
    def _prepare_in_place(self, branch: str, base_sha: str) -> None:
        """In place: the agent works in the project's own checkout, on the story branch."""
        current = self.git.current_branch()
        if current == branch:
            return  # resumed: the checkout is already on the story branch
        if current != self.target_branch:
            raise Escalate(f"in-place isolation needs the checkout on {self.target_branch}, "
                           f"it is on {current or 'a detached HEAD'}")
        pre_dirty = sorted(p for p in dirty_paths(self.git, self.project.root)
                           if not p.startswith(".bmad-loop/"))
        snapshot = {p: self._hash_worktree_file(p) for p in pre_dirty}
        self.git.run("checkout", "-q", "-B", branch, base_sha)
        self._feedback(pre_dirty=snapshot)

    def _hash_worktree_file(self, rel: str) -> str | None:
        path = self.project.root / rel
        if not path.is_file():
            return None
        return self.git.out("hash-object", "--", rel)

    def _agent_paths_in_place(self, story: Story) -> list[str]:
        snapshot = story.feedback.get("pre_dirty", {})
        touched = []
        for rel in sorted(dirty_paths(self.git, self.project.root)):
            if rel.startswith(".bmad-loop/"):
                continue
            if rel in snapshot:
                if self._hash_worktree_file(rel) != snapshot[rel]:
                    raise Escalate(f"the agent changed {rel}, which had local changes before "
                                   "the story started", paths=[rel])
                continue
            touched.append(rel)
        return touched

    def _commit_in_place(self, story: Story, message: str, revert_globs: list[str]):
        paths = self._agent_paths_in_place(story)
        reverted = [p for p in paths if _matches_any(p, revert_globs)]
        for rel in reverted:
            if self.git.run("cat-file", "-e", f"{story.base_sha}:{rel}", check=False).returncode == 0:
                self.git.run("checkout", story.base_sha, "--", rel)
            else:
                (self.project.root / rel).unlink(missing_ok=True)
        paths = [p for p in paths if p not in reverted]
        if paths:
            self.git.run("add", "-A", "--", *paths)
            self.git.run("-c", "commit.gpgsign=false", "commit", "-q", "--no-verify", "-m", message,
                         env=self.git.identity_env())
        head = self.git.rev("HEAD")
        # Back to the target: the lane composes and advances it like any other story.
        self.git.run("checkout", "-q", self.target_branch)
        return head, reverted

    def _leave_in_place(self, story: Story) -> str | None:
        """Escalation in place: keep the agent's work on the story branch, then roll back or not."""
        if self.git.current_branch() != story.branch:
            return self.git.rev(f"refs/heads/{story.branch}") if story.branch else None
        try:
            paths = self._agent_paths_in_place(story)
        except Escalate:
            paths = []
        if not self.policy.scm.rollback_on_failure:
            return self.git.rev("HEAD")
        if paths:
            self.git.run("add", "-A", "--", *paths)
            self.git.run("-c", "commit.gpgsign=false", "commit", "-q", "--no-verify", "-m",
                         f"{self.key}: work in progress (escalated)", env=self.git.identity_env())
        head = self.git.rev("HEAD")
        self.git.run("checkout", "-q", self.target_branch)
        return head


    def _verdict_mode(self) -> str:
        """Profiles whose CLI always exits 0 mark their verdict in the output; commands use exit codes."""
        adapter = self.policy.adapter
        if self.profile and not adapter.command and not adapter.phase("review").command:
            return self.profile.verdict
        return "exit"


SESSION_DIR = ".bmad-loop-session"


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


class _Heartbeat:
    """Renews the story's heartbeat while an agent runs, and turns `stop --now` into a kill."""

    def __init__(self, worker: StoryWorker, attempt_id: int):
        self.worker = worker
        self.attempt_id = attempt_id
        self.interval = max(worker.policy.leases.ttl_s / 3.0, 0.2)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bmad-heartbeat")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()

    def _loop(self):
        poll = min(self.interval, 1.0)
        elapsed = 0.0
        while not self._done.wait(poll):
            elapsed += poll
            try:
                with self.worker.db.transaction() as s:
                    run = s.get(Run, self.worker.run_id)
                    if run.state in ("stopping", "stopped") and run.stop_mode == "now":
                        self.worker.stop_event.set()
                    if elapsed >= self.interval:
                        elapsed = 0.0
                        now = utcnow()
                        s.get(Story, self.worker.story_id).heartbeat_at = now
                        s.get(Attempt, self.attempt_id).heartbeat_at = now
            except Exception:  # a missed heartbeat is not worth killing the session over
                log.exception("heartbeat failed")


def _matches_any(path: str, patterns) -> bool:
    return any(path_matches(pattern, path) for pattern in patterns)


def _clean_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}


def _relative(path: str, root: Path) -> str | None:
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
