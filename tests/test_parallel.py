"""Bounded parallel fan-out: proven with file barriers the agents block on, never with sleeps.

Each agent touches `<bar>/in-<key>` when its dev session starts and blocks until the test
creates `<bar>/go-<key>`, so the test decides exactly who is inside at the same time.
"""

import json
import signal

import pytest

from support import MERGE_NONE, StoryDef, barrier_script, git, go, inside, states, wait_until


def test_never_more_than_n_agents_run_at_once_and_n_do(make_repo, bar):
    stories = [StoryDef(f"1-{i}-s{i}", files=[f"src/s{i}.py"]) for i in range(1, 6)]
    repo = make_repo(stories, script=barrier_script(stories, bar),
                     policy=MERGE_NONE.format(n=2, strategy="merge"))
    proc = repo.spawn("run")
    keys = [s.key for s in stories]
    released = []
    for step in range(len(keys)):
        expected_inside = keys[len(released):len(released) + 2]
        wait_until(lambda: set(expected_inside) <= set(inside(bar)), what=f"{expected_inside} inside")
        current = states(repo)
        working = [k for k, v in current.items() if v in ("queued", "working")]
        assert len(working) <= 2, current
        if len(keys) - len(released) >= 2:
            assert len(working) == 2, current  # two really run at once
            waiting = [k for k in keys if k not in released and k not in expected_inside]
            assert all(current[k] == "pending" for k in waiting), current
        go(bar, expected_inside[0])
        released.append(expected_inside[0])
        wait_until(lambda: states(repo)[released[-1]] == "integrated", what=f"{released[-1]} integrated")
    assert proc.wait(timeout=60) == 0
    # Attempts never overlapped three-deep (intervals from the attempt rows).
    result = repo.cli("journal", "--json")
    events = [json.loads(line) for line in result.output.splitlines()]
    live, peak = 0, 0
    for e in events:
        if e["kind"] == "attempt.started":
            live += 1
        elif e["kind"] == "attempt.finished":
            live -= 1
        peak = max(peak, live)
    assert peak == 2


def test_two_independent_stories_are_inside_dev_together(make_repo, bar):
    # Each agent waits for the other to be inside: this only finishes if they overlap.
    a, b = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])
    script = {
        a.key: {"dev": [{"write": {"src/a.py": "A=1\n"}, "touch": [str(bar / "in-a")],
                         "wait_for": str(bar / "in-b")}]},
        b.key: {"dev": [{"write": {"src/b.py": "B=1\n"}, "touch": [str(bar / "in-b")],
                         "wait_for": str(bar / "in-a")}]},
    }
    repo = make_repo([a, b], script=script,
                     policy=MERGE_NONE.format(n=2, strategy="merge") + "[adapter]\n")
    repo.write_policy(MERGE_NONE.format(n=2, strategy="merge"))  # agent command, 60 s timeout
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert states(repo) == {a.key: "integrated", b.key: "integrated"}


def test_file_conflicts_serialise_and_the_later_story_starts_on_the_integrated_target(make_repo, bar):
    a = StoryDef("1-1-a", files=["src/shared.py"])
    b = StoryDef("1-2-b", files=["src/shared.py", "src/b.py"])
    c = StoryDef("1-3-c", files=["src/c.py"])
    script = barrier_script([a, b, c], bar)
    script[b.key]["dev"][0]["write"] = {"src/b.py": "B=1\n"}
    repo = make_repo([a, b, c], script=script, policy=MERGE_NONE.format(n=3, strategy="merge"))
    proc = repo.spawn("run")
    wait_until(lambda: {"1-1-a", "1-3-c"} <= set(inside(bar)), what="a and c inside")
    story_b = repo.story(b.key)
    assert story_b["state"] == "pending"
    assert "conflicts with 1-1-a" in story_b["waiting_for"]
    assert "src/shared.py" in story_b["waiting_for"]
    go(bar, a.key)
    wait_until(lambda: "1-2-b" in inside(bar), what="b inside once a finished")
    # b starts on a's work: stacked on a's finished branch, or on a's integration.
    story_b = repo.story(b.key)
    assert story_b["stacked_on"] in ([], [a.key])
    assert repo.git("show", f"{story_b['base_sha']}:src/shared.py") == "NAME = '1-1-a'"
    go(bar, b.key)
    go(bar, c.key)
    assert proc.wait(timeout=60) == 0
    kinds = [(e["kind"], e["story"]) for e in repo.journal() if e["kind"] == "story.waiting"]
    assert kinds.count(("story.waiting", b.key)) == 1  # held back is journaled once


