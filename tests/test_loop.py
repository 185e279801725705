"""The story loop end to end: real repository, real huey consumers, scripted agent."""

from pathlib import Path

import pytest

from support import ALPHA_BETA_GAMMA, StoryDef, write_each

THREE = ALPHA_BETA_GAMMA


def _script_writing_one_file_each(commit: bool):
    return write_each(THREE, commit=commit)


@pytest.mark.parametrize("isolation", ["worktree", "none"])
@pytest.mark.parametrize("strategy", ["ff", "merge", "squash"])
def test_three_story_run_leaves_exactly_the_expected_target_history(make_repo, strategy, isolation,
                                                                   request):
    if strategy == "ff":  # the agents' own commits: only an unboxed agent can commit
        request.getfixturevalue("unboxed")
    repo = make_repo(THREE, script=_script_writing_one_file_each(commit=(strategy == "ff")),
                     policy=f'[scm]\nmerge_strategy = "{strategy}"\nisolation = "{isolation}"\n'
                            '[gates]\nmode = "none"\n')
    start = repo.git("rev-parse", "main")
    result = repo.cli("run")
    assert result.exit_code == 0, result.output

    history = repo.first_parent_trees()
    assert history[0]["sha"] == start
    later = history[1:]
    if strategy == "merge":
        assert [c["subject"] for c in later] == [
            f"Merge bmad-loop/{_run_id(repo)}/{s.key}" for s in THREE]
        assert all(c["parents"] == 2 for c in later)
    elif strategy == "squash":
        assert [c["subject"] for c in later] == [
            "1-1-alpha: Alpha", "1-2-beta: Beta", "1-3-gamma: Gamma"]
        assert all(c["parents"] == 1 for c in later)
    else:  # ff: the agent's own commit, then one lane commit marking the board
        assert [c["subject"] for c in later] == [
            "1-1-alpha: agent commit", "bmad-loop: mark 1-1-alpha done",
            "1-2-beta: agent commit", "bmad-loop: mark 1-2-beta done",
            "1-3-gamma: agent commit", "bmad-loop: mark 1-3-gamma done"]
        assert all(c["parents"] == 1 for c in later)
    # Each integration step adds exactly its story's file, in plan order.
    added = [s.files[0] for s in THREE]
    for index, story_file in enumerate(added):
        assert story_file in history[-1]["files"]
    seen = [next(c for c in later if f in c["files"]) for f in added]
    assert [later.index(c) for c in seen] == sorted(later.index(c) for c in seen)
    for story in THREE:
        assert repo.board_status(story.key) == "done"
    # Policy defaults: delete_branch = true, worktrees removed once integrated.
    assert repo.bmad_branches() == []
    assert repo.worktrees() == [str(repo.root)]
    # The checkout of the target followed every advance.
    assert repo.git("status", "--porcelain") == ""
    assert repo.git("rev-parse", "HEAD") == repo.git("rev-parse", "main")
    kinds = [e["kind"] for e in repo.journal()]
    assert kinds[0] == "run.created" and kinds[-1] == "run.completed"
    assert kinds.count("story.integrated") == 3
    assert kinds.count("target.advanced") == 3


def _run_id(repo):
    return repo.status()["run"]["id"]


def test_failing_verify_gives_a_second_dev_attempt_that_sees_the_failure(make_repo, tmp_path):
    stories = [StoryDef("1-1-alpha", files=["src/alpha.py"])]
    script = {"1-1-alpha": {"dev": [
        {"write": {"src/alpha.py": "bad\n"}},
        {"write": {"src/alpha.py": "good\n"}},
    ]}}
    repo = make_repo(stories, script=script, policy=(
        '[verify]\ncommands = ["grep -q good src/alpha.py || (echo ALPHA IS BROKEN; exit 1)"]\n'))
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    dev_calls = [c for c in repo.calls() if c["phase"] == "dev"]
    assert [c["attempt"] for c in dev_calls] == [1, 2]
    assert "ALPHA IS BROKEN" not in dev_calls[0]["prompt"]
    assert "ALPHA IS BROKEN" in dev_calls[1]["prompt"]
    kinds = [e["kind"] for e in repo.journal()]
    assert kinds.count("verify.failed") == 1 and kinds.count("verify.passed") == 1
    assert repo.git("show", "main:src/alpha.py") == "good"


