"""One checkout, two state databases: neither deletes the other's work, and a live run of one
refuses a second run on its target in the other (engine/run/ownership.py).

Real processes (`bmad-loop` as a child, its database from `BMAD_LOOP_DATABASE_URL` or the SQLite
default), a real repository, real PostgreSQL. The first database's run escalates a story whose
candidate failed verification: its branch, candidate ref and worktrees are work a person will
look at, and the second database's run (whose start cleans up) must leave them alone.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import pytest

from support import StoryDef, project_argv

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
BETA = StoryDef("1-2-beta", files=["src/beta.py"])
SCRIPT = {ALPHA.key: {"dev": [{"write": {"src/alpha.py": "alpha\n"}}]},
          BETA.key: {"dev": [{"write": {"src/beta.py": "beta\n"}}]}}
# Alpha's candidate fails verification (so alpha escalates with its work kept); beta's passes.
ALPHA_CANDIDATE_FAILS = ('[verify]\ncommands = ["case \\"$(pwd -P)\\" in '
                         '*/.bmad-loop/candidates/*/1-1-alpha-*) exit 1;; esac"]\n')


def cli(repo, database_url: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "BMAD_LOOP_DATABASE_URL"}
    if database_url:
        env["BMAD_LOOP_DATABASE_URL"] = database_url
    return subprocess.run(project_argv(repo, *args), capture_output=True, text=True, env=env,
                          timeout=300)


def without_password(url: str) -> str:
    from sqlalchemy.engine import URL, make_url

    u = make_url(url)
    return URL.create(u.drivername, username=u.username, host=u.host, port=u.port,
                      database=u.database).render_as_string(hide_password=False)


def make_url_password(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    return make_url(url).password


def namespace(repo) -> list[str]:
    return sorted(repo.git("for-each-ref", "--format=%(refname)", "refs/heads/bmad-loop",
                           "refs/bmad-loop").splitlines())


def records_dir(repo) -> Path:
    return repo.root / ".git" / "bmad-loop-runs"


def record(repo, run_id: str) -> dict:
    return json.loads((records_dir(repo) / f"{run_id}.json").read_text())


def age_record(repo, run_id: str, seconds: float) -> None:
    """The first database's process is gone and its heartbeat old (written as a dead one's
    would be: the record is plain JSON in bmad-loop's folder)."""
    data = record(repo, run_id)
    beat = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds)
    data["heartbeat_at"] = beat.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    (records_dir(repo) / f"{run_id}.json").write_text(json.dumps(data))


@pytest.fixture(params=["postgresql-then-sqlite-default", "two-sqlite-files"])
def first_database(request, tmp_path) -> str:
    """The first run's database; the second is always the SQLite default under .bmad-loop/
    (the plain `bmad-loop run` in a new shell of the issue)."""
    if request.param.startswith("postgresql"):
        from sqlalchemy.engine import make_url

        # With a password (the test server trusts loopback and ignores it): it must never
        # reach the repository's records or a message.
        return make_url(request.getfixturevalue("postgres_url")).set(
            password="s3cret-pw").render_as_string(hide_password=False)
    return f"sqlite:///{tmp_path / 'first' / 'state.db'}"


