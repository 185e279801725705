"""Lane policy: dependencies, merge classes, tiers, continue-on-failure, sandboxes, reconcile,
and the stale-premise check — each with a real repository, consumers and file barriers."""

import json

from support import AGENT, MERGE_NONE, StoryDef, barrier_script, go, inside, states, wait_until


def test_a_dependency_chain_runs_in_order_while_an_independent_story_overlaps_it(make_repo, bar):
    a = StoryDef("1-1-a", files=["src/a.py"])
    b = StoryDef("1-2-b", files=["src/b.py"], extra_front_matter={"depends_on": ["1-1-a"]})
    c = StoryDef("1-3-c", files=["src/c.py"])
    repo = make_repo([a, b, c], script=barrier_script([a, b, c], bar),
                     policy=MERGE_NONE.format(n=3, strategy="merge"))
    proc = repo.spawn("run")
    wait_until(lambda: {a.key, c.key} <= set(inside(bar)), what="a and c inside together")
    story_b = repo.story(b.key)
    assert story_b["state"] == "pending" and story_b["waiting_for"].startswith("depends on 1-1-a")
    assert story_b["depends_on"] == ["1-1-a"]
    go(bar, a.key)
    wait_until(lambda: b.key in inside(bar), what="b starts once a finished")
    # A dependency on a finished story is met by stacking on it (or by its integration).
    story_b = repo.story(b.key)
    assert story_b["stacked_on"] in ([], [a.key])
    assert repo.git("show", f"{story_b['base_sha']}:src/a.py") == "NAME = '1-1-a'"
    go(bar, b.key)
    go(bar, c.key)
    assert proc.wait(timeout=60) == 0


def test_an_operator_story_holds_its_verified_candidate_until_approve(make_repo):
    a = StoryDef("1-1-a", files=["src/a.py"], extra_front_matter={"merge_class": "operator"})
    b = StoryDef("1-2-b", files=["src/b.py"])
    script = {s.key: {"dev": [{"write": {s.files[0]: s.key}}]} for s in (a, b)}
    repo = make_repo([a, b], script=script, policy=MERGE_NONE.format(n=2, strategy="merge"))
    start = repo.git("rev-parse", "main")
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    status = repo.status()
    assert states(repo) == {a.key: "held", b.key: "ready"}  # b waits behind the held story
    assert status["stories"][0]["merge_class"] == "operator"
    held = [c for c in status["candidates"] if c["story"] == a.key][-1]
    assert held["state"] == "verified" and held["candidate_sha"]
    assert repo.git("rev-parse", "main") == start
    run_id = status["run"]["id"]
    assert repo.cli("approve", run_id, a.key).exit_code == 0
    result = repo.cli("resume", run_id)
    assert result.exit_code == 0, result.output
    assert states(repo) == {a.key: "integrated", b.key: "integrated"}
    kinds = [e["kind"] for e in repo.journal()]
    assert "story.held" in kinds and "story.approved" in kinds


def test_reject_parks_a_held_story_with_the_operators_reason(make_repo):
    a = StoryDef("1-1-a", files=["src/a.py"], extra_front_matter={"merge_class": "operator"})
    repo = make_repo([a], script={a.key: {"dev": [{"write": {"src/a.py": "A"}}]}})
    assert repo.cli("run").exit_code == 3
    run_id = repo.status()["run"]["id"]
    result = repo.cli("reject", run_id, a.key, "--reason", "not this quarter")
    assert result.exit_code == 0, result.output
    story = repo.story(a.key)
    assert story["state"] == "escalated" and "not this quarter" in story["reason"]
    assert repo.cli("reject", run_id, a.key, "--reason", "again").exit_code == 2
    report = json.loads(repo.cli("reconcile", run_id, "--json").output)
    assert report["stories"][0]["verdict"] == "parked"


