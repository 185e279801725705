"""`bmad-loop attach RUN [STORY]`: the story's session log, followed across its sessions.

(The `[adapter] tmux = true` mode is not built yet: these tests cover the log follower.)
"""

from support import spawn_cli, wait_for_files, ALPHA_BETA as STORIES

POLICY = '[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n'


def test_attach_follows_the_session_log_from_dev_into_review_until_the_story_leaves(
        make_repo, tmp_path):
    inside, release = tmp_path / "inside", tmp_path / "release"
    script = {"1-1-alpha": {
        "dev": [{"write": {"src/alpha.py": "A = 1\n"}, "touch": [str(inside)],
                 "wait_for": str(release), "say": "DEV SAYS HELLO"}],
        "review": [{"say": "REVIEW SAYS LGTM"}],
    }}
    repo = make_repo(STORIES[:1], script=script)
    run = spawn_cli(repo, "run")
    try:
        wait_for_files(inside)
        run_id = repo.status()["run"]["id"]
        attach = spawn_cli(repo, "attach", run_id)
        seen = attach.read_until("dev-1.log <==")
        assert "DEV SAYS HELLO" not in seen  # the agent is still held in dev
        release.write_text("go")
        code, out = attach.finish()
        assert code == 0, out
        dev_at, review_at = out.index("dev-1.log <=="), out.index("review-1.log <==")
        assert dev_at < out.index("DEV SAYS HELLO") < review_at < out.index("REVIEW SAYS LGTM")
        assert out.count("=== bmad-loop ") >= 3  # the adapter's own header and footer lines
        assert run.finish()[0] == 0
    finally:
        release.write_text("go")
        run.kill()


def test_attach_with_several_in_flight_and_no_story_lists_them_and_exits_2(make_repo, tmp_path):
    inside = {k: tmp_path / f"in-{k}" for k in ("alpha", "beta")}
    release = tmp_path / "release"
    script = {s.key: {"dev": [{"write": {s.files[0]: "x = 1\n"}, "touch": [str(inside[s.key[4:]])],
                               "wait_for": str(release), "say": f"{s.key} done"}]}
              for s in STORIES}
    repo = make_repo(STORIES, script=script, policy=POLICY)
    run = spawn_cli(repo, "run")
    try:
        wait_for_files(*inside.values())
        run_id = repo.status()["run"]["id"]
        result = repo.cli("attach", run_id)
        assert result.exit_code == 2
        message = result.output.strip()
        assert len(message.splitlines()) == 1 and "2 stories in flight, name one" in message
        assert "1-1-alpha (working, dev, session" in message and "1-2-beta (working" in message
        # Naming one picks it, by a unique fragment too; --no-follow prints and exits at once.
        result = repo.cli("attach", run_id, "1-2", "--no-follow")
        assert result.exit_code == 0, result.output
        assert f"{run_id}/1-2-beta/dev-1" in result.output and "1-1-alpha" not in result.output
        assert "=== bmad-loop " in result.output and " started " in result.output
        release.write_text("go")
        assert run.finish()[0] == 0
    finally:
        release.write_text("go")
        run.kill()


def test_attach_no_follow_prints_a_finished_storys_last_log(make_repo):
    script = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}],
                            "review": [{"say": "REVIEWED"}]}}
    repo = make_repo(STORIES[:1], script=script)
    assert repo.cli("run").exit_code == 0
    # No story in flight: the only story with a session log is the one meant; a lone
    # argument that names no run is taken as the story.
    for args in (("attach", "--no-follow"), ("attach", "alpha", "--no-follow")):
        result = repo.cli(*args)
        assert result.exit_code == 0, result.output
        assert "review-1.log <==" in result.output and "REVIEWED" in result.output
    result = repo.cli("attach", "nope", "--no-follow")
    assert result.exit_code == 2 and "no story 'nope'" in result.output


def test_attach_to_a_story_not_yet_started_waits_for_it_like_tail_f_and_no_wait_exits_2(
        make_repo, tmp_path):
    """max_parallel = 1: beta waits while alpha is held in dev. `attach 1-2-beta` (a lone
    argument: the story of the newest run) says it waits, then follows beta's log once it
    starts; `--no-wait` refuses at once with the same words; an unknown story is exit 2."""
    inside, release = tmp_path / "inside", tmp_path / "release"
    script = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}, "touch": [str(inside)],
                                     "wait_for": str(release)}]},
              "1-2-beta": {"dev": [{"write": {"src/beta.py": "B = 1\n"}, "say": "BETA AT WORK"}]}}
    repo = make_repo(STORIES, script=script, policy='[gates]\nmode = "none"\n')
    run = spawn_cli(repo, "run")
    try:
        wait_for_files(inside)
        run_id = repo.status()["run"]["id"]
        result = repo.cli("attach", "1-2-beta", "--no-wait")
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines() == [
            f"bmad-loop: run {run_id}: waiting for 1-2-beta (pending): all 1 worker slot(s) busy "
            "(--no-wait)"]
        unknown = repo.cli("attach", "9-9-nope")
        assert unknown.exit_code == 2 and "no story '9-9-nope'" in unknown.output
        attach = spawn_cli(repo, "attach", "1-2-beta")
        seen = attach.read_until("waiting for 1-2-beta (pending)")
        assert attach.proc.poll() is None and "BETA AT WORK" not in seen  # it waits
        release.write_text("go")
        code, out = attach.finish()
        assert code == 0, out
        assert out.index("waiting for 1-2-beta") < out.index("1-2-beta/dev-1.log <==") < out.index("BETA AT WORK")
        assert run.finish()[0] == 0
    finally:
        release.write_text("go")
        run.kill()
