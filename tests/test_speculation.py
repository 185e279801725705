"""Speculative candidates: the lane verifies a stack of candidates at once (issue 16).

Three independent stories at max_parallel 3. Their verify command (`verify_gate.py`) passes at
once in a story worktree; in a candidate worktree it touches `verifying-<story>-<attempt>` in
the barrier folder and then waits for the test to drop `pass-…` or `fail-…` beside it — or, with
a `rules` file there, decides alone (fail when every path a rule line names is in the tree).
So the test decides which candidate passes, which fails and when; no sleeps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from support import MERGE_NONE, StoryDef, query, wait_until, write_each

A = StoryDef("1-1-a", files=["src/a.py"])
B = StoryDef("1-2-b", files=["src/b.py"])
C = StoryDef("1-3-c", files=["src/c.py"])
SPRINT = [A, B, C]

GATE = '''\
import os, sys, time
bar = sys.argv[1]
cwd = os.getcwd()
if "/candidates/" not in cwd:
    sys.exit(0)
name = os.path.basename(cwd)


def log(what):
    with open(os.path.join(bar, "log"), "a") as f:
        f.write(f"{what} {name} {os.getpid()} {os.environ.get('BMAD_LOOP_PORT_BASE', '-')}\\n")


def leave(code):
    log("end")
    sys.exit(code)


log("start")
open(os.path.join(bar, "verifying-" + name), "a").close()
rules = os.path.join(bar, "rules")
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    if os.path.exists(rules):
        for line in open(rules).read().splitlines():
            paths = line.split()
            if paths and all(os.path.exists(p) for p in paths):
                leave(1)
        leave(0)
    if os.path.exists(os.path.join(bar, "pass-" + name)):
        leave(0)
    if os.path.exists(os.path.join(bar, "fail-" + name)):
        leave(1)
    time.sleep(0.02)
leave(3)
'''


def _policy(bar: Path, *, n: int = 3, extra: str = "", parallel: int | None = None) -> str:
    gate = bar / "verify_gate.py"
    gate.write_text(GATE)
    command = f"{sys.executable} {gate} {bar}"
    text = MERGE_NONE.format(n=n, strategy="merge") + f"[verify]\ncommands = [{json.dumps(command)}]\n"
    if parallel is not None:
        text += f"parallel = {parallel}\n"
    return text + extra


def _verifying(bar: Path) -> set[str]:
    return {p.name[len("verifying-"):] for p in bar.glob("verifying-*")}


def _gate_log(bar: Path) -> list[tuple[str, str, str, str]]:
    path = bar / "log"
    return [tuple(line.split()) for line in path.read_text().splitlines()] if path.exists() else []


def _decide(bar: Path, name: str, ok: bool = True) -> None:
    (bar / f"{'pass' if ok else 'fail'}-{name}").write_text("")


def _rules(bar: Path, *combinations: tuple[str, ...]) -> None:
    (bar / "rules").write_text("".join(" ".join(c) + "\n" for c in combinations))


def _views(status: dict) -> tuple[str, str]:
    """The live board (`status --watch`) and the TUI's lane panel, as plain text."""
    import datetime as dt

    from rich.console import Console

    from bmad_loop.operator.status_view import lane_text, render_board

    console = Console(width=160, record=True, color_system=None)
    console.print(render_board(status, None, dt.datetime.now(dt.timezone.utc)).renderable)
    return console.export_text(), lane_text(status).plain


THREE = {"1-1-a-1", "1-2-b-1", "1-3-c-1"}  # the first candidate of each story


def _spawn_until_three_verify(repo, bar: Path):
    """`run` as a process, returned once all three candidates verify at once."""
    proc = repo.spawn("run")
    wait_until(lambda: _verifying(bar) >= THREE, what="three candidates verifying at once")
    return proc


def _stack_three_then_pass_all(repo, bar: Path) -> None:
    """A run whose three candidates verify at once, then all pass; it must complete."""
    proc = _spawn_until_three_verify(repo, bar)
    try:
        _rules(bar)
        assert proc.wait(timeout=120) == 0, repo.spawned_logs()
    finally:
        repo.kill_spawned()


def _run_state(repo) -> str:
    return query(repo, "SELECT state FROM runs")[0][0]