def test_a_tiered_story_agent_sees_the_tiers_model_and_arguments(make_repo):
    a = StoryDef("1-1-a", files=["src/a.py"], extra_front_matter={"tier": "deep"})
    b = StoryDef("1-2-b", files=["src/b.py"])
    repo = make_repo([a, b], script={s.key: {"dev": [{"write": {s.files[0]: s.key}}]} for s in (a, b)})
    import sys
    repo.write_policy(
        '[adapter]\n'
        f'command = [{json.dumps(sys.executable)}, {json.dumps(str(AGENT))}, '
        f'{json.dumps(str(repo.script_path))}, "--model={{model}}", "{{tier}}"]\n'
        '[adapter.tiers.deep]\nmodel = "big-model-1"\nargs = ["--think", "hard"]\ntimeout_s = 30\n')
    assert repo.cli("run").exit_code == 0
    calls = {c["key"]: c for c in repo.calls() if c["phase"] == "dev"}
    deep = calls[a.key]
    assert deep["argv"][1:] == ["--model=big-model-1", "deep", "--think", "hard"]
    assert deep["env"]["BMAD_LOOP_MODEL"] == "big-model-1"
    assert deep["env"]["BMAD_LOOP_TIER"] == "deep"
    plain = calls[b.key]
    assert plain["argv"][1:] == ["--model="]  # "{tier}" alone and empty: dropped
    assert plain["env"].get("BMAD_LOOP_TIER", "") == ""
    assert repo.story(a.key)["tier"] == "deep"


def test_continue_on_escalation_blocks_exactly_dependents_and_conflicts(make_repo):
    a = StoryDef("1-1-a", files=["src/a.py"])
    b = StoryDef("1-2-b", files=["src/b.py"], extra_front_matter={"depends_on": ["1-1-a"]})
    c = StoryDef("1-3-c", files=["src/a.py", "src/c.py"])
    d = StoryDef("1-4-d", files=["src/d.py"])
    script = {s.key: {"dev": [{"write": {s.files[-1]: s.key}}]} for s in (b, c, d)}
    script[a.key] = {"dev": [{"exit": 3, "say": "broken"}]}
    policy = MERGE_NONE.format(n=2, strategy="merge") + \
        '[limits]\nmax_dev_attempts = 1\n[parallel]\non_escalation = "continue"\n'
    repo = make_repo([a, b, c, d], script=script, policy=policy)
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    assert states(repo) == {a.key: "escalated", b.key: "blocked", c.key: "blocked",
                            d.key: "integrated"}
    assert "depends on 1-1-a" in repo.story(b.key)["reason"]
    assert "conflicts with 1-1-a" in repo.story(c.key)["reason"]
    status = repo.status()
    assert status["run"]["state"] == "paused" and "needs a human" in status["run"]["reason"]
    blocked = [e["story"] for e in repo.journal() if e["kind"] == "story.blocked"]
    assert sorted(blocked) == [b.key, c.key]


def test_two_parallel_agents_get_their_own_tmpdir_state_dir_and_port_block(make_repo, bar):
    a, b = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])
    script = {
        a.key: {"dev": [{"write": {"src/a.py": "A"}, "touch": [str(bar / "in-a")],
                         "wait_for": str(bar / "in-b")}]},
        b.key: {"dev": [{"write": {"src/b.py": "B"}, "touch": [str(bar / "in-b")],
                         "wait_for": str(bar / "in-a")}]},
    }
    policy = MERGE_NONE.format(n=2, strategy="merge") + '[resources]\nports = "9100-9159"\n' + \
        '[verify]\ncommands = ["env | grep BMAD_LOOP_PORT >> ../ports-seen.txt || true"]\n'
    repo = make_repo([a, b], script=script, policy=policy)
    assert repo.cli("run").exit_code == 0
    envs = {c["key"]: c["env"] for c in repo.calls()}
    assert envs[a.key]["TMPDIR"] != envs[b.key]["TMPDIR"]
    assert envs[a.key]["BMAD_LOOP_STATE_DIR"] != envs[b.key]["BMAD_LOOP_STATE_DIR"]
    for env in envs.values():
        assert not env["TMPDIR"].startswith(env["BMAD_LOOP_WORKTREE"])
    bases = sorted(int(e["BMAD_LOOP_PORT_BASE"]) for e in envs.values())
    assert bases == [9100, 9120]  # 60 ports / (2 workers + the lane) = 20 each
    assert {e["BMAD_LOOP_PORT_COUNT"] for e in envs.values()} == {"20"}


