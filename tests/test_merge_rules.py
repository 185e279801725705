"""Conflicts the lane settles by itself: `[integration] merge` rules, BMAD's ledger by default.

Real repositories, the scripted agent as a real process, real runs through the CLI; the agents'
barriers (`support.barrier_script`) decide the order in which they finish, never sleeps.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from bmad_loop.git.trees.compose import compose
from bmad_loop.engine.crashpoints import CRASH_ENV, ONCE_ENV
from bmad_loop.git.runner import Git
from bmad_loop.git.trees.settle import MergeRules, union_text
from bmad_loop.policy.mergerule import MergeRule
from support import (MERGE_NONE, STORY_DIR, StoryDef, barrier_script, git, go, init_repo,
                     inside, project_argv, query, states, stop_processes, wait_for_exit,
                     wait_until, write_each)

LEDGER = f"{STORY_DIR}/deferred-work.md"
LEDGER_BASE = "# Deferred Work\n\nFindings deferred by reviews, newest last.\n"
ENTRIES = {
    "1-1-a": "- 1-1-a: retry the flaky upload\n",
    "1-2-b": "- 1-2-b: the cache key ignores the locale\n",
    # A code-review block, as BMAD's code review appends it: blank line, heading, bullets.
    "1-3-c": ("\n## Deferred from: code review of 1-3-c (2026-12-05)\n\n"
              "- [x] [Review][Defer] Pagination past 10k rows — deferred, pre-existing\n"
              "- [x] [Review][Defer] Error copy is not localised — deferred, pre-existing\n"),
}
THREE = [StoryDef("1-1-a", files=["src/a.py", LEDGER]), StoryDef("1-2-b", files=["src/b.py", LEDGER]),
         StoryDef("1-3-c", files=["src/c.py"])]  # c appends without declaring it: no drift either
FILES = {"src/__init__.py": "", LEDGER: LEDGER_BASE}


def _ledger(repo, ref: str = "main") -> str:
    return repo.git("show", f"{ref}:{LEDGER}") + "\n"  # git show drops the last newline


def _appending(stories, bar=None) -> dict:
    """Each story writes its file and appends its entry to the ledger; with `bar`, then waits."""
    extra = {s.key: {"append": {LEDGER: ENTRIES[s.key]}} for s in stories}
    if bar is not None:
        return barrier_script(stories, bar, extra)
    script = write_each(stories)
    for s in stories:
        script[s.key]["dev"][0].update(extra[s.key])
    return script


# ------------------------------------------------------------------------------ the bytes
@pytest.mark.parametrize("base, target, story, expected", [
    (b"A\n", b"A\n", b"A\nB\n", b"A\nB\n"),                        # the target did not move
    (b"A\n", b"A\nX\n", b"A\nB\n", b"A\nX\nB\n"),                   # an earlier story appended
    (b"A\nL\n", b"A2\nL\n", b"A\nL\nB\n", b"A2\nL\nB\n"),           # ... or rewrote a line: kept as rewritten
    (None, None, b"B\n", b"B\n"),                                  # absent on base and target
    (None, b"X\n", b"B\n", b"X\nB\n"),
    (b"A\n", b"A\nX", b"A\nB\n", b"A\nX\nB\n"),                     # no newline at the end: one is put
    (b"A\nB\n", b"A\nB\n", b"A\nB\nB\n", b"A\nB\nB\n"),             # duplicate lines are kept
    (b"A\nL\n", b"A\nL\n", b"A\nM\nL\n", None),                     # an insertion: not an append
    (b"A\nL\n", b"A\nL\n", b"A\n", None),                           # a deletion
    (b"A\n", b"A\n", None, None),                                  # the story deleted the file
])
def test_union_is_the_targets_text_then_the_storys_suffix(base, target, story, expected):
    assert union_text(base, target, story) == expected


# ------------------------------------------------------------------------------ BMAD's ledger
def test_three_stories_appending_to_bmads_ledger_land_in_plan_order_finishing_in_any_order(make_repo, bar):
    repo = make_repo(THREE, script=_appending(THREE, bar), files=FILES,
                     policy=MERGE_NONE.format(n=3, strategy="merge"))
    proc = repo.spawn("run")
    # Both declare the ledger in `files`: it is settled by a rule, so they still run together.
    wait_until(lambda: len(inside(bar)) == 3, what="all three inside at once")
    for key in ("1-3-c", "1-2-b", "1-1-a"):  # finish last-first
        go(bar, key)
        wait_until(lambda: repo.story(key)["state"] in ("ready", "integrated"), what=f"{key} done")
    assert proc.wait(timeout=60) == 0, repo.spawned_logs()
    assert states(repo) == {s.key: "integrated" for s in THREE}
    assert _ledger(repo) == LEDGER_BASE + "".join(ENTRIES[s.key] for s in THREE)
    journal = repo.journal()
    settled = [e for e in journal if e["kind"] == "candidate.settled"]
    assert [e["story"] for e in settled] == [s.key for s in THREE]
    for event in settled:
        data = event["data"]
        assert data["path"] == LEDGER and data["rule"] == "union"
        assert data["glob"] == "/" + LEDGER
        assert all(len(data[k]) == 40 for k in ("base_blob", "target_blob", "story_blob", "result_blob"))
        assert repo.git("cat-file", "-t", data["result_blob"]) == "blob"
    assert not [e for e in journal if e["kind"] == "footprint.drift"]
    status = repo.status()
    by_key = {s["key"]: s for s in status["stories"]}
    assert by_key["1-2-b"]["settled"] == [{"path": LEDGER, "rule": "union"}]
    evidence = next(c["evidence"] for c in status["candidates"] if c["story"] == "1-3-c")
    assert json.loads(Path(evidence).read_text())["settled"][0]["path"] == LEDGER


def test_the_same_sprint_at_n_1_leaves_the_same_ledger_bytes(make_repo, bar):
    sequential = make_repo(THREE, script=_appending(THREE), files=FILES, name="one",
                           policy=MERGE_NONE.format(n=1, strategy="merge"))
    assert sequential.cli("run").exit_code == 0
    parallel = make_repo(THREE, script=_appending(THREE, bar), files=FILES, name="three",
                         policy=MERGE_NONE.format(n=3, strategy="merge"))
    proc = parallel.spawn("run")
    wait_until(lambda: len(inside(bar)) == 3, what="all three inside")
    for key in ("1-2-b", "1-3-c", "1-1-a"):
        go(bar, key)
    assert proc.wait(timeout=60) == 0, parallel.spawned_logs()
    assert _ledger(parallel) == _ledger(sequential)
    assert parallel.git("rev-parse", f"main:{LEDGER}") == sequential.git("rev-parse", f"main:{LEDGER}")


@pytest.mark.parametrize("strategy", ["ff", "squash"])
def test_union_settles_under_every_strategy(make_repo, bar, strategy):
    # Under ff the lane replays the second story's commit (bmad-loop's, made for its agent)
    # onto the target the first one moved: the union settles at that pick.
    two = THREE[:2]
    script = _appending(two, bar)
    repo = make_repo(two, script=script, files=FILES, policy=MERGE_NONE.format(n=2, strategy=strategy))
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, "1-2-b")
    go(bar, "1-1-a")
    assert proc.wait(timeout=60) == 0, repo.spawned_logs()
    assert _ledger(repo) == LEDGER_BASE + ENTRIES["1-1-a"] + ENTRIES["1-2-b"]


def test_a_rewrite_earlier_in_plan_order_and_a_later_append_both_land_exactly(make_repo, bar):
    base = LEDGER_BASE + "- old finding one\n- old finding two\n"
    a, b = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])
    script = barrier_script([a, b], bar, {
        a.key: {"write": {LEDGER: base.replace("- old finding one\n", "- old finding one (fixed)\n")}},
        b.key: {"append": {LEDGER: ENTRIES["1-2-b"]}}})
    repo = make_repo([a, b], script=script, files={**FILES, LEDGER: base},
                     policy=MERGE_NONE.format(n=2, strategy="merge"))
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, b.key)
    go(bar, a.key)
    assert proc.wait(timeout=60) == 0, repo.spawned_logs()
    expected = base.replace("- old finding one\n", "- old finding one (fixed)\n") + ENTRIES["1-2-b"]
    assert _ledger(repo) == expected  # the rewritten line never comes back


def test_a_deletion_after_an_append_that_git_cannot_merge_escalates_with_todays_message(make_repo, bar, escalate_at_once):
    base = LEDGER_BASE + "- old finding\n"
    a, b = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])
    script = barrier_script([a, b], bar, {
        a.key: {"append": {LEDGER: ENTRIES["1-1-a"]}},
        b.key: {"write": {LEDGER: LEDGER_BASE}}})  # b deletes the last line: not an append
    repo = make_repo([a, b], script=script, files={**FILES, LEDGER: base},
                     policy=MERGE_NONE.format(n=2, strategy="merge"))
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, a.key)
    go(bar, b.key)
    assert proc.wait(timeout=60) == 3, repo.spawned_logs()
    assert repo.story(b.key)["state"] == "escalated"
    assert repo.story(b.key)["reason"] == f"merge conflict with the target in {LEDGER}"
    assert _ledger(repo) == base + ENTRIES["1-1-a"]  # a landed, the deleted line is still a's


# ------------------------------------------------------------------------------ regenerate
LOCKER = """import hashlib, json, pathlib, sys
pkg = json.loads(pathlib.Path("package.json").read_text())
deps = pkg.get("dependencies", {})
digest = hashlib.sha256(",".join(sorted(deps)).encode()).hexdigest()[:16]
lock = {"lockfileVersion": 3, "integrity": digest,
        "packages": {name: {"version": deps[name]} for name in sorted(deps)}}
