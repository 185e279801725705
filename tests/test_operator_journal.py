"""`bmad-loop journal [RUN] [--follow] [--kind K] [--story S] [--json]`."""

import json

from support import spawn_cli, wait_for_files, ALPHA_BETA as STORIES



def test_journal_filters_by_kind_and_story(make_repo):
    repo = make_repo(STORIES, policy='[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n')
    assert repo.cli("run").exit_code == 0
    result = repo.cli("journal", "--kind", "story.integrated", "--json")
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [(e["kind"], e["story"]) for e in lines] == [("story.integrated", "1-1-alpha"),
                                                        ("story.integrated", "1-2-beta")]
    result = repo.cli("journal", "--story", "1-2-beta", "--kind", "attempt.started",
                      "--kind", "story.ready", "--json")
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [e["kind"] for e in lines] == ["attempt.started", "attempt.started", "story.ready"]
    assert all(e["story"] == "1-2-beta" for e in lines)
    assert set(lines[0]) == {"seq", "ts", "kind", "story", "data"}
    assert lines[0]["ts"].endswith("Z")
    text = repo.cli("journal", "--kind", "run.completed").output.splitlines()
    assert len(text) == 1 and " run.completed " in text[0] and "integrated=2" in text[0]


def test_journal_follow_prints_events_as_they_happen_until_the_run_settles(make_repo, tmp_path):
    inside, release = tmp_path / "inside-dev", tmp_path / "release"
    script = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A = 1\n"},
                                     "touch": [str(inside)], "wait_for": str(release)}]}}
    repo = make_repo(STORIES[:1], script=script)
    run = spawn_cli(repo, "run")
    try:
        wait_for_files(inside)
        follower = spawn_cli(repo, "journal", "--follow", "--json")
        # The follower has caught up with the past while the agent is still held in dev ...
        seen = follower.read_until('"attempt.started"')
        assert '"run.completed"' not in seen
        release.write_text("go")
        # ... and keeps printing what happens next, then ends by itself when the run settles.
        code, out = follower.finish()
        assert code == 0, out
        kinds = [json.loads(line)["kind"] for line in out.splitlines()]
        assert kinds[0] == "run.created" and "story.integrated" in kinds
        assert kinds[-1] == "run.completed" or "run.completed" in kinds
        seqs = [json.loads(line)["seq"] for line in out.splitlines()]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert run.finish()[0] == 0
    finally:
        release.write_text("go")
        run.kill()


def test_journal_without_run_means_the_newest_and_a_bad_run_is_exit_2(make_repo):
    repo = make_repo(STORIES[:1])
    result = repo.cli("journal")
    assert result.exit_code == 2 and "no runs yet" in result.output
    assert repo.cli("run").exit_code == 0
    assert "run.completed" in repo.cli("journal").output
    result = repo.cli("journal", "nope")
    assert result.exit_code == 2 and "no run matches 'nope'" in result.output