def test_exhausted_dev_attempts_escalate_pause_and_resume_after_a_fix_completes(make_repo):
    stories = [StoryDef("1-1-alpha", files=["src/alpha.py"])]
    script = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "bad\n"}}]}}
    repo = make_repo(stories, script=script,
                     policy='[verify]\ncommands = ["grep -q good src/alpha.py"]\n')
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    status = repo.status()
    assert status["run"]["state"] == "paused"
    story = status["stories"][0]
    assert story["state"] == "escalated" and "dev attempts" in story["reason"]
    # keep_failed = true: the branch and its worktree survive for a human.
    assert f"refs/heads/{story['branch']}" in repo.bmad_branches()
    assert Path(story["worktree"]).is_dir()
    assert repo.git("rev-parse", "main") == status["run"]["start_sha"]
    # The agent learns: its next attempt writes the right thing.
    repo.write_script({"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "good\n"}}]}})
    result = repo.cli("resume", status["run"]["id"])
    assert result.exit_code == 0, result.output
    assert repo.status()["stories"][0]["state"] == "integrated"
    assert repo.git("show", "main:src/alpha.py") == "good"
    assert repo.board_status("1-1-alpha") == "done"


def test_review_requesting_changes_runs_a_fix_cycle(make_repo):
    stories = [StoryDef("1-1-alpha", files=["src/alpha.py"])]
    script = {"1-1-alpha": {
        "dev": [{"write": {"src/alpha.py": "v1\n"}}],
        "review": [{"exit": 1, "say": "PLEASE ADD A DOCSTRING"}, {"exit": 0}],
        "fix": [{"write": {"src/alpha.py": '"""doc"""\nv1\n'}}],
    }}
    repo = make_repo(stories, script=script)
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    phases = [c["phase"] for c in repo.calls()]
    assert phases == ["dev", "review", "fix", "review"]
    fix_prompt = next(c["prompt"] for c in repo.calls() if c["phase"] == "fix")
    assert "PLEASE ADD A DOCSTRING" in fix_prompt
    assert repo.git("show", "main:src/alpha.py").startswith('"""doc"""')


def test_too_many_review_cycles_escalate(make_repo):
    stories = [StoryDef("1-1-alpha", files=["src/alpha.py"])]
    script = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "v1\n"}}],
                            "review": [{"exit": 1, "say": "no"}]}}
    repo = make_repo(stories, script=script, policy="[limits]\nmax_review_cycles = 2\n")
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    story = repo.status()["stories"][0]
    assert story["state"] == "escalated" and "review cycles exhausted" in story["reason"]
    assert [c["phase"] for c in repo.calls()] == ["dev", "review", "fix", "review", "fix", "review"]


@pytest.mark.parametrize("rollback", [True, False])
def test_in_place_escalation_keeps_the_work_and_rolls_back_only_when_asked(make_repo, rollback):
    stories = [StoryDef("1-1-alpha", files=["src/alpha.py"])]
    script = {"1-1-alpha": {"dev": [{"write": {"src/alpha.py": "half done\n"}, "exit": 1}]}}
    repo = make_repo(stories, script=script, policy=(
        f'[scm]\nisolation = "none"\nrollback_on_failure = {"true" if rollback else "false"}\n'
        '[limits]\nmax_dev_attempts = 1\n'))
    (repo.root / "notes.txt").write_text("mine\n")  # a local change of the user's, untracked
    start = repo.git("rev-parse", "main")
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    story = repo.status()["stories"][0]
    assert story["state"] == "escalated"
    assert repo.git("rev-parse", "main") == start
    assert (repo.root / "notes.txt").read_text() == "mine\n"
    if rollback:
        assert repo.git("rev-parse", "--abbrev-ref", "HEAD") == "main"
        assert not (repo.root / "src" / "alpha.py").exists()
        assert repo.git("show", f"{story['branch']}:src/alpha.py") == "half done"
    else:
        assert repo.git("rev-parse", "--abbrev-ref", "HEAD") == story["branch"]
        assert (repo.root / "src" / "alpha.py").read_text() == "half done\n"


def test_each_story_walks_its_journal_lifecycle_in_order_entering_each_phase_once(make_repo):
    """The story events of a run without faults, as `journal` readers see them: a first claim
    enters prepare at once, every later phase is entered once, and the lane's events follow."""
    repo = make_repo(THREE, script=_script_writing_one_file_each(commit=False),
                     policy='[gates]\nmode = "none"\n[review]\nenabled = false\n')
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    journal = repo.journal()
    expected = [
        ("story.queued", None), ("story.started", "prepare"), ("story.phase", "prepare"),
        ("story.prepared", None), ("story.phase", "dev"), ("attempt.started", "dev"),
        ("attempt.finished", "dev"), ("story.phase", "verify"), ("verify.passed", None),
        ("story.phase", "commit"), ("story.ready", None), ("story.integrating", None),
        ("candidate.composed", None), ("candidate.verified", None), ("target.advanced", None),
        ("story.integrated", None)]
    for story in THREE:
        walked = [(e["kind"], e["data"].get("phase")) for e in journal
                  if e["story"] == story.key and e["kind"] != "story.waiting"]
        assert walked == expected, story.key
    seqs = [e["seq"] for e in journal]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_done_checkpoint_pauses_the_run_right_after_its_story_and_resume_goes_on(make_repo, parallel):
    """`done_checkpoint: true` pauses the run once that story is integrated: no later story is
    dispatched after it (at max_parallel 1 the lane goes on from the rows it already has, so
    the run's own state must still be read after each landing), and `resume` carries on."""
    stories = [THREE[0], StoryDef("1-2-beta", files=["src/beta.py"],
                                  extra_front_matter={"done_checkpoint": True}), THREE[2]]
    repo = make_repo(stories, script=write_each(stories),
                     policy=f'[scm]\nmax_parallel = {parallel}\n[gates]\nmode = "none"\n')
    result = repo.cli("run")
    assert result.exit_code == 3, result.output  # paused: a human looks
    run_id = _run_id(repo)
    status = repo.status(run_id)
    assert status["run"]["state"] == "paused"
    states = {s["key"]: s["state"] for s in status["stories"]}
    assert states["1-1-alpha"] == states["1-2-beta"] == "integrated"
    journal = repo.journal()
    paused = [e for e in journal if e["kind"] == "run.pausing"]
    assert paused and paused[0]["data"].get("pause") == "checkpoint", paused
    if parallel == 1:  # the sequential loop: gamma never started before the checkpoint
        assert states["1-3-gamma"] == "pending"
        assert not any(e["kind"] == "story.queued" and e["story"] == "1-3-gamma" for e in journal)

    result = repo.cli("resume", run_id)
    assert result.exit_code == 0, result.output
    assert all(s["state"] == "integrated" for s in repo.status(run_id)["stories"])
    assert repo.git("show", "main:src/gamma.py") == "NAME = '1-3-gamma'"