def _target_trees(repo) -> list[list[str]]:
    """The files of each tree the target took, oldest first (story commits left out)."""
    return [t["files"] for t in repo.first_parent_trees()]


def test_three_candidates_verify_at_once_and_the_target_advances_in_order(make_repo, bar):
    repo = make_repo(SPRINT, script=write_each(SPRINT), policy=_policy(bar))
    proc = _spawn_until_three_verify(repo, bar)
    try:
        status = repo.status()
        assert {s["key"]: s["state"] for s in status["stories"]} == {
            A.key: "integrating", B.key: "integrating", C.key: "integrating"}
        cands = {c["story"]: c for c in status["candidates"]}
        assert [cands[k]["stack"] for k in (A.key, B.key, C.key)] == [1, 2, 3]
        assert cands[A.key]["on"] is None
        assert cands[B.key]["on"] == {"story": A.key, "attempt": 1}
        assert cands[C.key]["on"] == {"story": B.key, "attempt": 1}
        # Each is composed on the one under it.
        assert cands[B.key]["target_sha"] == cands[A.key]["candidate_sha"]
        assert cands[C.key]["target_sha"] == cands[B.key]["candidate_sha"]
        assert all(c["state"] == "verifying" for c in cands.values())
        board, lane = _views(status)
        assert "lane: 3 candidates, target advances bottom first" in board
        assert "2. 1-2-b #1 verifying  on 1-1-a #1" in board
        assert "3. 1-3-c #1 verifying  on 1-2-b #1" in board
        assert "in the lane now: candidate 3 of 3, verifying on 1-2-b #1" in board
        assert "now: 3 candidates" in lane and "1. 1-1-a #1 verifying on target" in lane
        # The top passes first: nothing lands before the bottom has passed.
        _decide(bar, "1-3-c-1")
        _decide(bar, "1-2-b-1")
        wait_until(lambda: len(repo.events("candidate.verified")) == 2, what="c and b verified")
        assert repo.events("target.advanced") == []
        _decide(bar, "1-1-a-1")
        assert proc.wait(timeout=120) == 0, repo.spawned_logs()
    finally:
        repo.kill_spawned()
    assert [e["story"] for e in repo.events("target.advanced")] == [A.key, B.key, C.key]
    advanced = repo.events("target.advanced")
    assert [e["data"]["old"] for e in advanced[1:]] == [e["data"]["new"] for e in advanced[:-1]]
    assert repo.git("rev-parse", "main") == cands[C.key]["candidate_sha"]
    assert repo.worktrees() == [str(repo.root)]


@pytest.mark.parametrize("mode", ["continue", "pause"])
def test_a_failed_middle_candidate_gives_up_the_one_above_it(make_repo, bar, mode, escalate_at_once):
    extra = f'[parallel]\non_escalation = "{mode}"\n'
    repo = make_repo(SPRINT, script=write_each(SPRINT), policy=_policy(bar, extra=extra))
    proc = _spawn_until_three_verify(repo, bar)
    try:
        _decide(bar, "1-2-b-1", ok=False)
        # C3 was composed on C2: given up at once, its story back to ready, a still verifying.
        wait_until(lambda: [e["story"] for e in repo.events("candidate.abandoned")] == [C.key],
                   what="c's candidate given up")
        now = {s["key"]: s["state"] for s in repo.status()["stories"]}
        assert now == {A.key: "integrating", B.key: "integrating", C.key: "ready"}
        assert repo.events("story.escalated") == []  # b's verdict counts once a has landed
        _decide(bar, "1-1-a-1")
        if mode == "continue":
            wait_until(lambda: "1-3-c-2" in _verifying(bar), what="c recomposed without b")
            c2 = next(c for c in repo.status()["candidates"] if c["story"] == C.key and c["attempt"] == 2)
            assert c2["stack"] == 1 and c2["on"] is None
            assert "src/b.py" not in repo.git("ls-tree", "-r", "--name-only", c2["candidate_sha"])
            _decide(bar, "1-3-c-2")
            assert proc.wait(timeout=120) == 3, repo.spawned_logs()  # paused: b needs a human
            assert [e["story"] for e in repo.events("target.advanced")] == [A.key, C.key]
            assert {s["key"]: s["state"] for s in repo.status()["stories"]} == {
                A.key: "integrated", B.key: "escalated", C.key: "integrated"}
            return
        wait_until(lambda: _run_state(repo) == "paused", what="the run to pause")
        assert proc.wait(timeout=60) == 3, repo.spawned_logs()  # paused
        now = {s["key"]: s["state"] for s in repo.status()["stories"]}
        assert now == {A.key: "integrated", B.key: "escalated", C.key: "ready"}
        cands = {(c["story"], c["attempt"]): c for c in repo.status()["candidates"]}
        assert cands[(C.key, 1)]["state"] == "abandoned"
        evidence = json.loads(Path(cands[(C.key, 1)]["evidence"]).read_text())
        assert (evidence["kind"], evidence["was"], evidence["stack"]) == ("abandoned", "verifying", 3)
        assert evidence["target_sha"] == cands[(B.key, 1)]["candidate_sha"]
        assert cands[(B.key, 1)]["state"] == "verify-failed"
        # Resume: b gets a fresh attempt; this time its candidate passes, then c lands on it.
        _rules(bar)  # no failing combination: every candidate passes from now on
        resumed = repo.spawn("resume")
        assert resumed.wait(timeout=120) == 0, repo.spawned_logs()
    finally:
        repo.kill_spawned()
    assert [e["story"] for e in repo.events("target.advanced")] == [A.key, B.key, C.key]
    assert _run_state(repo) == "completed"