def test_a_second_database_keeps_the_first_ones_work_and_refuses_its_live_run(make_repo, first_database):
    repo = make_repo([ALPHA, BETA], script=SCRIPT, policy=ALPHA_CANDIDATE_FAILS)
    first = cli(repo, first_database, "run", "--story", ALPHA.key)
    assert first.returncode == 3, first.stdout + first.stderr
    status = json.loads(cli(repo, first_database, "status", "--json").stdout)
    run_a, alpha = status["run"]["id"], status["stories"][0]
    assert alpha["state"] == "escalated"
    kept = namespace(repo)
    assert f"refs/heads/{alpha['branch']}" in kept and len(kept) >= 2  # branch + candidate ref
    worktrees_a = [alpha["worktree"], status["candidates"][0]["worktree"]]
    label_a = without_password(first_database)

    # The first database's run is live again (resumed for separate workers): a run from the
    # second database on the same target is refused, naming it, and creates nothing.
    resumed = cli(repo, first_database, "resume", run_a, "--enqueue-only")
    assert resumed.returncode == 0, resumed.stderr
    state_db = repo.root / ".bmad-loop" / "state.db"
    assert not state_db.exists() or first_database.startswith("sqlite:///" + str(state_db))
    refused = cli(repo, None, "run", "--story", BETA.key)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert run_a in refused.stderr and label_a in refused.stderr
    assert "s3cret-pw" not in refused.stderr
    assert not state_db.exists()
    assert namespace(repo) == kept
    written = record(repo, run_a)
    assert written["database"] == label_a and written["state"] == "running"
    if make_url_password(first_database):
        assert make_url_password(first_database) not in (records_dir(repo) / f"{run_a}.json").read_text()

    # Its heartbeat stops (the process that drove it is gone): the second database only warns,
    # runs, and its clean-up at start keeps every ref and worktree of the first one's run.
    age_record(repo, run_a, 3600)
    second = cli(repo, None, "run", "--story", BETA.key)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "warning:" in second.stderr and run_a in second.stderr and "stale" in second.stderr
    assert namespace(repo) == kept
    assert all(Path(p).is_dir() for p in worktrees_a)

    # `cleanup` of the second database lists them with the first one's label.
    listed = cli(repo, None, "cleanup", "--json")
    assert listed.returncode == 0, listed.stderr
    foreign = json.loads(listed.stdout)["foreign"]
    assert {f["run"] for f in foreign} == {run_a}
    assert all(label_a in f["database"] for f in foreign)
    assert {f["item"] for f in foreign} >= set(kept)
    assert namespace(repo) == kept

    # The first database is declared gone: its records go, and with --force its refs and
    # worktrees. Never this database's own id.
    db_a = record(repo, run_a)["database_id"]
    run_b = json.loads(cli(repo, None, "status", "--json").stdout)["run"]["id"]
    mine = cli(repo, None, "cleanup", "--forget-database", record(repo, run_b)["database_id"])
    assert mine.returncode == 2 and "this state database" in mine.stderr
    forgot = cli(repo, None, "cleanup", "--forget-database", db_a, "--force")
    assert forgot.returncode == 0, forgot.stderr
    assert not (records_dir(repo) / f"{run_a}.json").exists()
    assert namespace(repo) == []
    assert not any(Path(p).exists() for p in worktrees_a)
    assert (records_dir(repo) / f"{run_b}.json").exists()


# ------------------------------------------------------------------------------ hostile records
def plant(repo, run_id: str, *, database_id: str = "evil0000", state: str = "running",
          beat_s: float = 0.0, ttl_s: float = 60.0, target: str = "main") -> None:
    data = {"database_id": database_id, "database": "postgresql://mallory@db.example/evil",
            "run": run_id, "target": target, "state": state, "host": "elsewhere", "ttl_s": ttl_s,
            "heartbeat_at": (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=beat_s))
            .strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    records_dir(repo).mkdir(exist_ok=True)
    (records_dir(repo) / f"{run_id}.json").write_text(json.dumps(data))


