"""Orphan clean-up: compare the rows with `git worktree list` and bmad-loop's ref namespaces.

Only bmad-loop's own things are candidates: worktrees under `.bmad-loop/worktrees/` and
`.bmad-loop/candidates/`, branches under `refs/heads/bmad-loop/`, candidate refs under
`refs/bmad-loop/candidates/`, records of a story's output under `refs/bmad-loop/verify/`
(owned with the story's worktree, engine/verification/record.py), and where a story's agent
sessions started, `refs/bmad-loop/<run>/sessions/<story>/<phase>-<n>` (engine/worker/sessions.py;
owned the same way; a cut-short session's output, `….cut`, is kept until `--runs` prunes its
finished run). Something is *owned* while a row still needs it:

- a story that is not finished in a run that can still move (running, pausing, paused,
  stopping, stopped) owns its worktree and branch;
- an escalated, blocked or failed story keeps its worktree, branch and preserved candidates
  while its run can resume, and afterwards if `[scm] keep_failed` is true;
- an integrated story owns nothing (its branch stays only if `[scm] delete_branch` is false);
- a parked worktree (``worktrees/<run>/.pool/<n>``, see engine/workspace/pool.py) is kept only while
  its run is live (running, pausing, stopping: a worker may take it); a settled run's pool is
  emptied by the lane, so one found later was left by a crash between park and take.

Everything else in the namespaces is removed; stale worktree metadata is pruned; story rows
of this host whose worktree folder vanished are marked (`worktree` cleared, journaled), so the
next worker recreates it from the branch.

Only this state database's runs are touched (ownership.py): a worktree or ref whose run has no
rows here belongs to another database, or to nobody known (made before run records); it is
kept and listed in `foreign` with the database its run record names.

Each host cleans only its own debris: what is in its own repository (or clone) and rows that
carry its host name. In remote mode, story branches on the remote that no row owns go too.
`--runs` also removes logs, prompts, evidence, scratch folders, worktrees and the refs kept
under `refs/bmad-loop/<run>/` (a restacked story's work) of finished runs beyond
`[cleanup] keep_runs` (rows stay unless `--purge`).

**Forgetting a database** (`cleanup --forget-database ID`): let go of a state database that is
gone. Its run records go; with `force`, the refs and worktrees of its runs too. Never a run
whose rows this database holds (a record naming another database for one of our runs is wrong,
or planted), never a database whose record is still live, never this database itself. The id
`unrecorded` names the runs found in bmad-loop's namespaces with neither a record nor rows here
(made before run records existed): they have no records to remove, so only `force` does
anything for them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from sqlalchemy import ColumnElement, and_, delete, or_, select

from ...db.models import Attempt, Candidate, Event, Run, Story, utcnow
from ...git.runner import Git
from ...git.worktrees import delete_branch, delete_ref, list_worktrees, prune, remove_worktree
from ...states import (
    RUN_LIVE,
    RUN_RESUMABLE,
    RUN_TERMINAL,
    STORY_PARKED,
    Phase,
    RunState,
    StoryState,
)
from ..journal import EventKind, record
from .ownership import Owners, owners, remove_record, read_records, records_lock
from ..runpaths import BRANCH_NAMESPACE, CANDIDATE_REF_NAMESPACE, Layout
from ..verification.record import VERIFY_RECORD_NAMESPACE, record_ref, verify_record_refs
from ..worker.sessions import SESSION_REF_PATTERN, session_ref_owner
from ..runrows import run_policy
from ..workspace.pool import POOL_DIR, pool_dir
from ...db.database import database_id
from ...errors import NotFound, StateError
from ...git.targets import Target

if TYPE_CHECKING:
    from ...policy import Policy
    from ..project import Project

# `say(line)`: told of each thing done or kept, for a person.
Say = Callable[[str], None]

__all__ = ["CleanupReport", "cleanup", "run_of_ref", "run_of_path", "worktree_leaves", "UNRECORDED",
           "ForgetReport", "forget_database"]


RUN_FOLDERS = ("logs", "prompts", "evidence", "scratch", "worktrees", "candidates")


@dataclass
class CleanupReport:
    dry_run: bool
    worktrees_removed: list[str] = field(default_factory=list)
    branches_deleted: list[str] = field(default_factory=list)
    remote_branches_deleted: list[str] = field(default_factory=list)
    refs_deleted: list[str] = field(default_factory=list)
    rows_marked: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    kept_because: dict[str, dict[str, Any]] = field(default_factory=dict)  # run id -> {count, why}
    runs_pruned: list[str] = field(default_factory=list)
    pruned_metadata: bool = False
    # {item, run, database}: another database's
    foreign: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # run records that could not be read

    def keep_foreign(self, item: str, run_id: str, owners: Owners, say: Say) -> None:
        label = owners.label(run_id)
        self.foreign.append({"item": item, "run": run_id, "database": label})
        say(f"keep {item}: run {run_id} is not this database's ({label})")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def _may_own_something(runs: dict[str, Run]) -> ColumnElement[bool]:
    """The stories worth looking at: every story of a run that may still go on or keeps its
    integrated branches; of the others (runs that are over), only those neither integrated nor
    skipped. So a project's history of finished runs costs a start of `run` next to nothing."""
    whole = [rid for rid, run in runs.items()
             if run.state in RUN_RESUMABLE or not _deletes_branches(run)]
    return or_(Story.run_id.in_(whole),
               and_(Story.run_id.in_(list(runs)),
                    Story.state.not_in([StoryState.INTEGRATED, StoryState.SKIPPED])))