def _history(make_repo, bar: Path, name: str, parallel: int, rules) -> tuple[list, dict]:
    bar = bar / name
    bar.mkdir()
    _rules(bar, *rules)
    extra = '[parallel]\non_escalation = "continue"\n'
    repo = make_repo(SPRINT, script=write_each(SPRINT), name=name,
                     policy=_policy(bar, extra=extra, parallel=parallel))
    result = repo.cli("run")
    assert result.exit_code in (0, 3), result.output
    return _target_trees(repo), {s["key"]: s["state"] for s in repo.status()["stories"]}


@pytest.mark.parametrize("rules", [
    [],                                  # all pass
    [("src/b.py",)],                     # b fails on its own
    [("src/b.py", "src/c.py")],          # b and c each pass alone, fail together: c is caught
    [("src/a.py",), ("src/c.py",)],      # the bottom fails, and the top
], ids=["all-pass", "b-fails", "b-with-c-fails", "a-and-c-fail"])
def test_same_target_history_as_the_one_at_a_time_lane(make_repo, bar, rules):
    one_at_a_time = _history(make_repo, bar, "one", 1, rules)
    stacked = _history(make_repo, bar, "stacked", 3, rules)
    assert stacked == one_at_a_time
    if rules == [("src/b.py", "src/c.py")]:
        assert stacked[1] == {A.key: "integrated", B.key: "integrated", C.key: "escalated"}


FOUR = SPRINT + [StoryDef("1-4-d", files=["src/d.py"])]


def _random_rules(seed: int) -> list[tuple[str, ...]]:
    """A seeded mix: some stories fail alone, some pairs fail only together."""
    import random

    rng = random.Random(seed)
    files = [s.files[0] for s in FOUR]
    rules = [(f,) for f in files if rng.random() < 0.25]
    rules += [tuple(rng.sample(files, 2)) for _ in range(rng.randint(0, 2))]
    return rules


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_same_history_for_random_mixes_of_passes_and_failures(make_repo, bar, seed):
    rules = _random_rules(seed)

    def history(name: str, parallel: int):
        folder = bar / name
        folder.mkdir()
        _rules(folder, *rules)
        extra = '[parallel]\non_escalation = "continue"\n'
        repo = make_repo(FOUR, script=write_each(FOUR), name=name,
                         policy=_policy(folder, n=4, extra=extra, parallel=parallel))
        result = repo.cli("run")
        assert result.exit_code in (0, 3), result.output
        return _target_trees(repo), {s["key"]: s["state"] for s in repo.status()["stories"]}

    assert history("stacked", 4) == history("one", 1), rules


