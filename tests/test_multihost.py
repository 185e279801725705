"""Three "hosts" on this machine: a bare remote, one clone per host, Redis and PostgreSQL.

Each host is a separate `bmad-loop worker --clone DIR --host NAME` process: a lane, a standby
lane, and two story hosts with two threads each. Every agent blocks inside its dev session on
a file barrier, so the test knows which host holds which story when it SIGKILLs one host (the
worker process and its agents, as a machine that loses power). The other host finishes the
dead host's stories once their leases expire; the standby lane never advances the target.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess

import pytest

from support import (
    StoryDef,
    barrier_script,
    git,
    make_remote_project,
    remote_trees,
    settled_status,
    wait_until,
)

STORIES = [StoryDef(f"1-{i}-s{i}", files=[f"src/s{i}.py"]) for i in range(1, 7)]
POLICY = ('[scm]\nmax_parallel = {n}\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n'
          '[leases]\nttl_s = 3\n')


def _cli_output(project, *args) -> str:
    """`bmad-loop COMMAND --project PROJECT ... --json` in process, from another checkout."""
    from click.testing import CliRunner

    from bmad_loop.cli import cli

    result = CliRunner().invoke(cli, [args[0], "--project", str(project), *args[1:], "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _cli_json(project, *args):
    return json.loads(_cli_output(project, *args))


def _cli_lines(project, *args):
    return [json.loads(line) for line in _cli_output(project, *args).splitlines() if line.strip()]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def services(postgres_url, redis_namespace):
    return postgres_url, redis_namespace


def test_three_hosts_finish_a_sprint_when_one_story_host_dies(make_repo, tmp_path, services):
    database_url, redis = services
    bar = tmp_path / "bar"
    bar.mkdir()
    for s in STORIES:  # the single-host reference run passes its barriers at once
        (bar / f"go-{s.key}").write_text("go")
    reference = make_repo(STORIES, script=barrier_script(STORIES, bar), policy=POLICY.format(n=1),
                          name="reference")
    assert reference.cli("run").exit_code == 0
    expected = [c["tree"] for c in reference.first_parent_trees()]
    for path in bar.iterdir():
        path.unlink()

    backends = (f'[queue]\nbackend = "redis"\nurl = "{redis.url}"\n'
                f'[database]\nurl = "{database_url}"\n')
    repo, bare = make_remote_project(make_repo, STORIES, barrier_script(STORIES, bar),
                                     POLICY.format(n=4) + backends)
    from bmad_loop.engine.project import Project
    from bmad_loop.queue.tasks import queue_config

    redis.adopt(queue_config(Project.open(repo.root)).prefix)
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip().splitlines()[-1]

    def host(name, *args):
        return repo.spawn("worker", *args, "--clone", str(tmp_path / f"clone-{name}"),
                          "--host", name, log_name=name)

    lane = host("lane", "--queue", "integration")
    wait_until(lambda: any(e["kind"] == "lane.acquired" for e in repo.journal(run_id)),
               what="the first lane holds the lease")
    standby = host("standby", "--queue", "integration")
    host_a = host("a", "--queue", "stories", "-w", "2")
    host_b = host("b", "--queue", "stories", "-w", "2")
    wait_until(lambda: len(list(bar.glob("in-*"))) == 4, timeout=60, what="four agents inside dev")

    by_host = collections.defaultdict(list)
    for call in repo.calls():
        by_host[call["env"]["BMAD_LOOP_HOST"]].append(call["key"])
    assert sorted(len(keys) for keys in by_host.values()) == [2, 2], by_host
    doomed = sorted(by_host["a"])
    # Host a loses power: its worker process and its agents die at once.
    host_a.send_signal(signal.SIGKILL)
    host_a.wait(timeout=10)
    for key in doomed:
        _kill_group(int((bar / f"in-{key}").read_text()))
    for s in STORIES:
        (bar / f"go-{s.key}").write_text("go")

    settled = settled_status(repo, run_id, timeout=180)
    logs = repo.spawned_logs(2500)
    assert settled["run"]["state"] == "completed", (settled["run"]["reason"], [(s["key"], s["state"], s["host"], s["reason"]) for s in settled["stories"]], logs)
    assert standby.poll() is None and lane.poll() is None, logs

    # The remote's target holds exactly the single-host history, story by story.
    assert remote_trees(bare) == expected
    stories = {s["key"]: s for s in settled["stories"]}
    assert all(s["state"] == "integrated" for s in stories.values())
    for key in doomed:  # finished by the surviving host after the lease expired
        assert stories[key]["host"] == "b", stories[key]
    journal = repo.journal(run_id)
    recovered = sorted(e["story"] for e in journal if e["kind"] == "story.recovered")
    # Every story of the dead host was taken back. (On a loaded machine a live host's renewal
    # can also miss the 3 s lease now and then, and that story is taken back too: no work is
    # lost either way, and each story is integrated once, as the advances below show.)
    assert set(doomed) <= set(recovered), recovered
    # One lane acted: the standby never acquired the lease, and every advance came from one token.
    owners = {e["data"]["owner"].split(":")[0] for e in journal if e["kind"] == "lane.acquired"}
    assert owners == {"lane"}
    assert sum(1 for e in journal if e["kind"] == "target.advanced") == len(STORIES)
    sql = repo.cli("sql", "SELECT name, host, token FROM leases WHERE name LIKE 'lane:%'", "--json")
    assert sql.exit_code == 0, sql.output
    assert json.loads(sql.output) == [{"name": f"lane:{bare}", "host": "lane", "token": 1}]

    # Status everywhere: another checkout of the remote with the same policy sees the same run.
    other = tmp_path / "other-checkout"
    subprocess.run(["git", "clone", "-q", str(bare), str(other)], check=True)
    (other / ".bmad-loop").mkdir()
    (other / ".bmad-loop" / "policy.toml").write_text(
        (repo.root / ".bmad-loop" / "policy.toml").read_text())
    elsewhere = _cli_json(other, "status")
    assert elsewhere["run"]["id"] == run_id
    assert {s["key"]: s["host"] for s in elsewhere["stories"]} == {
        k: v["host"] for k, v in stories.items()}
    assert [r["id"] for r in _cli_json(other, "history")][:1] == [run_id]
    assert len(_cli_lines(other, "journal", run_id)) == len(repo.journal(run_id))

    for proc in (lane, standby, host_b):
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=30) for proc in (lane, standby, host_b)] == [0, 0, 0], logs

    # Clean-up on each host removes only its own debris, and remote branches no row owns.
    orphan = f"bmad-loop/{run_id}/9-9-orphan"
    git(bare, "branch", orphan, "main")
    dead_clone = tmp_path / "clone-a"
    before_b = sorted(git(tmp_path / "clone-b", "worktree", "list", "--porcelain").splitlines())
    cleaned = repo.cli("cleanup", "--clone", str(dead_clone), "--host", "a", "--json")
    assert cleaned.exit_code == 0, cleaned.output
    report = json.loads(cleaned.output)
    assert sorted(report["worktrees_removed"]) == sorted(
        str((dead_clone / ".bmad-loop" / "worktrees" / run_id / key).resolve()) for key in doomed)
    assert report["remote_branches_deleted"] == [orphan]
    assert report["rows_marked"] == []  # host b's rows are not host a's to mark
    assert sorted(git(tmp_path / "clone-b", "worktree", "list", "--porcelain").splitlines()) == before_b
    assert git(bare, "for-each-ref", "refs/heads/bmad-loop") == ""
