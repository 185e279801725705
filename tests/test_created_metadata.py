"""A created story file's metadata is checked as a committed one's (issue 33, item 4).

Two backlog stories; the create agent (the scripted agent, a real process) writes alpha's file
with bad metadata. Each bad file fails its create attempt with planning's own one-line message
(naming the file and the story), the story escalates once `max_create_attempts` are used, and a
file a person fixes on the story branch is read on `resume` or `retry` with no agent session.
"""

from __future__ import annotations

import pytest

from support import STORY_DIR, StoryDef, create_step, drop_story_files, git, query

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"], status="backlog")
BETA = StoryDef("1-2-beta", files=["src/beta.py"], status="backlog")
POLICY = '[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n[limits]\nmax_create_attempts = 2\n'


def _with(story: StoryDef, **front) -> StoryDef:
    return StoryDef(story.key, files=story.files, status=story.status, extra_front_matter=front)


def _script(alpha_create: dict) -> dict:
    return {ALPHA.key: {"create": [alpha_create], "dev": [{"write": {"src/alpha.py": "A = 1\n"}}]},
            BETA.key: {"create": [create_step(BETA)], "dev": [{"write": {"src/beta.py": "B = 1\n"}}]}}


def _repo(make_repo, alpha_create: dict):
    repo = make_repo([ALPHA, BETA], script=_script(alpha_create), policy=POLICY)
    drop_story_files(repo, ALPHA.key, BETA.key)
    return repo


@pytest.mark.parametrize("depends_on,message", [
    ([ALPHA.key], f"dependency cycle: {ALPHA.key} -> {ALPHA.key}"),
    ([BETA.key], f"story {ALPHA.key} depends on {BETA.key}, which comes later in the plan"),
    (["9-9-nowhere"], f"story {ALPHA.key} depends on unknown story '9-9-nowhere'"),
    (7, "'depends_on' must be a list of story keys"),
])
def test_a_created_file_with_bad_dependencies_fails_its_create_and_the_story_escalates(
        make_repo, depends_on, message):
    repo = _repo(make_repo, create_step(_with(ALPHA, depends_on=depends_on)))
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    alpha = repo.story(ALPHA.key)
    where = f"{STORY_DIR}/{ALPHA.key}.md"
    # Before the fix: the file was taken, and the run paused with "no story can start"
    # (cycle, later story) or the bad key went into the row unchecked.
    assert alpha["state"] == "escalated", alpha
    assert alpha["reason"].startswith("create attempts exhausted (2): ")
    assert where in alpha["reason"] and message in alpha["reason"]
    failed = [e["data"]["reason"] for e in repo.journal() if e["kind"] == "create.failed"]
    assert len(failed) == 2 and all(message in r for r in failed)
    assert not [e for e in repo.journal() if "no story can start" in str(e["data"])]
    assert where not in repo.git("ls-tree", "-r", "--name-only", "main")


def _fix_on_the_branch(repo, depends_on) -> None:
    """A person writes alpha's story file on its branch (its worktree) and commits it."""
    alpha = repo.story(ALPHA.key)
    wt = alpha["worktree"]
    path = f"{wt}/{STORY_DIR}/{ALPHA.key}.md"
    from support import story_file_text

    open(path, "w").write(story_file_text(_with(ALPHA, depends_on=depends_on)))
    git(repo.root, "-C", wt, "add", f"{STORY_DIR}/{ALPHA.key}.md")
    git(repo.root, "-C", wt, "commit", "-q", "-m", "a person fixes the story file")


@pytest.mark.parametrize("how", ["resume", "retry"])
def test_a_story_file_a_person_fixes_on_the_branch_is_read_again(make_repo, how):
    repo = _repo(make_repo, create_step(_with(ALPHA, depends_on=[ALPHA.key])))
    assert repo.cli("run").exit_code == 3
    _fix_on_the_branch(repo, [])
    if how == "retry":
        assert repo.cli("retry", ALPHA.key, "--from", "dev").exit_code == 0
    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    creates = [c for c in repo.calls() if c["key"] == ALPHA.key and c["phase"] == "create"]
    assert len(creates) == 2  # the two failed ones: the person's file was read, no agent
    assert query(repo, "SELECT depends_on FROM stories WHERE key = ?", ALPHA.key) == [("[]",)]
    assert repo.story(ALPHA.key)["state"] == "integrated"
    assert f"{STORY_DIR}/{ALPHA.key}.md" in repo.git("ls-tree", "-r", "--name-only", "main")


def test_a_person_fix_that_is_still_wrong_escalates_at_once(make_repo):
    repo = _repo(make_repo, create_step(_with(ALPHA, depends_on=[ALPHA.key])))
    assert repo.cli("run").exit_code == 3
    _fix_on_the_branch(repo, ["9-9-nowhere"])
    assert repo.cli("resume").exit_code == 3
    alpha = repo.story(ALPHA.key)
    assert alpha["state"] == "escalated"
    assert alpha["reason"].startswith("the story file on the story branch is still invalid: ")
    assert "depends on unknown story '9-9-nowhere'" in alpha["reason"]
    assert len([c for c in repo.calls() if c["phase"] == "create" and c["key"] == ALPHA.key]) == 2
