"""Admission with the run's conflict index gives the decisions of the pairwise computation.

- `pairwise_admit` below is the reference: every pending story compared with every earlier one
  through the footprint test, on every pass (what admission did before the index). On seeded
  random sprints (epics, gates, states, dependencies, resources, creations, exclusive and glob
  footprints, a target tree) `admit` with a fresh index, and with one index carried along a
  random run (states move, created stories get their footprints, the tree gains directories),
  answers exactly the same: dispatch, every waiting reason, gate and approvals.
- The index tests each pair once, and only re-tests what a change can affect.
- Through the CLI: a footprint that a create phase writes mid-run is taken into account by the
  lane's long-lived index (a later story that conflicts with it waits for its integration).
"""

from __future__ import annotations

import random

import pytest

from bmad_loop.engine.lane.admission import Admission, ConflictIndex, StoryView, admit
from bmad_loop.bmad.footprint import Footprint, footprints_conflict
from bmad_loop.states import STORY_DONE, STORY_IN_FLIGHT, StoryState
from support import StoryDef, create_step, drop_story_files, go, inside, wait_until

HOLDS = STORY_IN_FLIGHT | {StoryState.READY, StoryState.INTEGRATING, StoryState.HELD}


# ------------------------------------------------------------------ the pairwise reference
def pairwise_admit(stories, *, max_parallel, capacity, gates_mode, gates_passed, directories):
    def conflict(a, b):
        return footprints_conflict(a, b, directories)

    ordered = sorted(stories, key=lambda s: s.seq)
    by_key = {s.key: s for s in ordered}
    out = Admission()
    in_flight = sum(1 for s in ordered if s.state in STORY_IN_FLIGHT)
    used: dict[str, int] = {}
    for s in ordered:
        if s.state in HOLDS and not s.to_create:
            for name in s.footprint.resources:
                used[name] = used.get(name, 0) + 1
    gates_passed = {str(g) for g in gates_passed}
    first_epic = next((s.epic for s in ordered if s.epic), None)
    dispatched: set[str] = set()
    for index, story in enumerate(ordered):
        if story.state != StoryState.PENDING:
            continue
        earlier = [(s, "queued" if s.key in dispatched else s.state) for s in ordered[:index]]
        reason = epic_barrier(story, earlier, gates_mode, gates_passed, first_epic)
        if reason == "gate":
            out.gate = story.epic
            out.waiting[story.key] = f"gate before epic {story.epic}"
            break
        if reason is None and story.to_create:
            reason = f"all {max_parallel} worker slot(s) busy" if in_flight >= max_parallel else None
            if reason is None:
                out.dispatch.append(story.key)
                dispatched.add(story.key)
                in_flight += 1
            else:
                out.waiting[story.key] = reason
            continue
        if reason is None:
            for other, state in earlier:
                if state in STORY_DONE:
                    continue
                if other.to_create:
                    reason = f"waits for {other.key} to be created (its footprint is not known yet)"
                    break
                why = conflict(story.footprint, other.footprint)
                if why:
                    reason = f"conflicts with {other.key}: {why}"
                    break
        if reason is None:
            for dep in story.depends_on:
                other = by_key.get(dep)
                if other is not None and other.state not in ("integrated", "skipped"):
                    reason = f"depends on {dep} ({other.state})"
                    break
        if reason is None and gates_mode == "per-story-spec-approval" and not story.approved:
            out.approvals.append(story.key)
            reason = "awaiting spec approval (bmad-loop approve)"
        if reason is None:
            for name in story.footprint.resources:
                if used.get(name, 0) >= capacity(name):
                    reason = f"resource {name} at capacity ({capacity(name)})"
                    break
        if reason is None and in_flight >= max_parallel:
            reason = f"all {max_parallel} worker slot(s) busy"
        if reason:
            out.waiting[story.key] = reason
            continue
        out.dispatch.append(story.key)
        dispatched.add(story.key)
        in_flight += 1
        for name in story.footprint.resources:
            used[name] = used.get(name, 0) + 1
    return out