@pytest.mark.parametrize("capacity", [1, 2])
def test_a_named_resource_is_never_used_beyond_its_capacity(make_repo, bar, capacity):
    stories = [StoryDef(f"1-{i}-r{i}", files=[f"src/r{i}.py"], resources=["service:db"])
               for i in range(1, 4)]
    policy = MERGE_NONE.format(n=3, strategy="merge") + f'[resources]\n"service:db" = {capacity}\n'
    repo = make_repo(stories, script=barrier_script(stories, bar), policy=policy)
    proc = repo.spawn("run")
    first = [s.key for s in stories[:capacity]]
    wait_until(lambda: set(first) <= set(inside(bar)), what=f"{first} inside")
    held = repo.story(stories[capacity].key)
    assert held["state"] == "pending"
    assert f"resource service:db at capacity ({capacity})" in held["waiting_for"]
    assert len(inside(bar)) == capacity
    for s in stories:
        wait_until(lambda: s.key in inside(bar), what=f"{s.key} inside")
        go(bar, s.key)
    assert proc.wait(timeout=60) == 0


def test_a_story_without_footprint_is_exclusive_and_the_journal_says_why(make_repo, bar):
    a = StoryDef("1-1-a", files=["src/a.py"])
    unknown = StoryDef("1-2-unknown", footprint=False)
    c = StoryDef("1-3-c", files=["src/c.py"])
    script = barrier_script([a, c], bar)
    script[unknown.key] = {"dev": [{"write": {"src/u.py": "U=1\n"}}]}
    repo = make_repo([a, unknown, c], script=script, policy=MERGE_NONE.format(n=3, strategy="merge"))
    proc = repo.spawn("run")
    wait_until(lambda: a.key in inside(bar), what="a inside")
    journal = repo.journal()
    exclusive = [e for e in journal if e["kind"] == "footprint.exclusive"]
    assert exclusive and exclusive[0]["story"] == unknown.key
    assert exclusive[0]["data"]["reason"] == "missing"
    status = repo.status()
    assert next(s for s in status["stories"] if s["key"] == unknown.key)["footprint_reason"] == "missing"
    assert repo.story(unknown.key)["state"] == "pending"
    assert repo.story(c.key)["state"] == "pending"  # an exclusive story blocks later ones too
    go(bar, a.key)
    wait_until(lambda: c.key in inside(bar), what="c inside")
    go(bar, c.key)
    assert proc.wait(timeout=60) == 0


@pytest.mark.parametrize("policy", [
    '[scm]\nmax_parallel = 2\nisolation = "none"\n',
    '[scm]\nmax_parallel = 2\nbranch_per = "run"\n',
])
def test_parallel_needs_worktree_isolation_and_a_branch_per_story(make_repo, policy):
    repo = make_repo([StoryDef("1-1-a", files=["a"])], policy=policy)
    result = repo.cli("run")
    assert result.exit_code == 2
    assert "max_parallel" in result.output
    assert repo.bmad_branches() == []


def test_integration_order_is_plan_order_when_completion_order_is_inverted(make_repo, bar):
    a, b = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])
    script = barrier_script([a, b], bar)
    repo = make_repo([a, b], script=script, policy=MERGE_NONE.format(n=2, strategy="squash"))
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, b.key)
    wait_until(lambda: repo.story(b.key)["state"] == "ready", what="b ready first")
    assert repo.story(a.key)["state"] == "working"
    assert repo.git("log", "-1", "--format=%s", "main") == "initial"  # b waits for a
    go(bar, a.key)
    assert proc.wait(timeout=60) == 0
    subjects = repo.git("log", "--format=%s", "main").splitlines()
    assert subjects == ["1-2-b: B", "1-1-a: A", "initial"]
    ready = [e["story"] for e in repo.journal() if e["kind"] == "story.ready"]
    assert ready == [b.key, a.key]


@pytest.mark.parametrize("strategy", ["ff", "merge", "squash"])
@pytest.mark.usefixtures("unboxed")  # the agents commit their own work: unboxed only
def test_a_story_composed_on_a_target_that_moved_since_it_started(make_repo, bar, strategy):
    a, b = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])
    script = barrier_script([a, b], bar)
    for s in (a, b):
        script[s.key]["dev"][0]["commit"] = True
    repo = make_repo([a, b], script=script, policy=MERGE_NONE.format(n=2, strategy=strategy))
    start = repo.git("rev-parse", "main")
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, a.key)
    wait_until(lambda: repo.story(a.key)["state"] == "integrated", what="a integrated")
    go(bar, b.key)
    assert proc.wait(timeout=60) == 0
    story_b = repo.story(b.key)
    assert story_b["base_sha"] == start  # b started before the target moved
    composed = [e for e in repo.journal() if e["kind"] == "candidate.composed" and e["story"] == b.key]
    assert composed[-1]["data"]["target_sha"] == repo.story(a.key)["integrated_sha"]
    history = repo.first_parent_trees()
    assert {"src/a.py", "src/b.py"} <= set(history[-1]["files"])
    if strategy == "ff":
        assert composed[-1]["data"]["rebased"] is True
        assert repo.git("rev-list", "--merges", "--count", "main") == "0"
        assert repo.git("log", "--format=%s", "main").splitlines() == [
            "bmad-loop: mark 1-2-b done", "1-2-b: agent commit",
            "bmad-loop: mark 1-1-a done", "1-1-a: agent commit", "initial"]
    elif strategy == "merge":
        assert [c["parents"] for c in history[1:]] == [2, 2]
    else:
        assert [c["parents"] for c in history[1:]] == [1, 1]