def _deletes_branches(run: Run) -> bool:
    """`[scm] delete_branch` of the run's snapshot, read without validating the snapshot (a
    snapshot not shaped as expected counts as keeping them: its stories are looked at)."""
    scm = run.policy.get("scm") if isinstance(run.policy, dict) else None
    return isinstance(scm, dict) and scm.get("delete_branch", True) is True


def _owned(project: Project) -> tuple[set[Path], set[str], set[str], list[tuple[int, str, str]]]:
    """Worktree paths, branch names and candidate refs that live rows still need; the pool
    folders of live runs count as worktree paths (everything under them is kept)."""
    paths: set[Path] = set()
    branches: set[str] = set()
    refs: set[str] = set()
    worktree_rows: list[tuple[int, str, str]] = []
    with project.db.transaction() as s:
        runs = {r.id: r for r in s.scalars(select(Run).where(Run.project == project.key))}
        state_dir = project.state_dir.resolve()
        paths.update(pool_dir(Layout(state_dir, r.id)) for r in runs.values() if r.state in RUN_LIVE)
        policies: dict[str, Policy] = {}  # one snapshot per run, not one per story
        for story in s.scalars(select(Story).where(_may_own_something(runs))):
            run = runs[story.run_id]
            policy = policies.get(run.id) or policies.setdefault(run.id, run_policy(run))
            live = run.state in RUN_RESUMABLE  # failed runs too: `resume` may take them over
            # An abandoned run's unfinished work is evidence like a parked story's.
            kept_unfinished = live or (run.state == RunState.ABANDONED and policy.scm.keep_failed)
            if story.state == StoryState.INTEGRATED:
                keep = not policy.scm.delete_branch
                needs_worktree = policy.scm.branch_per == "run" and live
            elif story.state in STORY_PARKED:
                keep = live or policy.scm.keep_failed
                needs_worktree = keep
            elif story.state == StoryState.SKIPPED:
                keep = needs_worktree = False
            else:
                keep = needs_worktree = kept_unfinished
                if live:
                    # Owned by convention too: a worker may be between `worktree add` and
                    # writing the row, and the lane between composing and recording.
                    layout = Layout(project.state_dir.resolve(), run.id)
                    branches.add(layout.story_branch(story.key, policy.scm.branch_per))
                    paths.add(layout.story_worktree(story.key, policy.scm.branch_per))
                    for n in range(1, policy.limits.max_recompose + 3):
                        paths.add(layout.candidate_worktree(story.key, n))
                        refs.add(layout.candidate_ref(story.key, n))
            if needs_worktree:  # the record of the agent's output for a repeated verify
                refs.update(verify_record_refs(run.id, story.key))
            if story.branch and keep:
                branches.add(story.branch)
            if story.worktree and needs_worktree:
                paths.add(Path(story.worktree).resolve())
                if story.host in (None, project.host):  # another host's path means nothing here
                    worktree_rows.append((story.id, story.worktree, story.run_id))
            if story.state in STORY_PARKED and (live or policy.scm.keep_failed):
                for cand in s.scalars(select(Candidate).where(Candidate.story_id == story.id)):
                    if cand.ref:
                        refs.add(cand.ref)
                    if cand.worktree:
                        paths.add(Path(cand.worktree).resolve())
            if story.state in (StoryState.READY, StoryState.INTEGRATING, StoryState.QUEUED,
                               StoryState.WORKING) and kept_unfinished:
                for cand in s.scalars(select(Candidate).where(Candidate.story_id == story.id)):
                    if cand.ref:
                        refs.add(cand.ref)
                    if cand.worktree:
                        paths.add(Path(cand.worktree).resolve())
    return paths, branches, refs, worktree_rows