pathlib.Path("package-lock.json").write_text(json.dumps(lock, indent=2) + "\\n")
print("locked", len(deps), "dependencies")
"""


def _package(*deps: str) -> str:
    # Unchanged lines between the places two stories add theirs, so git merges package.json.
    lines = ",\n".join(f'    "{d}": "1.0.0"' for d in deps)
    return '{\n  "name": "app",\n  "dependencies": {\n' + lines + "\n  }\n}\n"


def _lock(*deps: str) -> str:
    # Like a real lockfile, a line that every added dependency changes: git cannot merge two.
    digest = hashlib.sha256(",".join(sorted(deps)).encode()).hexdigest()[:16]
    lock = {"lockfileVersion": 3, "integrity": digest,
            "packages": {d: {"version": "1.0.0"} for d in sorted(deps)}}
    return json.dumps(lock, indent=2) + "\n"


BASE_DEPS = ("alpha", "kilo", "lima", "mike", "zulu")
LOCK_POLICY = (MERGE_NONE.format(n=2, strategy="merge")
               + '[integration.merge]\n"package-lock.json" = {{ regenerate = [{python}, "tools/lock.py"] }}\n')


def _adding(bar, stories, extra_deps: dict) -> dict:
    """Each story adds its dependency to package.json and writes the lockfile it would get."""
    steps = {}
    for s in stories:
        deps = sorted(BASE_DEPS + (extra_deps[s.key],))
        steps[s.key] = {"write": {"package.json": _package(*deps), "package-lock.json": _lock(*deps)}}
    return barrier_script(stories, bar, steps)


def test_two_stories_adding_a_dependency_integrate_with_a_regenerated_lockfile(make_repo, bar):
    # package.json stays out of the footprints (drift, a warning), so the two run side by side;
    # git merges package.json, not the lockfile both rewrote.
    a, b = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])
    files = {"src/__init__.py": "", "tools/lock.py": LOCKER, "package.json": _package(*BASE_DEPS),
             "package-lock.json": _lock(*BASE_DEPS)}
    script = _adding(bar, [a, b], {a.key: "bravo", b.key: "yankee"})
    repo = make_repo([a, b], script=script, files=files,
                     policy=LOCK_POLICY.format(python=json.dumps(sys.executable)))
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, a.key)
    go(bar, b.key)
    assert proc.wait(timeout=60) == 0, repo.spawned_logs()
    everything = sorted(BASE_DEPS + ("bravo", "yankee"))
    assert repo.git("show", "main:package-lock.json") + "\n" == _lock(*everything)
    assert json.loads(repo.git("show", "main:package.json"))["dependencies"].keys() == set(everything)
    regenerated = [e for e in repo.journal() if e["kind"] == "candidate.settled"
                   and e["data"]["rule"] == "regenerate"]
    assert [e["story"] for e in regenerated] == [b.key]
    run = regenerated[0]["data"]["commands"][0]
    assert run["exit_code"] == 0 and run["cwd"] == "."
    assert "locked 7 dependencies" in Path(run["log"]).read_text()


@pytest.mark.parametrize("command, why", [
    ('"exit 3"', "exited 3"),
    ('"echo broken > src/__init__.py"', "changed tracked files outside the rule: src/__init__.py"),
])
def test_a_failing_generator_escalates_naming_its_log(make_repo, bar, command, why,
                                                    escalate_at_once):
    a, b = StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])
    files = {"src/__init__.py": "", "package.json": _package(*BASE_DEPS),
             "package-lock.json": _lock(*BASE_DEPS)}
    script = _adding(bar, [a, b], {a.key: "bravo", b.key: "yankee"})
    policy = (MERGE_NONE.format(n=2, strategy="merge")
              + f'[integration.merge]\n"package-lock.json" = {{ regenerate = {command} }}\n')
    repo = make_repo([a, b], script=script, files=files, policy=policy)
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, a.key)
    go(bar, b.key)
    assert proc.wait(timeout=60) == 3, repo.spawned_logs()
    story = repo.story(b.key)
    assert story["state"] == "escalated"
    assert why in story["reason"]
    failed = [e for e in repo.journal() if e["kind"] == "candidate.regenerate_failed"]
    assert failed and failed[0]["story"] == b.key
    log = failed[0]["data"]["commands"][0]["log"]
    assert Path(log).exists()
    if "exited" in why:
        assert f"(log: {log})" in story["reason"]
    evidence = json.loads(Path(failed[0]["data"]["evidence"]).read_text())
    assert evidence["kind"] == "regenerate-failed"
    assert repo.git("show", "main:package-lock.json") + "\n" == _lock(*sorted(BASE_DEPS + ("bravo",)))


def test_always_regenerates_even_when_git_merges_the_lockfile_cleanly(make_repo):
    # One story, an unmoved target: nothing conflicts, `always` runs the generator anyway and
    # corrects a lockfile the agent got wrong.
    a = StoryDef("1-1-a", files=["src/a.py", "package.json"], shared=["package-lock.json"])
    files = {"src/__init__.py": "", "tools/lock.py": LOCKER, "package.json": _package(*BASE_DEPS),
             "package-lock.json": _lock(*BASE_DEPS)}
    script = {a.key: {"dev": [{"write": {"src/a.py": "A = 1\n",
                                         "package.json": _package(*BASE_DEPS, "bravo"),
                                         "package-lock.json": "stale\n"}}]}}
    policy = (MERGE_NONE.format(n=1, strategy="squash") + '[integration.merge]\n"package-lock.json" = '
              f'{{ regenerate = [{json.dumps(sys.executable)}, "tools/lock.py"], always = true }}\n')
    repo = make_repo([a], script=script, files=files, policy=policy)
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert repo.git("show", "main:package-lock.json") + "\n" == _lock(*BASE_DEPS, "bravo")


# ------------------------------------------------------------------------------ a kill -9
def _killed_once_at(repo, point: str, bar, tmp_path) -> None:
    """Run the sprint on real `worker` processes: b and c finish first (ready, waiting for a),
    then a, whose integration SIGKILLs its process at `point`; a second worker finishes the run.
    Nobody is inside an agent session at the kill, so nothing runs twice."""
    import subprocess

    log = tmp_path / "worker.log"
    env = dict(os.environ, **{CRASH_ENV: point, ONCE_ENV: str(tmp_path / "marker")})
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip().splitlines()[-1]

    def worker():
        with open(log, "ab") as handle:
            return subprocess.Popen(project_argv(repo, "worker", "--queue", "all", "-w", "3"),
                                    env=env, stdout=handle, stderr=subprocess.STDOUT)

    first = worker()
    try:
        wait_until(lambda: len(inside(bar)) == 3, what="all three inside")
        for key in ("1-2-b", "1-3-c"):
            go(bar, key)
            wait_until(lambda: repo.story(key)["state"] == "ready", what=f"{key} ready")
        go(bar, "1-1-a")
        assert wait_for_exit(first, 60, log) == -signal.SIGKILL, log.read_text()[-3000:]
    finally:
        stop_processes(first)
    assert (tmp_path / "marker").read_text() == point
    second = worker()
    try:
        wait_until(lambda: repo.status(run_id)["run"]["state"] == "completed", timeout=60,
                   interval=0.2, what="the run to complete")
    finally:
        stop_processes(second)


def test_a_kill_9_during_composition_leaves_the_same_ledger(make_repo, bar, tmp_path):
    repo = make_repo(THREE, script=_appending(THREE, bar), files=FILES,
                     policy=MERGE_NONE.format(n=3, strategy="merge") + "[leases]\nttl_s = 3\n")
    _killed_once_at(repo, "lane.after_compose", bar, tmp_path)
    assert _ledger(repo) == LEDGER_BASE + "".join(ENTRIES[s.key] for s in THREE)


# ------------------------------------------------------------------------------ attributes
def _diverged(tmp_path) -> tuple[Path, Git, str, str]:
    """A repository whose `notes.txt` two branches append to differently: git conflicts."""
    root = init_repo(tmp_path / "attrs", {"notes.txt": "a\n"})
    for branch, line in (("one", "b\n"), ("two", "c\n")):
        git(root, "checkout", "-q", "-b", branch, "main")
        (root / "notes.txt").write_text("a\n" + line)
        git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", branch)
    git(root, "checkout", "-q", "main")
    return root, Git(root), git(root, "rev-parse", "one"), git(root, "rev-parse", "two")


def test_an_uncommitted_gitattributes_edit_changes_nothing_in_composition(tmp_path):
    root, repo, one, two = _diverged(tmp_path)
    before = compose(repo, "merge", one, two, "m")
    (root / ".gitattributes").write_text("notes.txt merge=union\n")  # in the checkout only
    after = compose(repo, "merge", one, two, "m")
    assert before.conflicts == after.conflicts == ("notes.txt",)
    assert before.tree == after.tree


def test_attributes_committed_on_the_target_are_honoured(tmp_path):
    root, repo, one, two = _diverged(tmp_path)
    git(root, "checkout", "-q", "one")
    (root / ".gitattributes").write_text("notes.txt merge=union\n")
    git(root, "add", ".gitattributes")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "attrs")
    target = git(root, "rev-parse", "HEAD")
    git(root, "checkout", "-q", "main")
    (root / ".gitattributes").write_text("")  # the checkout says otherwise: ignored
    composed = compose(repo, "merge", target, two, "m")
    assert composed.ok
    assert git(root, "show", f"{composed.sha}:notes.txt") == "a\nb\nc"


def test_a_rule_is_chosen_by_its_longest_literal_prefix():
    union, regen = MergeRule("union"), MergeRule("regenerate", "true")
    rules = MergeRules((("*.md", union), ("docs/*.md", regen), ("/docs/CHANGELOG.md", union)))
    assert rules.rule_for("notes.md")[0] == "*.md"
    assert rules.rule_for("docs/a.md")[0] == "docs/*.md"
    assert rules.rule_for("docs/CHANGELOG.md")[0] == "/docs/CHANGELOG.md"
    assert rules.rule_for("src/a.py") is None


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("rules, message", [
    (f'"{LEDGER.rsplit("/", 1)[0]}/*.yaml" = "union"', "covers the sprint board"),
    ('"*.lock" = "union"\n"*.json" = "union"', "neither is more specific"),
    ('"CHANGELOG.md" = "merge"', 'must be "union" or a table'),
    ('"x.lock" = { regenerate = "make", alway = true }', "unknown key (did you mean 'always'?)"),
])
def test_a_bad_rule_is_refused_with_one_line_and_nothing_created(make_repo, rules, message):
    repo = make_repo(THREE, files=FILES, policy=MERGE_NONE.format(n=2, strategy="merge")
                     + "[integration.merge]\n" + rules + "\n")
    result = repo.cli("run")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert repo.bmad_branches() == []
    assert not (repo.root / ".bmad-loop" / "state.db").exists()


def test_a_rule_overlapping_a_lane_owned_path_is_refused(make_repo):
    repo = make_repo(THREE, files=FILES, policy='[scm]\nlane_owned = ["CHANGELOG.md"]\n'
                     '[integration.merge]\n"CHANGELOG.md" = "union"\n')
    result = repo.cli("run")
    assert result.exit_code == 2
    assert "lane-owned path 'CHANGELOG.md'" in result.output


def test_the_environment_cannot_set_the_table_of_rules(make_repo, monkeypatch):
    repo = make_repo(THREE, files=FILES)
    monkeypatch.setenv("BMAD_LOOP_INTEGRATION_MERGE", '{ "a.md" = "union" }')
    result = repo.cli("run")
    assert result.exit_code == 2
    assert "BMAD_LOOP_INTEGRATION_MERGE: [integration] merge is a table" in result.output


def test_validate_lists_the_rules_in_force_and_warns_about_a_glob_matching_nothing(make_repo):
    repo = make_repo(THREE, files=FILES, policy='[integration.merge]\n"CHANGES.md" = "union"\n')
    result = repo.cli("validate", "--json")
    checks = [c for c in json.loads(result.output)["checks"] if c["name"] == "merge"]
    details = [(c["status"], c["detail"]) for c in checks]
    assert ("ok", f"/{LEDGER} = union (built-in (BMAD's deferred-work ledger))") in details
    assert ("ok", "CHANGES.md = union ([integration] merge)") in details
    assert ("warn", "[integration] merge: 'CHANGES.md' matches no file on the target") in details
    assert not any("deferred-work" in d for s, d in details if s == "warn")


def test_the_ledger_follows_bmads_layered_config(make_repo, bar):
    # v6.11: _bmad/config.toml names the folder; a custom layer overrides the installer's.
    folder = "planning/impl"
    stories = [StoryDef("1-1-a", files=["src/a.py"]), StoryDef("1-2-b", files=["src/b.py"])]
    ledger = f"{folder}/deferred-work.md"
    script = barrier_script(stories, bar, {s.key: {"append": {ledger: ENTRIES[s.key]}}
                                           for s in stories})
    repo = make_repo(stories, script=script, files={"src/__init__.py": "", ledger: LEDGER_BASE},
                     policy=MERGE_NONE.format(n=2, strategy="merge"))
    (repo.root / "_bmad" / "custom").mkdir(parents=True)
    (repo.root / "_bmad" / "config.toml").write_text(
        '[core]\noutput_folder = "{project-root}/out"\n'
        '[modules.bmm]\nimplementation_artifacts = "{project-root}/nowhere"\n')
    (repo.root / "_bmad" / "custom" / "config.toml").write_text(
        f'[modules.bmm]\nimplementation_artifacts = "{{project-root}}/{folder}"\n')
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 2, what="both inside")
    go(bar, "1-2-b")
    go(bar, "1-1-a")
    assert proc.wait(timeout=60) == 0, repo.spawned_logs()
    assert repo.git("show", f"main:{ledger}") + "\n" == LEDGER_BASE + ENTRIES["1-1-a"] + ENTRIES["1-2-b"]


# ------------------------------------------------------------------------------ ignored ledgers
def _ignored_ledger_repo(make_repo, script, policy, name="repo"):
    """BMAD's ledger kept out of git: the checkout holds a copy nobody commits."""
    repo = make_repo(THREE, script=script, files={"src/__init__.py": ""}, policy=policy, name=name)
    with open(repo.root / ".gitignore", "a") as handle:
        handle.write("deferred-work.md\n")
    repo.commit_all("ignore the ledger")
    (repo.root / LEDGER).write_text(LEDGER_BASE)
    return repo