def epic_barrier(story, earlier, gates_mode, gates_passed, first_epic):
    if not story.epic:
        return None
    others = [(s, state) for s, state in earlier if s.epic and s.epic != story.epic]
    if not others:
        return None
    if gates_mode == "per-epic":
        open_ = [s for s, state in others if state not in ("integrated", "skipped")]
        if open_:
            return f"epic {story.epic} waits for epic {open_[0].epic} ({open_[0].key})"
        if story.epic != first_epic and story.epic not in gates_passed:
            return "gate"
        return None
    pending = [s for s, state in others if state == "pending"]
    if pending:
        return f"epic {story.epic} waits until epic {pending[0].epic} is dispatched ({pending[0].key})"
    return None


# ------------------------------------------------------------------ random sprints
PATTERNS = ["src/a.py", "src/b.py", "src", "src/", "src/**", "src/*.py", "docs/index.md", "docs/",
            "CHANGELOG.md", "flagA", "app", "src/app/models.py", "tests/test_a.py", "tests/",
            "newdir", "newdir/x.py", "**/*.md", "lib/c.py", "src/app/*", "/README.md", "docs/*.md",
            "/*.py", "src/a*/x.py", "/src", "src/app/", "tests/test_*.py"]
TREES = [None, frozenset({"src", "src/app", "docs", "tests"}),
         frozenset({"src", "src/app", "docs", "tests", "newdir", "lib"})]
STATES = ["pending"] * 6 + ["queued", "working", "ready", "integrating", "held", "integrated",
                            "integrated", "skipped", "failed", "escalated", "blocked"]
CAPACITY = {"db": 1, "gpu": 2}


def random_footprint(rng: random.Random) -> Footprint:
    if rng.random() < 0.12:
        return Footprint(reason=rng.choice(["missing", "empty", "invalid: bad"]))
    files = tuple(rng.sample(PATTERNS, rng.randint(0, 2)))
    shared = tuple(rng.sample(PATTERNS, rng.randint(0, 1)))
    resources = tuple(rng.sample(["db", "gpu", "ports"], rng.randint(0, 1)))
    if not (files or shared or resources):
        return Footprint(reason="empty")
    return Footprint(files=files, shared=shared, resources=resources)


def random_sprint(rng: random.Random, k: int) -> list[StoryView]:
    epics = sorted(rng.sample(["1", "2", "3", "r"], rng.randint(1, min(3, k))), key=["1", "2", "3", "r"].index)
    cut = sorted(rng.sample(range(1, k), len(epics) - 1)) if len(epics) > 1 else []
    first_epic_done = rng.random() < 0.5
    stories = []
    for i in range(k):
        epic = epics[sum(1 for c in cut if i >= c)]
        if i == 0 and rng.random() < 0.3:
            epic = ""  # an extra key above every epic line
        key = f"{epic or 'x'}-{i + 1}-s{i}"
        state = rng.choice(STATES)
        if epic and epic == epics[0] and len(epics) > 1 and first_epic_done:
            state = rng.choice(["integrated", "skipped"])  # so that gates come into play
        to_create = state in ("pending", "queued", "working") and rng.random() < 0.15
        fp = Footprint(reason="missing") if to_create and rng.random() < 0.8 else random_footprint(rng)
        deps = tuple(s.key for s in rng.sample(stories, min(len(stories), rng.randint(0, 1)))
                     if rng.random() < 0.4)
        stories.append(StoryView(key=key, seq=i + 1, epic=epic, state=state, footprint=fp,
                                 depends_on=deps, approved=rng.random() < 0.8, to_create=to_create))
    return stories


def decide(stories, rng_args, index=None, directories=None):
    kwargs = dict(max_parallel=rng_args["n"], capacity=lambda name: CAPACITY.get(name, 1),
                  gates_mode=rng_args["mode"], gates_passed=rng_args["passed"])
    if index is None:
        return admit(stories, conflict=lambda a, b: footprints_conflict(a, b, directories), **kwargs)
    return admit(stories, index=index, directories=lambda: directories, **kwargs)


def reference(stories, rng_args, directories):
    return pairwise_admit(stories, max_parallel=rng_args["n"],
                          capacity=lambda name: CAPACITY.get(name, 1), gates_mode=rng_args["mode"],
                          gates_passed=rng_args["passed"], directories=directories)


def args_for(rng: random.Random) -> dict:
    return {"n": rng.randint(1, 4), "mode": rng.choice(["none", "per-epic", "per-story-spec-approval"]),
            "passed": rng.sample(["2", "3", "r"], rng.randint(0, 2))}