def cleanup(project: Project, *, dry_run: bool = False, runs: bool = False, purge: bool = False,
            progress: Say | None = None, has_rows: bool = True) -> CleanupReport:
    """`has_rows` False: the project has no state database yet; no row owns anything, and
    none is created to find that out."""
    report = CleanupReport(dry_run=dry_run)
    say = progress or (lambda _msg: None)
    git = project.git()
    # Only story branches are touched here, so any target branch name will do.
    target = project.target(git, project.policy.scm.target_branch)
    state = project.state_dir.resolve()
    ours = (state / "worktrees", state / "candidates")
    # Before `--purge` deletes rows: a purged run's leftovers are still this database's to remove.
    who = _owners(project, has_rows, report, say)
    if runs and has_rows:
        _retention(project, report, dry_run=dry_run, purge=purge, say=say)
    owned_paths, owned_branches, owned_refs, worktree_rows = (
        _owned(project) if has_rows else (set(), set(), set(), []))

    sweep = _Sweep(git, who, report, dry_run, say)
    _sweep_worktrees(sweep, ours, owned_paths)
    _sweep_stray_folders(sweep, ours, owned_paths)
    _sweep_refs(sweep, owned_branches, owned_refs)
    _sweep_remote_branches(sweep, target, owned_branches)

    _mark_vanished(project, worktree_rows, report, dry_run)
    if not dry_run:
        prune(git)
        report.pruned_metadata = True
    if report.kept:
        report.kept_because = _why_kept(project, report.kept)
    return report


def _sweep_worktrees(sweep: _Sweep, ours: tuple[Path, ...], owned_paths: set[Path]) -> None:
    """Registered worktrees under bmad-loop's folders that no row of this database owns."""
    for info in list_worktrees(sweep.git):
        path = info.path.resolve()
        if not any(_under(path, base) for base in ours):
            continue  # never touch a worktree bmad-loop did not make
        run_id = run_of_path(path, ours)
        if not sweep.who.is_own(run_id):
            sweep.report.keep_foreign(str(path), run_id, sweep.who, sweep.say)
            continue
        if path in owned_paths or path.parent in owned_paths and path.parent.name == POOL_DIR:
            sweep.report.kept.append(str(path))
            continue
        sweep.say(f"remove {'parked ' if path.parent.name == POOL_DIR else ''}worktree {path}")
        sweep.report.worktrees_removed.append(str(path))
        if not sweep.dry_run:
            remove_worktree(sweep.git, path)


