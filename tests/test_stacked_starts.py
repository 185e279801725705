"""Stacked starts: a story blocked only by finished, unintegrated stories starts on top of them.

Sprint of four (max_parallel 3): a, b and c touch their own files; d touches its own file and
appends to c's, so d conflicts with c. With b held in dev by a barrier, c finishes (`ready`,
waiting behind b for integration) and d starts on a stacked base — the target with c's own
commits on top — instead of waiting for c's integration. File barriers decide who is inside;
no sleeps.
"""

from __future__ import annotations

import os

from support import MERGE_NONE, StoryDef, barrier_script, go, inside, states, wait_until

A = StoryDef("1-1-a", files=["src/a.py"])
B = StoryDef("1-2-b", files=["src/b.py"])
C = StoryDef("1-3-c", files=["src/c.py"])
D = StoryDef("1-4-d", files=["src/d.py", "src/c.py"])
SPRINT = [A, B, C, D]
POLICY = MERGE_NONE.format(n=3, strategy="merge") + "[leases]\nttl_s = 3\n"
# Fails only in a candidate worktree, and only on c's "bad" content: c passes its own verify,
# then fails to integrate.
CANDIDATE_REJECTS_BAD_C = ("[verify]\ncommands = ['case \"$PWD\" in */candidates/*) "
                           "! grep -q bad src/c.py;; esac']\n")


def _script(bar, c_text: str = "NAME = '1-3-c'\n", append: bool = True) -> dict:
    script = barrier_script(SPRINT, bar)
    script[C.key]["dev"][0]["write"] = {"src/c.py": c_text}
    script[D.key]["dev"][0]["write"] = {"src/d.py": "D = 4\n"}
    if append:  # d builds on c's content
        script[D.key]["dev"][0]["append"] = {"src/c.py": "D = 'on c'\n"}
    else:  # the same result, written whole: a session repeated after a kill leaves it so
        script[D.key]["dev"][0]["write"]["src/c.py"] = "NAME = '1-3-c'\nD = 'on c'\n"
    return script


def _stack_d_on_c(repo, bar) -> None:
    """a integrates; c finishes and waits behind b (still in dev); d starts stacked on c."""
    wait_until(lambda: {A.key, B.key, C.key} <= set(inside(bar)), what="a, b, c inside")
    go(bar, A.key)
    wait_until(lambda: states(repo)[A.key] == "integrated", what="a integrated")
    go(bar, C.key)
    wait_until(lambda: D.key in inside(bar), what="d inside dev")


def test_story_4_starts_stacked_on_ready_story_3_while_story_2_is_in_dev(make_repo, bar):
    repo = make_repo(SPRINT, script=_script(bar), policy=POLICY)
    proc = repo.spawn("run")
    _stack_d_on_c(repo, bar)

    now = states(repo)
    assert (now[B.key], now[C.key], now[D.key]) == ("working", "ready", "working")
    d = repo.story(D.key)
    assert d["stacked_on"] == [C.key]
    target = repo.git("rev-parse", "main")
    assert d["base_sha"] != target
    # The stacked base is the target with c's own commits on top: c's file as c left it.
    assert repo.git("rev-parse", f"{d['base_sha']}^") == target
    assert repo.git("show", f"{d['base_sha']}:src/c.py") == "NAME = '1-3-c'"
    assert repo.git("diff", "--name-only", target, d["base_sha"]).split() == ["src/c.py"]
    dev_call = [call for call in repo.calls() if call["key"] == D.key and call["phase"] == "dev"][-1]
    assert dev_call["env"]["BMAD_LOOP_BASE_SHA"] == d["base_sha"]
    queued = [e for e in repo.journal() if e["kind"] == "story.queued" and e["story"] == D.key]
    assert queued[-1]["data"]["stacked_on"] == [C.key]

    go(bar, B.key)
    go(bar, D.key)
    assert proc.wait(timeout=120) == 0, repo.spawned_logs()
    assert set(states(repo).values()) == {"integrated"}
    # Integration order is plan order, and d landed only its own change on top of c's.
    advanced = [e["story"] for e in repo.journal() if e["kind"] == "target.advanced"]
    assert advanced == [A.key, B.key, C.key, D.key]
    assert repo.git("show", "main:src/c.py") == "NAME = '1-3-c'\nD = 'on c'"
    assert repo.git("show", "main:src/d.py") == "D = 4"
    assert repo.story(D.key)["stacked_on"] == [C.key]