def test_a_git_ignored_ledger_gets_each_storys_entries_in_plan_order_once(make_repo, bar):
    repo = _ignored_ledger_repo(make_repo, _appending(THREE, bar),
                                MERGE_NONE.format(n=3, strategy="merge"))
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 3, what="all three inside")
    for key in ("1-3-c", "1-1-a", "1-2-b"):
        go(bar, key)
    assert proc.wait(timeout=60) == 0, repo.spawned_logs()
    assert (repo.root / LEDGER).read_text() == LEDGER_BASE + "".join(ENTRIES[s.key] for s in THREE)
    assert repo.git("ls-files", LEDGER) == ""  # still not committed
    assert repo.story("1-2-b")  # the rows kept the lines until they landed
    kept = repo.git("status", "--porcelain", "--ignored", LEDGER)
    assert kept.startswith("!!")


def test_an_escalated_storys_ledger_lines_are_not_appended(make_repo, bar):
    script = _appending(THREE, bar)
    script["1-2-b"]["dev"][0]["write"] = {"src/b.py": "bad\n"}
    policy = MERGE_NONE.format(n=3, strategy="merge") + '[verify]\ncommands = ["! grep -q bad src/b.py"]\n'
    repo = _ignored_ledger_repo(make_repo, script, policy)
    proc = repo.spawn("run")
    wait_until(lambda: len(inside(bar)) == 3, what="all three inside")
    for key in ("1-1-a", "1-2-b", "1-3-c"):
        go(bar, key)
    assert proc.wait(timeout=120) == 3, repo.spawned_logs()
    assert repo.story("1-2-b")["state"] == "escalated"
    assert (repo.root / LEDGER).read_text() == LEDGER_BASE + ENTRIES["1-1-a"]