def test_damaged_or_planted_records_never_delete_work_and_a_live_plant_only_refuses(make_repo):
    repo = make_repo([ALPHA], script=SCRIPT)
    run_id = repo.cli("enqueue").output.strip()
    own_branch = f"bmad-loop/{run_id}/{ALPHA.key}"
    repo.git("branch", own_branch)  # the live run's story branch (its rows are here)
    # Damaged, linked and unbelievable files count as no record, and say so.
    (records_dir(repo) / "broken.json").write_text("{not json")
    (records_dir(repo) / "linked.json").symlink_to(records_dir(repo) / f"{run_id}.json")
    plant(repo, "20990101-000000-huge", ttl_s=1e12)
    report = json.loads(repo.cli("cleanup", "--json").output)
    assert len(report["warnings"]) == 3 and all("not a run record" in w for w in report["warnings"])
    assert f"refs/heads/{own_branch}" in namespace(repo)

    # A record planted over our own run's, naming another database: `forget` of that database
    # keeps the run (its rows are here) and every ref of it, even with --force.
    plant(repo, run_id, beat_s=3600)
    forgot = repo.cli("cleanup", "--forget-database", "evil0000", "--force")
    assert forgot.exit_code == 0, forgot.output
    assert f"kept run {run_id}: this database holds its rows" in forgot.output
    assert f"refs/heads/{own_branch}" in namespace(repo)

    # Our run ends; a planted live record for the target refuses a new run, naming it ...
    assert repo.cli("stop", run_id).exit_code == 0
    assert repo.cli("abandon", run_id).exit_code == 0
    plant(repo, "20990101-000000-evil")
    refused = repo.cli("enqueue")
    assert refused.exit_code == 2 and "20990101-000000-evil" in refused.output
    assert "postgresql://mallory@db.example/evil" in refused.output
    # ... but one whose heartbeat is a day in the future (a skewed clock) is not believed,
    # and one for another target does not matter.
    plant(repo, "20990101-000000-evil", beat_s=-86400)
    plant(repo, "20990101-000000-other", target="release")
    started = repo.cli("enqueue")
    assert started.exit_code == 0, started.output
    assert "20990101-000000-evil" in started.output and "stale" in started.output


def test_two_databases_racing_to_enqueue_on_one_target_start_exactly_one_run(make_repo, tmp_path):
    repo = make_repo([ALPHA], script=SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "BMAD_LOOP_DATABASE_URL"}
    procs = [subprocess.Popen(project_argv(repo, "enqueue"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**env, "BMAD_LOOP_DATABASE_URL": f"sqlite:///{tmp_path / name / 'state.db'}"})
             for name in ("one", "two")]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    assert sorted(code for code, _, _ in results) == [0, 2], results
    loser = next(err for code, _, err in results if code == 2)
    winner = next(out.strip() for code, out, _ in results if code == 0)
    assert winner in loser and "another state database is driving this target" in loser
    assert [p.stem for p in records_dir(repo).glob("*.json")] == [winner]


def test_a_paused_run_of_the_first_database_holds_its_target_until_it_is_abandoned(make_repo, tmp_path):
    # Issue 45, item 14: the second database went ahead with "last heartbeat 0 s ago …
    # (stale: going ahead)", and the paused run's stories were then skipped.
    repo = make_repo([ALPHA, BETA], script=SCRIPT, policy=ALPHA_CANDIDATE_FAILS)
    first_database = f"sqlite:///{tmp_path / 'first' / 'state.db'}"
    first = cli(repo, first_database, "run", "--story", ALPHA.key)
    assert first.returncode == 3, first.stdout + first.stderr
    run_a = json.loads(cli(repo, first_database, "status", "--json").stdout)["run"]["id"]
    assert record(repo, run_a)["state"] == "paused"
    kept = namespace(repo)
    state_db = repo.root / ".bmad-loop" / "state.db"
    # Paused a moment ago, and an hour ago: a paused run beats no heart, and is never stale.
    for age in (0, 3600):
        age_record(repo, run_a, age)
        refused = cli(repo, None, "run", "--story", BETA.key)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"run {run_a} of the state database" in refused.stderr
        assert "is paused on main, since" in refused.stderr
        assert f"bmad-loop abandon {run_a}" in refused.stderr
        assert "stale" not in refused.stderr and "going ahead" not in refused.stderr
        assert not state_db.exists() and namespace(repo) == kept
    # Abandoned there, the target is free: the second database runs, with no warning about it.
    abandoned = cli(repo, first_database, "abandon", run_a)
    assert abandoned.returncode == 0, abandoned.stdout + abandoned.stderr
    second = cli(repo, None, "run", "--story", BETA.key)
    assert second.returncode == 0, second.stdout + second.stderr
    assert run_a not in second.stderr
    assert json.loads(cli(repo, None, "status", "--json").stdout)["stories"][0]["state"] == "integrated"