def test_stacked_work_is_kept_and_redone_when_the_story_under_it_escalates(make_repo, bar):
    repo = make_repo(SPRINT, script=_script(bar, c_text="bad\n"),
                     policy=POLICY + CANDIDATE_REJECTS_BAD_C)
    proc = repo.spawn("run")
    _stack_d_on_c(repo, bar)
    assert repo.story(D.key)["stacked_on"] == [C.key]
    go(bar, B.key)
    wait_until(lambda: states(repo)[C.key] == "escalated", what="c escalated in integration")
    go(bar, D.key)
    assert proc.wait(timeout=120) == 3, repo.spawned_logs()

    restacked = [e for e in repo.journal() if e["kind"] == "story.restacked"]
    assert [e["story"] for e in restacked] == [D.key]
    data = restacked[0]["data"]
    assert data["stacked_on"] == [C.key] and data["was"] == "ready"
    assert "1-3-c is escalated" in data["reason"]
    kept = data["kept"]
    assert kept.startswith("refs/bmad-loop/") and "/restacked/1-4-d/" in kept
    # Nothing is dropped: d's work is under the kept ref, on top of c's bad commit.
    assert repo.git("show", f"{kept}:src/d.py") == "D = 4"
    assert repo.git("show", f"{kept}:src/c.py") == "bad\nD = 'on c'"
    d = repo.story(D.key)
    assert (d["state"], d["stacked_on"], d["base_sha"], d["branch"]) == ("pending", [], None, None)
    assert not any(b.endswith("/1-4-d") for b in repo.bmad_branches())
    assert "src/d.py" not in repo.git("ls-tree", "-r", "--name-only", "main")
    assert states(repo)[B.key] == "integrated"


def test_kill_9_while_a_stacked_story_is_in_dev_resumes_with_the_same_history(make_repo, bar, tmp_path):
    repo = make_repo(SPRINT, script=_script(bar, append=False), policy=POLICY, name="killed")
    proc = repo.spawn("run")
    _stack_d_on_c(repo, bar)
    base = repo.story(D.key)["base_sha"]
    run_id = repo.status()["run"]["id"]
    os.killpg(proc.pid, 9)
    proc.wait(timeout=30)
    for story in SPRINT:
        go(bar, story.key)
    resumed = repo.spawn("resume", run_id, log_name="resume")
    assert resumed.wait(timeout=120) == 0, repo.spawned_logs()
    assert set(states(repo).values()) == {"integrated"}
    d = repo.story(D.key)
    assert (d["base_sha"], d["stacked_on"]) == (base, [C.key])  # resumed on the same base

    calm_bar = tmp_path / "calm-bar"
    calm_bar.mkdir()
    for story in SPRINT:
        go(calm_bar, story.key)
    calm = make_repo(SPRINT, script=_script(calm_bar, append=False), policy=POLICY, name="calm")
    assert calm.cli("run").exit_code == 0
    assert [c["tree"] for c in repo.first_parent_trees()] == [c["tree"] for c in calm.first_parent_trees()]
    advanced = [e["story"] for e in repo.journal() if e["kind"] == "target.advanced"]
    assert advanced == [s.key for s in SPRINT]


# Adjacent pairs: 1-2 share a file, 3-4 another, 5-6 a capacity-1 resource, 7-8 are free.
ADJACENT = [
    StoryDef("1-1-p1", files=["src/one.py", "src/pair12.py"]),
    StoryDef("1-2-p2", files=["src/two.py", "src/pair12.py"]),
    StoryDef("1-3-p3", files=["src/three.py", "src/pair34.py"]),
    StoryDef("1-4-p4", files=["src/four.py", "src/pair34.py"]),
    StoryDef("1-5-p5", files=["src/five.py"], resources=["db"]),
    StoryDef("1-6-p6", files=["src/six.py"], resources=["db"]),
    StoryDef("1-7-p7", files=["src/seven.py"]),
    StoryDef("1-8-p8", files=["src/eight.py"]),
]
ADJACENT_SCRIPT = {s.key: {"dev": [{"write": {s.files[0]: f"NAME = '{s.key}'\n"},
                                    **({"append": {s.files[1]: f"{s.key}\n"}} if len(s.files) > 1 else {})}]}
                   for s in ADJACENT}


def test_adjacent_pairs_give_the_same_target_trees_at_n_1_and_n_4(make_repo):
    trees = {}
    for n in (1, 4):
        repo = make_repo(ADJACENT, script=ADJACENT_SCRIPT, name=f"n{n}",
                         policy=MERGE_NONE.format(n=n, strategy="merge") + '[resources]\ndb = 1\n')
        result = repo.cli("run")
        assert result.exit_code == 0, result.output
        trees[n] = [c["tree"] for c in repo.first_parent_trees()]
        if n == 1:
            assert not [e for e in repo.journal() if e["kind"] == "story.queued"
                        and e["data"].get("stacked_on")]  # no stacking at N = 1
    assert trees[1] == trees[4]
    assert len(trees[1]) == len(ADJACENT) + 1