def test_each_story_passes_alone_but_the_combination_fails_verification(make_repo, bar):
    a, b = StoryDef("1-1-a", files=["/a.flag"]), StoryDef("1-2-b", files=["/b.flag"])
    script = barrier_script([a, b], bar)
    policy = MERGE_NONE.format(n=2, strategy="merge") + \
        '[verify]\ncommands = ["test ! -f a.flag || test ! -f b.flag || (echo BOTH FLAGS; exit 1)"]\n'
    repo = make_repo([a, b], script=script, policy=policy)
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, a.key)
    go(bar, b.key)
    assert proc.wait(timeout=60) == 3
    status = repo.status()
    assert [s["state"] for s in status["stories"]] == ["integrated", "escalated"]
    failed = [c for c in status["candidates"] if c["story"] == b.key][-1]
    assert failed["state"] == "verify-failed"
    evidence = json.loads(open(failed["evidence"]).read())
    assert "BOTH FLAGS" in evidence["output"]
    assert evidence["target_sha"] == repo.story(a.key)["integrated_sha"]
    assert repo.git("rev-parse", "main") == repo.story(a.key)["integrated_sha"]
    assert repo.git("rev-parse", failed["ref"]) == failed["candidate_sha"]  # preserved


def _lane_verify_moving_target(repo, marker=None):
    """A verify command that, only when the lane verifies a candidate, has a person commit to
    the target in the main checkout at that moment (once if `marker` is given, else always)."""
    once = f"[ ! -f {marker} ] && touch {marker} && " if marker else ""
    return (f'case "$PWD" in */candidates/*) {once}cd {repo.root} && date +%s%N > human.txt && '
            'git add human.txt && git -c user.name=h -c user.email=h@x commit -qm human ;; esac; true')


@pytest.mark.usefixtures("unboxed")  # a verify command moves the target: unboxed only
def test_target_moving_between_composition_and_advance_is_recomposed_never_forced(make_repo, tmp_path):
    a = StoryDef("1-1-a", files=["src/a.py"])
    repo = make_repo([a], script={a.key: {"dev": [{"write": {"src/a.py": "A\n"}}]}})
    verify = _lane_verify_moving_target(repo, tmp_path / "moved-once")
    repo.write_policy(MERGE_NONE.format(n=1, strategy="merge").replace("[scm]\n", "[scm]\non_foreign_move = \"accept\"\n") +
                      f"[verify]\ncommands = [{json.dumps(verify)}]\n")
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    candidates = repo.status()["candidates"]
    assert [c["state"] for c in candidates] == ["stale", "advanced"]
    assert candidates[1]["target_sha"] != candidates[0]["target_sha"]
    log = repo.git("log", "--first-parent", "--format=%s", "main").splitlines()
    assert log[0].startswith("Merge bmad-loop/") and log[1] == "human"
    assert "src/a.py" in repo.git("ls-tree", "-r", "--name-only", "main")


@pytest.mark.usefixtures("unboxed")  # a verify command moves the target: unboxed only
def test_a_target_that_keeps_moving_escalates_after_max_recompose(make_repo):
    a = StoryDef("1-1-a", files=["src/a.py"])
    repo = make_repo([a], script={a.key: {"dev": [{"write": {"src/a.py": "A\n"}}]}})
    verify = _lane_verify_moving_target(repo)
    repo.write_policy(MERGE_NONE.format(n=1, strategy="merge").replace("[scm]\n", "[scm]\non_foreign_move = \"accept\"\n") + "[limits]\nmax_recompose = 2\n" +
                      f"[verify]\ncommands = [{json.dumps(verify)}]\n")
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    story = repo.story(a.key)
    assert story["state"] == "escalated" and "max_recompose = 2" in story["reason"]
    assert [c["state"] for c in repo.status()["candidates"]] == ["stale", "stale", "stale"]
    assert "src/a.py" not in repo.git("ls-tree", "-r", "--name-only", "main")


