"""A typo in policy.toml (made mid-run, for `resume --reload-policy`) does not block the read
commands: they read the database from BMAD_LOOP_DATABASE_URL, else the default SQLite file,
and print one warning naming the policy's error. Commands that act still refuse (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess

from support import StoryDef, project_argv

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
TYPO = '[scm]\nmax_paralel = 2\n'
ERROR = "[scm] max_paralel: unknown key (did you mean 'max_parallel'?)"


def _cli(repo, *args, env=None):
    return subprocess.run(project_argv(repo, *args), capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))


def _finished_run(make_repo):
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}},
                     policy='[gates]\nmode = "none"\n')
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    run_id = repo.status()["run"]["id"]
    (repo.root / ".bmad-loop" / "policy.toml").write_text(TYPO)
    return repo, run_id


def test_read_commands_work_with_a_broken_policy_and_warn_once(make_repo):
    repo, run_id = _finished_run(make_repo)
    for args in (("status", "--json"), ("history", "--json"), ("journal", "--json"),
                 ("reconcile", run_id), ("attach", ALPHA.key, "--all"),
                 ("sql", "SELECT key FROM stories")):
        result = _cli(repo, *args)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        warnings = result.stderr.strip().splitlines()
        assert len(warnings) == 1 and warnings[0].startswith("bmad-loop: warning: "), (args, result.stderr)
        assert ERROR in warnings[0] and "policy.toml" in warnings[0]
        assert warnings[0].endswith("reading the state database from the default .bmad-loop/state.db")
    assert json.loads(_cli(repo, "status", "--json").stdout)["run"]["id"] == run_id
    # Acting on the run still needs a policy that loads.
    result = _cli(repo, "resume", run_id)
    assert result.returncode == 2 and ERROR in result.stderr


def test_with_a_broken_policy_the_database_comes_from_the_environment(make_repo, tmp_path):
    repo, run_id = _finished_run(make_repo)
    moved = tmp_path / "elsewhere.db"
    (repo.root / ".bmad-loop" / "state.db").rename(moved)
    for extra in ("-wal", "-shm"):
        side = repo.root / ".bmad-loop" / f"state.db{extra}"
        if side.exists():
            side.rename(tmp_path / f"elsewhere.db{extra}")
    env = {"BMAD_LOOP_DATABASE_URL": f"sqlite:///{moved}"}
    result = _cli(repo, "status", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["run"]["id"] == run_id
    assert result.stderr.strip().endswith("reading the state database from BMAD_LOOP_DATABASE_URL")
    # Without it the default file is gone: no runs, and nothing created for the question.
    result = _cli(repo, "status")
    assert result.returncode == 2 and "no runs yet" in result.stderr
    assert not (repo.root / ".bmad-loop" / "state.db").exists()