def _sweep_stray_folders(sweep: _Sweep, ours: tuple[Path, ...], owned_paths: set[Path]) -> None:
    """Worktree folders git no longer knows of: what a kill during `worktree add` leaves."""
    for base in ours:
        if not base.is_dir():
            continue
        for run_dir in base.iterdir():
            if not sweep.who.is_own(run_dir.name):
                continue  # another database's run (its registered worktrees are listed above)
            for leaf in _leaves(run_dir):
                resolved = leaf.resolve()
                if resolved.parent in owned_paths:
                    continue  # parked in a live run's pool
                if resolved not in owned_paths and str(resolved) not in sweep.report.worktrees_removed:
                    sweep.say(f"remove stray folder {leaf}")
                    sweep.report.worktrees_removed.append(str(leaf.resolve()))
                    if not sweep.dry_run:
                        remove_worktree(sweep.git, leaf)
            pool = run_dir / POOL_DIR
            if not sweep.dry_run and pool.resolve() not in owned_paths and pool.is_dir():
                _rmdir_quietly(pool)  # emptied above


def _owners(project: Project, has_rows: bool, report: CleanupReport, say: Say) -> Owners:
    """Who owns each run (ownership.py); run records that cannot be read are warned about."""
    who, unreadable = owners(project, has_rows)
    report.warnings.extend(unreadable)
    for line in unreadable:
        say(f"warning: {line}")
    return who


def _mark_vanished(project: Project, worktree_rows: Iterable[tuple[int, str, str]],
                   report: CleanupReport, dry_run: bool) -> None:
    """Rows of this host whose worktree folder is gone: cleared, so the next worker recreates it."""
    for story_id, worktree, run_id in worktree_rows:
        if not Path(worktree).exists():
            report.rows_marked.append(worktree)
            if not dry_run:
                with project.db.transaction() as s:
                    story = s.get_one(Story, story_id)
                    story.worktree = None
                    if story.phase not in (None, Phase.PREPARE, Phase.COMMIT):
                        story.phase = Phase.PREPARE
                    # Harmless: the story's work is committed on its branch; say so.
                    record(s, run_id, EventKind.STORY_WORKTREE_MISSING, story.key, worktree=worktree,
                           reason=f"worktree folder gone: made again from branch "
                                  f"{story.branch or '(none yet)'} (its commits are kept) when "
                                  "the story runs; nothing to do")


@dataclass
class _Sweep:
    """What the ref sweeps share: the repository, who owns which run, the report, the mode."""

    git: Git
    who: Owners
    report: CleanupReport
    dry_run: bool
    say: Callable[[str], None]


def _sweep_refs(sweep: _Sweep, owned_branches: set[str], owned_refs: set[str]) -> None:
    """Branches and candidate refs in the namespaces: another database's are kept and listed,
    this database's go unless a row owns them."""
    git, report, say = sweep.git, sweep.report, sweep.say
    listing = git.out("for-each-ref", "--format=%(refname)", f"refs/heads/{BRANCH_NAMESPACE.rstrip('/')}",
                      CANDIDATE_REF_NAMESPACE.rstrip("/"), VERIFY_RECORD_NAMESPACE.rstrip("/"),
                      SESSION_REF_PATTERN)
    for ref in [line for line in listing.splitlines() if line]:
        run_id = run_of_ref(ref)
        if not sweep.who.is_own(run_id):
            report.keep_foreign(ref, run_id, sweep.who, say)
            continue
        if ref.startswith("refs/heads/"):
            name = ref[len("refs/heads/"):]
            if name in owned_branches:
                report.kept.append(name)
                continue
            say(f"delete branch {name}")
            report.branches_deleted.append(name)
            if not sweep.dry_run:
                delete_branch(git, name)
        else:
            if ref in owned_refs or _session_ref_kept(ref, owned_refs):
                report.kept.append(ref)
                continue
            say(f"delete ref {ref}")
            report.refs_deleted.append(ref)
            if not sweep.dry_run:
                delete_ref(git, ref)


def _session_ref_kept(ref: str, owned_refs: set[str]) -> bool:
    """A session's start record is owned with its story's worktree (as the verify record is);
    a cut-short run's output (`.cut`) is evidence, pruned with its finished run (`--runs`)."""
    owner = session_ref_owner(ref)
    if owner is None:
        return False
    run_id, story_key, evidence = owner
    return evidence or record_ref(run_id, story_key) in owned_refs