def test_a_port_range_too_small_for_every_block_is_bad_input(make_repo):
    repo = make_repo([StoryDef("1-1-a", files=["src/a.py"])],
                     policy=MERGE_NONE.format(n=4, strategy="merge") + '[resources]\nports = "9100-9103"\n')
    result = repo.cli("run")
    assert result.exit_code == 2
    assert "[resources] ports" in result.output
    assert repo.bmad_branches() == []


def test_reconcile_reports_each_verdict_and_exit_code(make_repo):
    a = StoryDef("1-1-a", files=["src/a.py"])
    b = StoryDef("1-2-b", files=["src/b.py"], extra_front_matter={"merge_class": "operator"})
    c = StoryDef("1-3-c", files=["src/c.py"])
    script = {s.key: {"dev": [{"write": {s.files[0]: s.key}}]} for s in (a, b)}
    script[c.key] = {"dev": [{"exit": 1}]}
    policy = MERGE_NONE.format(n=1, strategy="merge") + \
        '[limits]\nmax_dev_attempts = 1\n[parallel]\non_escalation = "continue"\n'
    repo = make_repo([a, b, c], script=script, policy=policy)
    enqueued = repo.cli("enqueue")
    run_id = enqueued.output.strip()
    before = repo.cli("reconcile", run_id, "--json")
    assert before.exit_code == 4
    assert {r["verdict"] for r in json.loads(before.output)["stories"]} == {"open"}
    assert repo.cli("resume", run_id).exit_code == 3
    after = repo.cli("reconcile", run_id, "--json")
    assert after.exit_code == 3, after.output
    verdicts = {r["key"]: r["verdict"] for r in json.loads(after.output)["stories"]}
    assert verdicts == {a.key: "integrated", b.key: "held", c.key: "parked"}
    assert repo.cli("approve", run_id, b.key).exit_code == 0
    assert repo.cli("resume", run_id).exit_code == 3  # c is still parked (fresh attempt fails)
    repo.write_script({c.key: {"dev": [{"write": {"src/c.py": "C"}}]}})
    assert repo.cli("resume", run_id).exit_code == 0
    final = repo.cli("reconcile", run_id)
    assert final.exit_code == 0, final.output


def test_a_story_marked_done_on_the_target_after_planning_is_skipped(make_repo, bar):
    a = StoryDef("1-1-a", files=["src/a.py"])
    b = StoryDef("1-2-b", files=["src/b.py"])
    # Someone else moved the target (it marks b done): accepted, so the lane goes on.
    repo = make_repo([a, b], script=barrier_script([a, b], bar),
                     policy=MERGE_NONE.format(n=1, strategy="merge").replace("[scm]\n", "[scm]\non_foreign_move = \"accept\"\n"))
    proc = repo.spawn("run")
    wait_until(lambda: a.key in inside(bar), what="a inside")
    # Someone ships b by hand on the target meanwhile.
    board = repo.board.read_text().replace("1-2-b: ready-for-dev", "1-2-b: done")
    repo.board.write_text(board)
    repo.commit_all("ship 1-2-b by hand")
    go(bar, a.key)
    assert proc.wait(timeout=60) == 0
    assert states(repo) == {a.key: "integrated", b.key: "skipped"}
    skipped = [e for e in repo.journal() if e["kind"] == "story.skipped"]
    assert skipped and skipped[0]["story"] == b.key and "stale premise" in skipped[0]["data"]["reason"]
    assert not [c for c in repo.calls() if c["key"] == b.key]