@pytest.mark.parametrize("seed", range(40))
def test_a_fresh_index_decides_as_the_pairwise_computation_on_a_random_sprint(seed):
    rng = random.Random(seed)
    stories = random_sprint(rng, rng.randint(1, 30))
    rng_args = args_for(rng)
    tree = rng.choice(TREES)
    assert decide(stories, rng_args, directories=tree) == reference(stories, rng_args, tree)
    assert decide(stories, rng_args, ConflictIndex(), tree) == reference(stories, rng_args, tree)


def evolve(rng: random.Random, stories: list[StoryView]) -> list[StoryView]:
    """One step of a run: some states move, a created story gets its footprint."""
    out = []
    for s in stories:
        if rng.random() < 0.2:
            s = StoryView(**{**s.__dict__, "state": rng.choice(STATES)})
        if s.to_create and rng.random() < 0.4:
            s = StoryView(**{**s.__dict__, "to_create": False, "footprint": random_footprint(rng)})
        elif not s.to_create and rng.random() < 0.05:  # e.g. a policy override re-read
            s = StoryView(**{**s.__dict__, "footprint": random_footprint(rng)})
        out.append(s)
    return out


@pytest.mark.parametrize("seed", range(25))
def test_one_index_carried_along_a_random_run_keeps_deciding_as_the_pairwise_computation(seed):
    rng = random.Random(1000 + seed)
    stories = random_sprint(rng, rng.randint(5, 30))
    rng_args = args_for(rng)
    index = ConflictIndex()
    tree = TREES[0]
    for step in range(12):
        if rng.random() < 0.25:
            tree = rng.choice(TREES)  # the target advanced, maybe with new directories
        assert decide(stories, rng_args, index, tree) == reference(stories, rng_args, tree), step
        stories = evolve(rng, stories)


# ------------------------------------------------------------------ what the index saves
def view(key: str, seq: int, files=(), state="pending", reason=None) -> StoryView:
    return StoryView(key=key, seq=seq, epic="1", state=state,
                     footprint=Footprint(files=tuple(files), reason=reason))


def test_each_pair_is_tested_once_per_run_and_a_changed_footprint_only_against_the_others():
    # Every pattern under work/ with a wildcard: every pair has to be asked.
    stories = [view(f"1-{i}-s", i, [f"work/{i}-*.txt"]) for i in range(1, 21)]
    index = ConflictIndex()
    for _ in range(5):  # five passes, nothing changed after the first
        decision = admit(stories, max_parallel=4, capacity=lambda n: 1, gates_mode="none", index=index)
    assert decision.dispatch == [s.key for s in stories[:4]]
    assert index.tests == 20 * 19 // 2
    # Story 7's create phase wrote its file: its footprint now meets story 3's.
    stories[6] = view("1-7-s", 7, ["work/3-*.txt"])
    stories = [view(s.key, s.seq, s.footprint.files, "working" if s.seq <= 4 else "pending")
               for s in stories]
    decision = admit(stories, max_parallel=8, capacity=lambda n: 1, gates_mode="none", index=index)
    assert index.tests == 20 * 19 // 2 + 19
    assert "1-7-s" not in decision.dispatch
    assert decision.waiting["1-7-s"] == "conflicts with 1-3-s: work/3-*.txt overlaps work/3-*.txt"


def test_stories_on_distinct_literal_paths_are_never_tested_against_each_other():
    stories = [view(f"1-{i}-s", i, [f"work/{i}.txt", f"src/m{i}/"]) for i in range(1, 301)]
    stories.append(view("1-301-any", 301, ["CHANGELOG.md"]))  # matches at any depth
    stories.append(view("1-302-src", 302, ["src/*"]))  # above every src/m<i>/
    index = ConflictIndex()
    decision = admit(stories, max_parallel=302, capacity=lambda n: 1, gates_mode="none", index=index)
    assert index.tests == 301 + 300  # only the last two, each against every other
    assert decision.dispatch == [s.key for s in stories[:300]]
    assert decision.waiting == {  # without a tree, work/1.txt may be a folder
        "1-301-any": "conflicts with 1-1-s: CHANGELOG.md overlaps work/1.txt",
        "1-302-src": "conflicts with 1-1-s: src/* overlaps src/m1/"}


