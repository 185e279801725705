"""The test helpers leave nothing running: a spawned run killed at teardown takes its agent
sessions with it (they lead sessions of their own, out of the run's process group)."""

from __future__ import annotations

from support import StoryDef, alive, barrier_script, query, wait_for_files, wait_until

STORIES = [StoryDef("1-1-alpha", files=["src/alpha.py"])]
RUN = '[scm]\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n[review]\nenabled = false\n'


def test_kill_spawned_ends_the_agents_of_the_runs_it_kills(make_repo, bar):
    repo = make_repo(STORIES, script=barrier_script(STORIES, bar), policy=RUN)
    proc = repo.spawn("run")
    wait_for_files(bar / "in-1-1-alpha")  # the agent is inside its session, held at a barrier
    wait_until(lambda: query(repo, "SELECT pid FROM attempts WHERE pid IS NOT NULL"),
               what="the agent's pid in its attempt row")
    agent = query(repo, "SELECT pid FROM attempts WHERE pid IS NOT NULL")[0][0]
    assert alive(agent)
    repo.kill_spawned()
    assert proc.poll() is not None
    assert not alive(agent)  # without the marker sweep it would wait at its barrier for good