def _sweep_remote_branches(sweep: _Sweep, target: Target, owned_branches: set[str]) -> None:
    """Remote mode: story branches on the remote that no row of this database owns."""
    for name in sorted(target.foreign_story_branches(BRANCH_NAMESPACE)):
        if name in owned_branches:
            continue
        run_id = run_of_ref(f"refs/heads/{name}")
        if not sweep.who.is_own(run_id):
            sweep.report.keep_foreign(f"remote {name}", run_id, sweep.who, sweep.say)
            continue
        sweep.say(f"delete remote branch {name}")
        sweep.report.remote_branches_deleted.append(name)
        if not sweep.dry_run:
            target.delete_story_branch(name)


def _why_kept(project: Project, kept: list[str]) -> dict[str, dict[str, Any]]:
    """Per run owning something kept (every kept path, branch or ref names its run): how many
    items and why they stay."""
    with project.db.read() as s:
        runs = {r.id: r for r in s.scalars(select(Run).where(Run.project == project.key))}
    why: dict[str, dict[str, Any]] = {}
    for item in kept:
        for run_id in set(item.replace("\\", "/").split("/")) & runs.keys():
            entry = why.setdefault(run_id, {"count": 0, "why": _keeps(runs[run_id])})
            entry["count"] += 1
    return why


def _keeps(run: Run) -> str:
    if run.state in RUN_RESUMABLE:
        return f"run {run.id} is {run.state}: `resume` needs them"
    scm = run_policy(run).scm
    return (f"run {run.id} is {run.state}: kept by its [scm] keep_failed = "
            f"{str(scm.keep_failed).lower()}, delete_branch = {str(scm.delete_branch).lower()}")


def _retention(project: Project, report: CleanupReport, *, dry_run: bool, purge: bool,
               say: Say) -> None:
    keep = project.policy.cleanup.keep_runs
    with project.db.transaction() as s:
        finished = list(s.scalars(select(Run).where(Run.project == project.key,
                                                    Run.state.in_(RUN_TERMINAL))
                                  .order_by(Run.created_at.desc(), Run.id.desc())))
    git = project.git()
    for run in finished[keep:]:
        say(f"prune finished run {run.id}")
        report.runs_pruned.append(run.id)
        # Work the run kept aside under its own ref namespace (a restacked story's branch head,
        # engine/lane/stacking.py) goes with the run's other files.
        kept_refs = [r for r in git.out("for-each-ref", "--format=%(refname)",
                                        f"refs/bmad-loop/{run.id}").splitlines() if r]
        report.refs_deleted.extend(kept_refs)
        if dry_run:
            continue
        for ref in kept_refs:
            delete_ref(git, ref)
        for folder in RUN_FOLDERS:
            target = project.path(folder, run.id)
            if folder in ("worktrees", "candidates") and target.is_dir():
                for leaf in _leaves(target):
                    remove_worktree(git, leaf)
            shutil.rmtree(target, ignore_errors=True)
        if purge:
            remove_record(git, run.id)  # no rows here any more: its record would say otherwise
            with project.db.transaction() as s:
                for model in (Event, Attempt, Candidate, Story):
                    s.execute(delete(model).where(model.run_id == run.id))
                s.execute(delete(Run).where(Run.id == run.id))


def run_of_ref(ref: str) -> str:
    """The run a ref of bmad-loop's namespaces belongs to: refs/heads/bmad-loop/<run>/…,
    refs/bmad-loop/candidates/<run>/…, refs/bmad-loop/verify/<run>/…, refs/bmad-loop/<run>/…"""
    for prefix in (f"refs/heads/{BRANCH_NAMESPACE}", CANDIDATE_REF_NAMESPACE, VERIFY_RECORD_NAMESPACE,
                   "refs/bmad-loop/"):
        if ref.startswith(prefix):
            return ref[len(prefix):].split("/", 1)[0]
    return ""


def run_of_path(path: Path, bases: Iterable[Path]) -> str:
    """The run a worktree under .bmad-loop/worktrees/<run>/ or …/candidates/<run>/ belongs to."""
    for base in bases:
        if _under(path, base):
            parts = path.relative_to(base.resolve()).parts
            return parts[0] if parts else ""
    return ""