def test_a_new_tree_re_tests_only_the_pairs_that_can_meet_under_some_tree():
    stories = [view("1-1-a", 1, ["newdir"]), view("1-2-b", 2, ["newdir/x.py"]),
               view("1-3-c", 3, ["lib/c.py"]), view("1-4-d", 4, ["docs/d.md"])]
    index = ConflictIndex()

    def run(tree):
        return admit(stories, max_parallel=4, capacity=lambda n: 1, gates_mode="none",
                     index=index, directories=lambda: tree)

    assert run(frozenset({"src"})).dispatch == ["1-1-a", "1-2-b", "1-3-c", "1-4-d"]  # newdir: a file
    first = index.tests
    decision = run(frozenset({"src", "newdir"}))  # a story made newdir a directory
    assert decision.dispatch == ["1-1-a", "1-3-c", "1-4-d"]
    assert decision.waiting == {"1-2-b": "conflicts with 1-1-a: newdir/x.py overlaps newdir"}
    # Re-tested: the three pairs with the bare name `newdir` (without a tree, `lib/c.py` and
    # `docs/d.md` might be directories holding a `newdir`); never c against d, b against c, ...
    assert index.tests == first + 3


def test_no_tree_is_listed_when_no_pair_depends_on_it():
    stories = [view("1-1-a", 1, ["src/a.py"]), view("1-2-b", 2, reason="missing"),
               view("1-3-c", 3, ["src/c.py"])]
    listed = []
    index = ConflictIndex()
    for _ in range(3):
        admit(stories, max_parallel=4, capacity=lambda n: 1, gates_mode="none", index=index,
              directories=lambda: listed.append(1) or frozenset())
    assert listed == [1]  # the first pass tests a against c; later passes have nothing to refine


# ------------------------------------------------------------------ through the CLI
def test_a_footprint_written_by_a_create_phase_mid_run_is_taken_into_account(make_repo, bar):
    a = StoryDef("1-1-alpha", files=["src/shared.py"], status="backlog")
    b = StoryDef("1-2-beta", files=["src/shared.py"])
    c = StoryDef("1-3-gamma", files=["src/gamma.py"])
    script = {
        a.key: {"create": [create_step(a, touch=[str(bar / "in-create-a")],
                                       wait_for=str(bar / "go-create-a"))],
                "dev": [{"write": {"src/shared.py": "A = 1\n"}, "touch": [str(bar / "in-dev-a")],
                         "wait_for": str(bar / "go-dev-a")}]},
        b.key: {"dev": [{"append": {"src/shared.py": "B = 2\n"}, "touch": [str(bar / "in-dev-b")]}]},
        c.key: {"dev": [{"write": {"src/gamma.py": "C = 3\n"}, "touch": [str(bar / "in-dev-c")],
                         "wait_for": str(bar / "go-dev-c")}]},
    }
    repo = make_repo([a, b, c], script=script, policy='[scm]\nmax_parallel = 3\n[gates]\nmode = "none"\n')
    drop_story_files(repo, a.key)
    proc = repo.spawn("run")
    wait_until(lambda: "create-a" in inside(bar), what="alpha's creation running")
    wait_until(lambda: repo.story(b.key)["waiting_for"], what="beta held back by the creation")
    go(bar, "create-a")
    # Alpha's created footprint meets beta's: beta waits for alpha, gamma runs beside alpha.
    wait_until(lambda: {"dev-a", "dev-c"} <= set(inside(bar)), what="alpha and gamma in dev")
    beta = repo.story(b.key)
    assert beta["state"] == "pending"
    assert beta["waiting_for"] == f"conflicts with {a.key}: src/shared.py overlaps src/shared.py"
    go(bar, "dev-a")
    go(bar, "dev-c")
    assert proc.wait(timeout=60) == 0, repo.spawned_logs()
    journal = repo.journal()
    seq_of = {(e["kind"], e["story"]): e["seq"] for e in journal}
    beta = repo.story(b.key)
    if beta["stacked_on"]:  # started on alpha's finished, not yet integrated work
        assert beta["stacked_on"] == [a.key]
        assert repo.git("show", f"{beta['base_sha']}:src/shared.py") == "A = 1"
    else:  # or after alpha's integration
        assert seq_of[("story.integrated", a.key)] < seq_of[("story.started", b.key)]
        assert beta["base_sha"] == repo.story(a.key)["integrated_sha"]
    assert repo.git("show", "main:src/shared.py") == "A = 1\nB = 2"