@pytest.mark.usefixtures("unboxed")  # its pids and orphans: unboxed
def test_kill_9_during_stacked_verification_resumes_with_the_same_history(make_repo, bar):
    repo = make_repo(SPRINT, script=write_each(SPRINT), policy=_policy(bar))
    proc = _spawn_until_three_verify(repo, bar)
    try:
        _decide(bar, "1-2-b-1")
        wait_until(lambda: len(repo.events("candidate.verified")) == 1, what="b verified")
        repo.kill_spawned()  # SIGKILL to the run's process group; verify commands have their own
        assert proc.returncode == -9
        orphans = {pid for what, _, pid, _ in _gate_log(bar) if what == "start"} - {
            pid for what, _, pid, _ in _gate_log(bar) if what == "end"}
        assert len(orphans) == 2  # a's and c's verify commands, still waiting
        rows = dict(query(repo, "SELECT s.key, c.state FROM candidates c "
                                "JOIN stories s ON s.id = c.story_id"))
        assert rows == {A.key: "verifying", B.key: "verified", C.key: "verifying"}
        resumed = repo.spawn("resume")
        wait_until(lambda: len([x for x in _gate_log(bar) if x[0] == "start"]) == 5,
                   what="a's and c's candidates verified again")
        _rules(bar)  # everything passes from now on
        assert resumed.wait(timeout=120) == 0, repo.spawned_logs()
    finally:
        repo.kill_spawned()
    assert _run_state(repo) == "completed"
    # The verifications the kill cut short ran again; b's verdict was kept.
    again = sorted(e["story"] for e in repo.events("candidate.reverifying"))
    assert again == [A.key, C.key]
    assert [e["story"] for e in repo.events("target.advanced")] == [A.key, B.key, C.key]
    assert len(query(repo, "SELECT id FROM candidates")) == 3  # nothing composed twice
    # The dead lane's verify commands were ended before their candidates were verified again.
    assert not orphans & {pid for what, _, pid, _ in _gate_log(bar) if what == "end"}
    uninterrupted = bar / "clean"
    uninterrupted.mkdir()
    _rules(uninterrupted)
    other = make_repo(SPRINT, script=write_each(SPRINT), name="clean",
                      policy=_policy(uninterrupted))
    assert other.cli("run").exit_code == 0
    assert _target_trees(repo) == _target_trees(other)


def test_stop_now_ends_the_stacks_verifications_and_resume_composes_them_again(make_repo, bar):
    repo = make_repo(SPRINT, script=write_each(SPRINT), policy=_policy(bar))
    proc = _spawn_until_three_verify(repo, bar)
    try:
        run_id = query(repo, "SELECT id FROM runs")[0][0]
        assert repo.cli("stop", run_id, "--now").exit_code == 0
        wait_until(lambda: _run_state(repo) == "stopped", what="the run to stop")
        proc.wait(timeout=60)
        # Every verify command was ended by the stop, none finished on its own.
        assert [x for x in _gate_log(bar) if x[0] == "end"] == []
        assert {s["key"]: s["state"] for s in repo.status()["stories"]} == {
            A.key: "ready", B.key: "ready", C.key: "ready"}
        assert sorted(c["state"] for c in repo.status()["candidates"]) == ["abandoned"] * 3
        _rules(bar)
        assert repo.cli("resume", run_id).exit_code == 0
    finally:
        repo.kill_spawned()
    assert [e["story"] for e in repo.events("target.advanced")] == [A.key, B.key, C.key]
    assert [c["attempt"] for c in repo.status()["candidates"] if c["state"] == "advanced"] == [2, 2, 2]


def test_nothing_is_stacked_on_a_story_waiting_for_sign_off(make_repo, bar):
    b = StoryDef(B.key, files=B.files, extra_front_matter={"merge_class": "operator"})
    sprint = [A, b, C]
    repo = make_repo(sprint, script=write_each(sprint), policy=_policy(bar))
    _rules(bar)  # every candidate passes at once
    result = repo.cli("run")
    assert result.exit_code == 3, result.output  # paused: b waits for its sign-off
    now = {s["key"]: s["state"] for s in repo.status()["stories"]}
    assert now == {A.key: "integrated", B.key: "held", C.key: "ready"}
    assert [c["story"] for c in repo.status()["candidates"]] == [A.key, B.key]  # none for c yet
    run_id = query(repo, "SELECT id FROM runs")[0][0]
    assert repo.cli("approve", run_id, B.key).exit_code == 0
    assert repo.cli("resume", run_id).exit_code == 0
    assert [e["story"] for e in repo.events("target.advanced")] == [A.key, B.key, C.key]
    c = next(c for c in repo.status()["candidates"] if c["story"] == C.key)
    b_cand = next(x for x in repo.status()["candidates"] if x["story"] == B.key)
    assert c["target_sha"] == b_cand["candidate_sha"]