def _leaves(run_dir: Path) -> list[Path]:
    """The worktree folders of one run: its story (or candidate) folders, and the parked
    worktrees inside its pool folder rather than the pool folder itself."""
    if not run_dir.is_dir():
        return []
    leaves: list[Path] = []
    for leaf in run_dir.iterdir():
        if leaf.name == POOL_DIR and leaf.is_dir() and not leaf.is_symlink():
            leaves.extend(leaf.iterdir())
        else:
            leaves.append(leaf)
    return leaves


worktree_leaves = _leaves


def _rmdir_quietly(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty: something there is still owned, or could not be removed


def _under(path: Path, base: Path) -> bool:
    try:
        path.relative_to(base.resolve())
        return True
    except ValueError:
        return False


UNRECORDED = "unrecorded"


@dataclass
class ForgetReport:
    database_id: str
    force: bool
    dry_run: bool
    runs: list[str] = field(default_factory=list)
    records_removed: list[str] = field(default_factory=list)
    refs_deleted: list[str] = field(default_factory=list)
    worktrees_removed: list[str] = field(default_factory=list)
    kept_own: list[str] = field(default_factory=list)  # runs whose rows are here: never touched

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def forget_database(project: Project, db_id: str, *, force: bool = False, dry_run: bool = False,
                    has_rows: bool = True, say: Say | None = None) -> ForgetReport:
    say = say or (lambda _m: None)
    report = ForgetReport(database_id=db_id, force=force, dry_run=dry_run)
    git = project.git()
    if has_rows and db_id == database_id(project.db):
        raise StateError(f"--forget-database {db_id}: that is this state database "
                         f"({project.database_url.split('://', 1)[0]}); nothing to forget")
    with records_lock(git):
        who, _ = owners(project, has_rows)
        refs = _namespace_refs(git)
        records, _ = read_records(git)
        if db_id == UNRECORDED:
            runs = {run_of_ref(r) for r in refs} - set(records)
        else:
            runs = {r.run for r in records.values() if r.database_id == db_id}
            live = [r for r in records.values() if r.database_id == db_id and r.live(utcnow())]
            if live:
                raise StateError(f"--forget-database {db_id}: {live[0].describe()}: it is alive; "
                                 "stop it there first (or wait until its heartbeat is stale)")
        if not runs:
            raise NotFound(f"--forget-database {db_id}: no run record names that database"
                           if db_id != UNRECORDED else
                           "--forget-database unrecorded: no unrecorded run in bmad-loop's namespaces")
        report.kept_own = sorted(r for r in runs if who.is_own(r))
        report.runs = sorted(runs - set(report.kept_own))
        for run_id in report.runs:
            if run_id in records:
                say(f"forget record of run {run_id}")
                report.records_removed.append(run_id)
                if not dry_run:
                    remove_record(git, run_id)
        if force:
            _remove_work(project, git, set(report.runs), refs, report, say)
    return report


def _namespace_refs(git: Git) -> list[str]:
    out = git.out("for-each-ref", "--format=%(refname)", f"refs/heads/{BRANCH_NAMESPACE.rstrip('/')}",
                  "refs/bmad-loop")
    return [line for line in out.splitlines() if line]


def _remove_work(project: Project, git: Git, runs: set[str], refs: list[str],
                 report: ForgetReport, say: Say) -> None:
    state = project.state_dir.resolve()
    bases = (state / "worktrees", state / "candidates")
    found = [info.path.resolve() for info in list_worktrees(git)]
    for base in bases:  # folders git no longer knows of too (a kill during `worktree add`)
        for run_id in sorted(runs):
            found.extend(leaf.resolve() for leaf in worktree_leaves(base / run_id))
    for path in dict.fromkeys(found):
        if run_of_path(path, bases) in runs:
            say(f"remove worktree {path}")
            report.worktrees_removed.append(str(path))
            if not report.dry_run:
                remove_worktree(git, path)
    for ref in refs:
        if run_of_ref(ref) in runs:
            say(f"delete ref {ref}")
            report.refs_deleted.append(ref)
            if not report.dry_run:
                delete_ref(git, ref)
    if not report.dry_run:
        prune(git)