def test_a_merge_conflict_is_preserved_and_resume_after_a_human_fix_integrates_it(make_repo, bar, escalate_at_once):
    # Both stories claim disjoint footprints but edit the same line (drift is only a warning).
    a, b = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])
    script = barrier_script([a, b], bar)
    script[a.key]["dev"][0]["write"] = {"src/a.py": "A\n", "README.md": "# by a\n"}
    script[b.key]["dev"][0]["write"] = {"src/b.py": "B\n", "README.md": "# by b\n"}
    repo = make_repo([a, b], script=script, policy=MERGE_NONE.format(n=2, strategy="merge"))
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, a.key)
    go(bar, b.key)
    assert proc.wait(timeout=60) == 3
    status = repo.status()
    cand = [c for c in status["candidates"] if c["story"] == b.key][-1]
    assert cand["state"] == "conflict"
    evidence = json.loads(open(cand["evidence"]).read())
    assert evidence["conflicts"] == ["README.md"]
    assert repo.git("rev-parse", cand["ref"])  # the conflicted candidate survives as a ref
    assert "<<<<<<<" in open(f"{cand['worktree']}/README.md").read()
    drift = [e for e in repo.journal() if e["kind"] == "footprint.drift"]
    assert {e["story"] for e in drift} == {a.key, b.key}
    # A human resolves it on the story branch.
    story_b = repo.story(b.key)
    wt = story_b["worktree"]
    git(repo.root, "-C", wt, "merge", "-q", "main", check=False)
    open(f"{wt}/README.md", "w").write("# by a and b\n")
    git(repo.root, "-C", wt, "add", "README.md")
    git(repo.root, "-C", wt, "commit", "-q", "--no-edit")
    repo.write_script({})  # no agent may run again: the default step would exit 0 anyway
    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    assert repo.git("show", "main:README.md") == "# by a and b"
    assert not [c for c in repo.calls() if c["key"] == b.key and c["phase"] == "dev"][1:]
    assert any(e["kind"] == "story.human_fix" for e in repo.journal())


def test_an_escalation_lets_siblings_finish_integrates_earlier_ones_and_keeps_later_ones_ready(make_repo, bar):
    a, b, c = (StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"]),
               StoryDef("1-3-c", files=["src/c.py"]))
    script = barrier_script([a, c], bar)
    script[b.key] = {"dev": [{"exit": 1, "say": "cannot do it", "touch": [str(bar / "in-1-2-b")]}]}
    policy = MERGE_NONE.format(n=3, strategy="merge") + "[limits]\nmax_dev_attempts = 1\n"
    repo = make_repo([a, b, c], script=script, policy=policy)
    proc = repo.spawn("run")
    wait_until(lambda: repo.story(b.key)["state"] == "escalated", what="b escalated")
    wait_until(lambda: repo.status()["run"]["state"] == "pausing", what="run pausing")
    go(bar, c.key)
    wait_until(lambda: repo.story(c.key)["state"] == "ready", what="c ready")
    go(bar, a.key)
    assert proc.wait(timeout=60) == 3
    assert states(repo) == {a.key: "integrated", b.key: "escalated", c.key: "ready"}
    assert repo.status()["run"]["state"] == "paused"
    repo.write_script({b.key: {"dev": [{"write": {"src/b.py": "B\n"}}]}})
    result = repo.cli("resume")
    assert result.exit_code == 0, result.output
    assert states(repo) == {a.key: "integrated", b.key: "integrated", c.key: "integrated"}
    merges = repo.git("log", "--first-parent", "--format=%s", "main").splitlines()
    assert [m.rsplit("/", 1)[-1] for m in merges[:3]] == [c.key, b.key, a.key]
    # c's agent ran once: its finished work was kept, not redone.
    assert len([x for x in repo.calls() if x["key"] == c.key and x["phase"] == "dev"]) == 1


def test_a_two_story_run_with_separate_worker_processes(make_repo):
    a, b = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])
    script = {s.key: {"dev": [{"write": {s.files[0]: s.key}}]} for s in (a, b)}
    repo = make_repo([a, b], script=script, policy=MERGE_NONE.format(n=2, strategy="merge"))
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip()
    stories = repo.spawn("worker", "--queue", "stories", "-w", "2", log_name="stories")
    lane = repo.spawn("worker", "--queue", "integration", log_name="lane")
    wait_until(lambda: repo.status(run_id)["run"]["state"] == "completed", what="run completed")
    hosts = {s["host"] for s in repo.status(run_id)["stories"]}
    assert len(hosts) == 1 and None not in hosts
    for proc in (stories, lane):
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    assert states(repo) == {a.key: "integrated", b.key: "integrated"}