def test_candidates_verified_at_once_share_out_the_lanes_port_block(make_repo, bar):
    # 80 ports / (3 workers + the lane) = 20 each; the lane's 20 (9160-9179) split 3 ways.
    ports = '[resources]\nports = "9100-9179"\n'
    repo = make_repo(SPRINT, script=write_each(SPRINT), policy=_policy(bar, extra=ports))
    _stack_three_then_pass_all(repo, bar)
    bases = sorted(int(base) for what, _, _, base in _gate_log(bar) if what == "start")
    assert bases == [9160, 9166, 9172]


def test_a_port_range_too_small_for_the_stack_is_bad_input(make_repo, bar):
    repo = make_repo(SPRINT, script=write_each(SPRINT),
                     policy=_policy(bar, extra='[resources]\nports = "9100-9107"\n'))
    result = repo.cli("run")
    assert result.exit_code == 2
    assert "[verify] parallel" in result.output and "[resources] ports" in result.output
    assert repo.bmad_branches() == []
    assert not (repo.root / ".bmad-loop" / "state.db").exists()


def test_a_stack_on_a_remote_target_pushes_each_candidate_in_order(make_repo, bar):
    from support import make_remote_project, remote_trees

    repo, bare = make_remote_project(make_repo, SPRINT, write_each(SPRINT), _policy(bar))
    _stack_three_then_pass_all(repo, bar)
    cands = {c["story"]: c for c in repo.status()["candidates"]}
    assert [cands[k]["stack"] for k in (A.key, B.key, C.key)] == [1, 2, 3]
    # The remote's target took C1, C2, C3 in turn, each a fast-forward of the one before.
    shas = git_rev_list(bare)
    assert shas[-3:] == [cands[k]["candidate_sha"] for k in (A.key, B.key, C.key)]
    assert len(remote_trees(bare)) == len(shas)


def git_rev_list(bare: Path) -> list[str]:
    from support import git

    return git(bare, "rev-list", "--first-parent", "--reverse", "main").split()


def test_at_max_parallel_1_each_story_still_starts_on_its_predecessors_result(make_repo, bar):
    """`[verify] parallel` does not turn the sequential loop into a stack: the lane verifies
    before it dispatches, so each story's base is the target with the one before it landed."""
    _rules(bar)
    repo = make_repo(SPRINT, script=write_each(SPRINT), policy=_policy(bar, n=1, parallel=3))
    assert repo.cli("run").exit_code == 0
    advanced = {e["story"]: e["data"]["new"] for e in repo.events("target.advanced")}
    assert repo.story(B.key)["base_sha"] == advanced[A.key]
    assert repo.story(C.key)["base_sha"] == advanced[B.key]
    assert {c["stack"] for c in repo.status()["candidates"]} == {1}


def test_a_target_moved_under_the_stack_pauses_and_resume_composes_the_stack_on_it(make_repo, bar):
    repo = make_repo(SPRINT, script=write_each(SPRINT), policy=_policy(bar))
    proc = _spawn_until_three_verify(repo, bar)
    try:
        (repo.root / "HOTFIX.md").write_text("a person's hotfix\n")
        repo.git("add", "HOTFIX.md")
        repo.git("-c", "user.name=Human", "-c", "user.email=h@example.com",
                 "commit", "-q", "--no-verify", "-m", "hotfix")
        hotfix = repo.git("rev-parse", "HEAD")
        _rules(bar)
        wait_until(lambda: _run_state(repo) == "paused", what="the run to pause on the move")
        assert proc.wait(timeout=60) == 3, repo.spawned_logs()
        assert "target moved by someone else" in repo.status()["run"]["reason"]
        assert repo.git("rev-parse", "main") == hotfix  # never forced
        assert repo.events("target.advanced") == []
        run_id = query(repo, "SELECT id FROM runs")[0][0]
        assert repo.cli("resume", run_id).exit_code == 0
    finally:
        repo.kill_spawned()
    assert [e["story"] for e in repo.events("target.advanced")] == [A.key, B.key, C.key]
    assert repo.git("rev-list", "--first-parent", "-n", "4", "main").split()[-1] == hotfix
    assert "HOTFIX.md" in repo.git("ls-tree", "--name-only", "main")
