"""git's automatic maintenance: skipped by every commit of ours, run once when the run settles.

Real runs on real repositories; git's own trace says which processes started, and the pack
count says whether maintenance really did its work (``gc.autoPackLimit = 1`` with two packs
makes ``gc --auto`` repack; ``gc.autoDetach = false`` keeps it in the foreground).
"""

from __future__ import annotations

from pathlib import Path

from support import ALPHA_BETA_GAMMA

RUN = '[scm]\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n[review]\nenabled = false\n'
WRITE_EACH = {s.key: {"dev": [{"write": {s.files[0]: f"NAME = '{s.key}'\n"}}]} for s in ALPHA_BETA_GAMMA}


def _two_packs(repo) -> None:
    repo.git("repack", "-q")
    (repo.root / "extra.txt").write_text("a second pack\n")
    repo.git("add", "extra.txt")
    repo.git("commit", "-q", "-m", "extra")
    repo.git("repack", "-q")
    repo.git("config", "gc.autoPackLimit", "1")
    repo.git("config", "gc.autoDetach", "false")
    assert _packs(repo) == 2


def _packs(repo) -> int:
    counts = dict(line.split(": ", 1) for line in repo.git("count-objects", "-v").splitlines())
    return int(counts["packs"])


def _started(trace: Path, what: str) -> int:
    return sum(1 for line in trace.read_text().splitlines() if what in line)


def test_commits_start_no_maintenance_and_the_settled_run_runs_it_once(make_repo, tmp_path,
                                                                        monkeypatch):
    repo = make_repo(ALPHA_BETA_GAMMA, script=WRITE_EACH, policy=RUN)
    _two_packs(repo)
    trace = tmp_path / "git.trace"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    result = repo.cli("run")
    monkeypatch.delenv("GIT_TRACE")
    assert result.exit_code == 0, result.output

    # The worker commits with plumbing (commit-tree, then update-ref): one commit per story.
    assert _started(trace, "built-in: git commit-tree") >= 3
    assert _started(trace, "run_command: git maintenance") == 0  # none started by a commit
    assert _started(trace, "built-in: git maintenance run --auto") == 1  # the settled run's
    assert _packs(repo) == 1  # and it did git's work: the two packs became one


def test_a_user_who_turned_maintenance_off_gets_none(make_repo, tmp_path, monkeypatch):
    repo = make_repo(ALPHA_BETA_GAMMA, script=WRITE_EACH, policy=RUN)
    _two_packs(repo)
    repo.git("config", "maintenance.auto", "false")
    trace = tmp_path / "git.trace"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    result = repo.cli("run")
    monkeypatch.delenv("GIT_TRACE")
    assert result.exit_code == 0, result.output

    assert _started(trace, "git maintenance") == 0
    assert _started(trace, "git gc") == 0
    assert _packs(repo) == 2
