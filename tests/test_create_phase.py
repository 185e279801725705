"""The create phase: backlog stories without a story file get one from the agent first.

Through the CLI with the scripted agent: creations run side by side, the footprints the created
files declare drive dev admission, only the story file is committed, a failing create uses its
own budget, and `[stories] create = "skip" | "require"` and a ready-for-dev story without its
file are decided before anything is written. Concurrency is proven with file barriers.
"""

from __future__ import annotations

import json

from bmad_loop.engine.lane.admission import StoryView, admit
from bmad_loop.bmad.footprint import Footprint

from support import (
    STORY_DIR, StoryDef, create_step, drop_story_files, git, go, inside, make_remote_project,
    query, states, wait_until,
)

PARALLEL = '[scm]\nmax_parallel = 2\n[gates]\nmode = "none"\n'


def both_inside(bar, me: str, other: str, **step) -> dict:
    """A step that says "I am inside" and waits until `other` is inside too: it only ends if
    the two sessions overlap."""
    return {"touch": [str(bar / f"in-{me}")], "wait_for": str(bar / f"in-{other}"), **step}


def test_backlog_stories_are_created_side_by_side_then_developed_side_by_side(make_repo, bar):
    a = StoryDef("1-1-alpha", files=["src/alpha.py"], status="backlog")
    b = StoryDef("1-2-beta", files=["src/beta.py"], status="backlog")
    board_line = f"{STORY_DIR}/sprint-status.yaml"
    script = {
        # Each creation waits for the other's: they overlap. Alpha also edits the board and
        # leaves a stray file, as create-story may: neither is committed.
        a.key: {"create": [create_step(a, **both_inside(bar, "create-a", "create-b"),
                                       append={board_line: "# touched by create\n",
                                               "stray.txt": "not a story\n"})],
                "dev": [both_inside(bar, "dev-a", "dev-b", write={"src/alpha.py": "A = 1\n"})]},
        b.key: {"create": [create_step(b, **both_inside(bar, "create-b", "create-a"))],
                "dev": [both_inside(bar, "dev-b", "dev-a", write={"src/beta.py": "B = 1\n"})]},
    }
    repo = make_repo([a, b], script=script, policy=PARALLEL)
    drop_story_files(repo, a.key, b.key)
    board_before = repo.board.read_text()

    result = repo.cli("run")

    assert result.exit_code == 0, result.output + repo.spawned_logs()
    assert states(repo) == {a.key: "integrated", b.key: "integrated"}
    assert inside(bar) == ["create-a", "create-b", "dev-a", "dev-b"]
    calls = repo.calls()
    assert sorted((c["key"], c["phase"]) for c in calls if c["phase"] in ("create", "dev")) == [
        (a.key, "create"), (a.key, "dev"), (b.key, "create"), (b.key, "dev")]
    created = next(c for c in calls if c["key"] == a.key and c["phase"] == "create")
    assert created["env"]["BMAD_LOOP_PHASE"] == "create"
    assert created["env"]["BMAD_LOOP_STORY_FILE"] == f"{created['cwd']}/{STORY_DIR}/{a.key}.md"
    assert "create-story" in created["prompt"] and "footprint" in created["prompt"]
    # The created files are on the target with the code; the stray file and the board edit not.
    tracked = repo.git("ls-tree", "-r", "--name-only", "main").splitlines()
    assert {f"{STORY_DIR}/{a.key}.md", f"{STORY_DIR}/{b.key}.md", "src/alpha.py",
            "src/beta.py"} <= set(tracked)
    assert "stray.txt" not in tracked
    assert "touched by create" not in repo.git("show", f"main:{board_line}")
    assert "src/alpha.py" in repo.git("show", f"main:{STORY_DIR}/{a.key}.md")
    assert repo.board.read_text() != board_before  # the lane wrote the statuses, nothing else
    # The rows took the declared footprints, and the journal tells the story.
    footprint = json.loads(query(repo, "SELECT footprint FROM stories WHERE key = ?", a.key)[0][0])
    assert footprint["files"] == ["src/alpha.py", f"{STORY_DIR}/{a.key}.md"]
    assert query(repo, "SELECT to_create FROM stories") == [(0,), (0,)]
    journal = repo.journal()
    discarded = [e["data"]["paths"] for e in journal if e["kind"] == "create.discarded"]
    assert discarded == [[board_line, "stray.txt"]]
    assert sorted(e["story"] for e in journal if e["kind"] == "story.created") == [a.key, b.key]
    phases = query(repo, "SELECT phase, state FROM attempts ORDER BY id")
    assert sorted(p for p, _ in phases if p in ("create", "dev")) == ["create", "create", "dev", "dev"]


