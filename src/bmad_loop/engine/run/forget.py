"""`cleanup --forget-database ID`: let go of a state database that is gone.

Its run records go; with `force`, the refs and worktrees of its runs too. Never a run whose
rows this database holds (a record naming another database for one of our runs is wrong, or
planted), never a database whose record is still live, never this database itself. The id
`unrecorded` names the runs found in bmad-loop's namespaces with neither a record nor rows here
(made before run records existed): they have no records to remove, so only `force` does
anything for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...db.database import database_id
from ...db.models import utcnow
from ...errors import NotFound, StateError
from ...git.worktrees import delete_ref, list_worktrees, prune, remove_worktree
from .cleanup import run_of_path, run_of_ref, worktree_leaves
from ..layout import BRANCH_NAMESPACE
from .ownership import owners
from .runrecords import read_records, records_lock, remove_record

__all__ = ["UNRECORDED", "ForgetReport", "forget_database"]

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

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def forget_database(project, db_id: str, *, force: bool = False, dry_run: bool = False,
                    has_rows: bool = True, say=None) -> ForgetReport:
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


def _namespace_refs(git) -> list[str]:
    out = git.out("for-each-ref", "--format=%(refname)", f"refs/heads/{BRANCH_NAMESPACE.rstrip('/')}",
                  "refs/bmad-loop")
    return [line for line in out.splitlines() if line]


def _remove_work(project, git, runs: set[str], refs: list[str], report, say) -> None:
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