def test_a_kill_9_after_the_advance_neither_loses_nor_doubles_an_ignored_ledgers_lines(
        make_repo, bar, tmp_path):
    policy = MERGE_NONE.format(n=3, strategy="merge") + "[leases]\nttl_s = 3\n"
    repo = _ignored_ledger_repo(make_repo, _appending(THREE, bar), policy)
    _killed_once_at(repo, "lane.after_cas", bar, tmp_path)
    assert (repo.root / LEDGER).read_text() == LEDGER_BASE + "".join(ENTRIES[s.key] for s in THREE)
    captured = [json.loads(lines) for (lines,) in query(repo, "SELECT ledger_lines FROM stories ORDER BY seq")]
    assert captured == [{LEDGER: ENTRIES[s.key]} for s in THREE]


def test_the_append_is_written_once_whatever_point_a_kill_stopped_it_at(tmp_path):
    from bmad_loop.engine.mergerules import append_ledger_lines

    root, state = tmp_path / "checkout", tmp_path / "state"
    ledger = root / "notes" / "deferred-work.md"
    ledger.parent.mkdir(parents=True)
    ledger.write_text("base\n")
    lines = {"notes/deferred-work.md": "- one\n- two\n"}
    assert append_ledger_lines(root, state, "r1", "1-1-a", lines) is True
    assert append_ledger_lines(root, state, "r1", "1-1-a", lines) is False  # done: skipped
    assert ledger.read_text() == "base\n- one\n- two\n"
    record_file = state / "ledgers" / "r1.json"
    record = json.loads(record_file.read_text())
    # Killed after the bytes were written, before the record said so: written once.
    record["1-1-a"]["done"] = False
    record_file.write_text(json.dumps(record))
    assert append_ledger_lines(root, state, "r1", "1-1-a", lines) is True
    assert ledger.read_text() == "base\n- one\n- two\n"
    # Killed half-way through the write: completed, not doubled.
    record["1-1-a"]["done"] = False
    record_file.write_text(json.dumps(record))
    ledger.write_text("base\n- on")
    append_ledger_lines(root, state, "r1", "1-1-a", lines)
    assert ledger.read_text() == "base\n- one\n- two\n"
    # A later story's lines follow, however many times it is retried.
    for _ in range(2):
        append_ledger_lines(root, state, "r1", "1-2-b", {"notes/deferred-work.md": "- three\n"})
    assert ledger.read_text() == "base\n- one\n- two\n- three\n"


def test_validate_warns_about_a_ledger_neither_committed_nor_ignored(make_repo):
    repo = make_repo(THREE, files={"src/__init__.py": ""})
    (repo.root / LEDGER).write_text(LEDGER_BASE)  # untracked, not ignored
    checks = json.loads(repo.cli("validate", "--json").output)["checks"]
    warned = [c["detail"] for c in checks if c["name"] == "merge" and c["status"] == "warn"]
    assert warned == [f"{LEDGER}: a union ledger that is neither committed nor ignored: commit it, "
                      "or git-ignore it to keep it in the checkout only"]