def test_a_dev_waits_while_an_earlier_story_is_being_created(make_repo, bar):
    a = StoryDef("1-1-alpha", files=["src/alpha.py"], status="backlog")
    b = StoryDef("1-2-beta", files=["src/beta.py"])  # ready-for-dev, its file is there
    script = {
        a.key: {"create": [create_step(a, touch=[str(bar / "in-create-a")],
                                       wait_for=str(bar / "go-create-a"))],
                "dev": [both_inside(bar, "dev-a", "dev-b", write={"src/alpha.py": "A = 1\n"})]},
        b.key: {"dev": [both_inside(bar, "dev-b", "dev-a", write={"src/beta.py": "B = 1\n"})]},
    }
    repo = make_repo([a, b], script=script, policy=PARALLEL)
    drop_story_files(repo, a.key)
    proc = repo.spawn("run")
    wait_until(lambda: "create-a" in inside(bar), what="alpha's creation running")
    beta = wait_until(lambda: (s := repo.story(b.key))["waiting_for"] and s, what="beta held back")
    assert beta["state"] == "pending"
    assert beta["waiting_for"] == f"waits for {a.key} to be created (its footprint is not known yet)"
    assert repo.story(a.key)["phase"] == "create"
    go(bar, "create-a")
    assert proc.wait(timeout=60) == 0, repo.spawned_logs()
    assert states(repo) == {a.key: "integrated", b.key: "integrated"}
    assert {"dev-a", "dev-b"} <= set(inside(bar))  # the two devs overlapped


def test_dev_starts_from_the_target_as_it_is_after_the_creation_not_as_it_was(make_repo, bar):
    # Alpha (ready-for-dev) lands while beta's creation runs; beta's dev must start on top of it.
    a = StoryDef("1-1-alpha", files=["src/alpha.py"])
    b = StoryDef("1-2-beta", files=["src/beta.py"], status="backlog")
    script = {
        a.key: {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]},
        b.key: {"create": [create_step(b, touch=[str(bar / "in-create-b")],
                                       wait_for=str(bar / "go-create-b"))],
                "dev": [{"write": {"src/beta.py": "B = 1\n"}, "touch": [str(bar / "in-dev-b")]}]},
    }
    repo = make_repo([a, b], script=script, policy=PARALLEL)
    drop_story_files(repo, b.key)
    start = repo.git("rev-parse", "main")
    proc = repo.spawn("run")
    wait_until(lambda: "create-b" in inside(bar), what="beta's creation running")
    wait_until(lambda: states(repo)[a.key] == "integrated", what="alpha integrated")
    landed = repo.git("rev-parse", "main")
    go(bar, "create-b")
    assert proc.wait(timeout=60) == 0, repo.spawned_logs()
    beta = repo.story(b.key)
    assert beta["base_sha"] == landed != start
    # On beta's branch: the create commit, carried onto alpha's landing, then the dev commit.
    first_parent = repo.git("rev-list", "--first-parent", f"{landed}..{beta['head_sha']}").split()
    assert len(first_parent) == 2
    create_commit = first_parent[-1]
    assert repo.git("log", "-1", "--format=%s", create_commit) == f"{b.key}: create the story file"
    assert repo.git("rev-parse", f"{create_commit}^") == landed
    assert repo.git("diff-tree", "-r", "--name-only", "--no-commit-id", create_commit) == \
        f"{STORY_DIR}/{b.key}.md"


def test_remote_mode_pushes_the_created_story_file_with_its_branch(make_repo):
    a = StoryDef("1-1-alpha", files=["src/alpha.py"], status="backlog")
    script = {a.key: {"create": [create_step(a)], "dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}}
    repo, bare = make_remote_project(make_repo, [a], script, '[scm]\n[gates]\nmode = "none"\n')
    drop_story_files(repo, a.key)
    repo.git("push", "-q", "origin", "main")

    result = repo.cli("run")

    assert result.exit_code == 0, result.output
    journal = repo.journal()
    created = next(e for e in journal if e["kind"] == "story.created")
    pushes = [e["data"]["head_sha"] for e in journal if e["kind"] == "story.pushed"]
    assert pushes[0] == created["data"]["commit"]  # pushed right after create, before dev
    assert len(pushes) == 2
    assert f"{STORY_DIR}/{a.key}.md" in git(bare, "ls-tree", "-r", "--name-only", "main")


def test_a_create_that_writes_no_file_fails_and_the_story_escalates_when_the_budget_is_used(make_repo):
    a = StoryDef("1-1-alpha", files=["src/alpha.py"], status="backlog")
    script = {a.key: {"create": [{"write": {"notes.txt": "thinking\n"}, "exit": 0}]}}
    repo = make_repo([a], script=script, policy="[limits]\nmax_create_attempts = 3\n")
    drop_story_files(repo, a.key)

    result = repo.cli("run")

    assert result.exit_code == 3, result.output
    story = repo.story(a.key)
    assert story["state"] == "escalated"
    expected = f"the agent exited 0 but wrote no story file at {STORY_DIR}/{a.key}.md"
    assert story["reason"] == f"create attempts exhausted (3): {expected}"
    assert query(repo, "SELECT phase, number, state, reason FROM attempts ORDER BY id") == [
        ("create", n, "failed", expected) for n in (1, 2, 3)]
    failed = [e["data"] for e in repo.journal() if e["kind"] == "create.failed"]
    assert failed == [{"attempt": n, "reason": expected} for n in (1, 2, 3)]
    discarded = [e["data"]["paths"] for e in repo.journal() if e["kind"] == "create.discarded"]
    assert discarded == [["notes.txt"]] * 3  # each attempt starts from a clean worktree
    assert [c["phase"] for c in repo.calls()] == ["create"] * 3  # never reached dev
    assert "The previous attempt failed" in repo.calls()[1]["prompt"]
    assert f"{STORY_DIR}/{a.key}.md" not in repo.git("ls-tree", "-r", "--name-only", "main")

    # resume: a fresh create budget, and the story goes on with its create phase, then dev.
    repo.write_script({a.key: {"create": [create_step(a)],
                               "dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}})
    resumed = repo.cli("resume", repo.status()["run"]["id"])
    assert resumed.exit_code == 0, resumed.output
    assert repo.story(a.key)["state"] == "integrated"
    assert [c["phase"] for c in repo.calls()][3:5] == ["create", "dev"]
    assert f"{STORY_DIR}/{a.key}.md" in repo.git("ls-tree", "-r", "--name-only", "main")


def test_skip_leaves_stories_without_a_file_out_and_journals_each(make_repo):
    a = StoryDef("1-1-alpha", files=["src/alpha.py"], status="backlog")
    b = StoryDef("1-2-beta", files=["src/beta.py"])
    repo = make_repo([a, b], script={b.key: {"dev": [{"write": {"src/beta.py": "B = 1\n"}}]}},
                     policy='[stories]\ncreate = "skip"\n[gates]\nmode = "none"\n')
    drop_story_files(repo, a.key)

    checked = repo.cli("validate", "--json")
    assert checked.exit_code == 0, checked.output
    create = [c for c in json.loads(checked.output)["checks"] if c["name"] == "create"]
    assert create == [{"name": "create", "status": "warn",
                       "detail": f"1 backlog stories without a story file are skipped: {a.key}"}]

    result = repo.cli("run")

    assert result.exit_code == 0, result.output
    assert states(repo) == {b.key: "integrated"}
    skipped = [e for e in repo.journal() if e["kind"] == "story.skipped"]
    assert [(e["story"], e["data"]["planned"]) for e in skipped] == [(a.key, False)]
    assert all(c["key"] == b.key for c in repo.calls())
    assert repo.board_status(a.key) == "backlog"


def test_require_refuses_the_plan_naming_the_stories_and_writes_nothing(make_repo):
    a = StoryDef("1-1-alpha", files=["src/alpha.py"], status="backlog")
    b = StoryDef("1-2-beta", files=["src/beta.py"], status="backlog")
    repo = make_repo([a, b], policy='[stories]\ncreate = "require"\n')
    drop_story_files(repo, a.key, b.key)

    checked = repo.cli("validate")
    assert checked.exit_code == 2
    assert f'[stories] create = "require": no story file for {a.key}, {b.key}' in checked.output

    result = repo.cli("run")

    assert result.exit_code == 2
    assert f"no story file for {a.key}, {b.key}" in result.output
    assert not (repo.root / ".bmad-loop" / "state.db").exists()
    assert repo.bmad_branches() == []


def test_a_ready_for_dev_story_without_its_file_is_refused_before_anything_is_written(make_repo):
    a = StoryDef("1-1-alpha", files=["src/alpha.py"])  # ready-for-dev
    repo = make_repo([a])
    drop_story_files(repo, a.key)

    result = repo.cli("run")

    assert result.exit_code == 2
    line = (f"{STORY_DIR}/{a.key}.md: story {a.key} is ready-for-dev on the board but its story "
            "file does not exist")
    assert line in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (repo.root / ".bmad-loop" / "state.db").exists()
    assert repo.bmad_branches() == [] and len(repo.worktrees()) == 1


def test_in_place_isolation_refuses_the_create_phase_clearly(make_repo):
    a = StoryDef("1-1-alpha", files=["src/alpha.py"], status="backlog")
    repo = make_repo([a], policy='[scm]\nisolation = "none"\n')
    drop_story_files(repo, a.key)

    result = repo.cli("run")

    assert result.exit_code == 2
    assert '[stories] create = "agent" needs [scm] isolation = "worktree"' in result.output
    assert a.key in result.output
    assert not (repo.root / ".bmad-loop" / "state.db").exists()


# ---------------------------------------------------------------- admission, as a pure function
def view(key, seq, *, state="pending", files=(), to_create=False, approved=True, resources=()):
    reason = "missing" if to_create else None
    return StoryView(key=key, seq=seq, epic="1", state=state, approved=approved,
                     footprint=Footprint(files=tuple(files), resources=tuple(resources), reason=reason),
                     to_create=to_create)


def test_admission_creates_regardless_of_conflicts_approval_and_resources_but_holds_later_devs():
    stories = [view("1-1-a", 1, state="working", files=["src/x.py"]),
               view("1-2-b", 2, to_create=True, approved=False),
               view("1-3-c", 3, files=["src/c.py"])]
    decision = admit(stories, max_parallel=3, capacity=lambda name: 1,
                     gates_mode="per-story-spec-approval")
    assert decision.dispatch == ["1-2-b"]  # its exclusive (unknown) footprint does not hold it
    assert decision.approvals == []         # approval comes after create
    assert decision.waiting == {"1-3-c": "waits for 1-2-b to be created (its footprint is not known yet)"}


def test_admission_a_creation_still_needs_a_slot_and_a_later_creation_never_holds_an_earlier_dev():
    stories = [view("1-1-a", 1, files=["src/a.py"]),
               view("1-2-b", 2, state="working", to_create=True),
               view("1-3-c", 3, to_create=True)]
    decision = admit(stories, max_parallel=2, capacity=lambda name: 1, gates_mode="none")
    assert decision.dispatch == ["1-1-a"]
    assert decision.waiting == {"1-3-c": "all 2 worker slot(s) busy"}
