"""The states module is the one vocabulary: its transition tables are enforced, documented
exactly as docs/state-machines.md draws them, and no module spells a state as a literal."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from sqlalchemy import select

from bmad_loop.db.models import Candidate, Run, Story
from bmad_loop.engine.project import Project
from bmad_loop.engine.transitions import transition_story
from bmad_loop.states import (
    ATTEMPT_INITIAL,
    ATTEMPT_TRANSITIONS,
    CANDIDATE_INITIAL,
    CANDIDATE_TRANSITIONS,
    RUN_INITIAL,
    RUN_TRANSITIONS,
    STORY_INITIAL,
    STORY_TRANSITIONS,
    AttemptState,
    CandidateState,
    IllegalTransition,
    Phase,
    RunState,
    StopMode,
    StoryState,
    check_transition,
)
from support import StoryDef

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "bmad_loop"
MACHINES = {
    "Runs": ("run", RunState, RUN_INITIAL, RUN_TRANSITIONS),
    "Stories and their phases": ("story", StoryState, STORY_INITIAL, STORY_TRANSITIONS),
    "Candidates": ("candidate", CandidateState, CANDIDATE_INITIAL, CANDIDATE_TRANSITIONS),
    "Attempts": ("attempt", AttemptState, ATTEMPT_INITIAL, ATTEMPT_TRANSITIONS),
}


def documented_transitions(section: str) -> tuple[set[str], set[tuple[str, str]]]:
    """(initial states, (from, to) pairs) from the markdown table under `## section`."""
    text = (ROOT / "docs" / "state-machines.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    initial, edges = set(), set()
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[1].startswith("`") and cells[1] != "(stays)":
            continue
        sources = re.findall(r"`([a-z-]+)`", cells[0])
        targets = re.findall(r"`([a-z-]+)`", cells[1])
        if cells[0] == "—":
            initial.update(targets)
        for old in sources:
            for new in targets:
                if old != new:
                    edges.add((old, new))
    return initial, edges


@pytest.mark.parametrize("section", list(MACHINES))
def test_every_documented_transition_is_allowed_and_every_allowed_one_is_documented(section):
    _machine, _vocab, initial, table = MACHINES[section]
    doc_initial, doc_edges = documented_transitions(section)
    allowed = {(old.value, new.value) for old, news in table.items() for new in news}
    assert doc_initial == {s.value for s in initial}
    assert doc_edges - allowed == set(), "documented but refused"
    assert allowed - doc_edges == set(), "allowed but undocumented"


@pytest.mark.parametrize("machine,old,new", [
    ("run", "completed", "running"),   # completed is terminal
    ("run", "failed", "paused"),
    ("run", "paused", "completed"),
    ("run", "stopping", "paused"),
    ("story", "pending", "integrated"),
    ("story", "integrated", "pending"),
    ("story", "queued", "ready"),
    ("story", "ready", "working"),
    ("story", "skipped", "pending"),
    ("candidate", "advanced", "advancing"),
    ("candidate", "composing", "advanced"),
    ("candidate", "stale", "verifying"),
    ("attempt", "succeeded", "running"),
    ("attempt", "running", "crashed"),
])
def test_a_transition_outside_the_table_is_refused(machine, old, new):
    with pytest.raises(IllegalTransition):
        check_transition(machine, old, new)


def test_a_new_row_must_start_in_an_initial_state_and_unknown_states_are_refused():
    with pytest.raises(IllegalTransition):
        check_transition("story", None, "working")
    with pytest.raises(IllegalTransition):
        check_transition("run", "running", "sleeping")
    check_transition("story", None, "pending")
    check_transition("run", "running", "running")  # staying put is not a transition


@pytest.fixture
def project_with_run(make_repo):
    """An enqueued run (one pending story) in a real repository and state database."""
    repo = make_repo([StoryDef("1-1-alpha", files=["src/alpha.py"])])
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    project = Project.open(repo.root)
    yield project, result.output.strip()
    project.close()


def test_the_models_refuse_an_illegal_assignment_and_the_guarded_update_refuses_before_writing(
        project_with_run):
    project, run_id = project_with_run

    with project.db.transaction() as s:
        story = s.scalars(select(Story).where(Story.run_id == run_id)).first()
        story_id = story.id
        with pytest.raises(IllegalTransition):
            story.state = StoryState.INTEGRATED  # pending -> integrated
    with project.db.transaction() as s:
        with pytest.raises(IllegalTransition):
            transition_story(s, story_id, StoryState.PENDING, state=StoryState.READY)
    with project.db.transaction() as s:
        assert s.get(Story, story_id).state == StoryState.PENDING  # nothing was written
        run = s.get(Run, run_id)
        with pytest.raises(IllegalTransition):
            run.state = "no-such-state"
        with pytest.raises(IllegalTransition):
            s.add(Candidate(run_id=run_id, story_id=story_id, attempt=1, strategy="merge",
                            state=CandidateState.ADVANCED, target_sha="0" * 40))


def test_enum_members_are_the_strings_stored_in_the_rows():
    assert CandidateState.VERIFY_FAILED == "verify-failed"
    assert f"run.{RunState.PAUSED}" == "run.paused"
    assert {Phase.DEV: 1}["dev"] == 1
    assert StopMode("now") is StopMode.NOW


# ---------------------------------------------------------------- no literals outside states.py
VALUES = {m.value for E in (RunState, StoryState, CandidateState, AttemptState, Phase, StopMode)
          for m in E}
STATEY = {"state", "phase", "next_phase", "stop_mode", "after_phase"}


def _constants(node) -> list[ast.Constant]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for element in node.elts for c in _constants(element)]
    return []


def _name(node) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def state_literals(path: Path) -> list[tuple[int, str]]:
    """String constants equal to a state or phase where code compares, assigns or transitions
    a state: comparisons, `state=`/`phase=` keywords, assignments to such attributes, the
    arguments of the guarded transitions and `in_()`, and upper-case constants made of them."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        found: list[ast.Constant] = []
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                found += _constants(side)
        elif isinstance(node, ast.keyword) and node.arg in STATEY:
            found += _constants(node.value)
        elif isinstance(node, ast.Assign):
            target = node.targets[0]
            targets = target.elts if isinstance(target, ast.Tuple) else [target]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                for t, v in zip(target.elts, node.value.elts):
                    if _name(t) in STATEY:
                        found += _constants(v)
            elif any(_name(t) in STATEY for t in targets):
                found += _constants(node.value)
            elif any((_name(t) or "").isupper() for t in targets):
                constants = _constants(node.value)
                if constants and all(c.value in VALUES for c in constants):
                    found += constants
        elif isinstance(node, ast.Call) and _name(node.func) in ("transition_story", "transition_run", "in_"):
            for arg in node.args:
                found += _constants(arg)
        hits += [(c.lineno, c.value) for c in found if c.value in VALUES]
    return sorted(set(hits))


def test_no_module_outside_states_spells_a_state_or_phase_as_a_literal():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "states.py" or "_migrations" in path.parts:
            continue
        offenders += [f"{path.relative_to(SRC)}:{line}: {value!r}" for line, value in state_literals(path)]
    assert offenders == []


def test_the_literal_scan_finds_what_it_looks_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('if story.state == "ready":\n    row.state, row.phase = "escalated", "dev"\n'
                      'LIVE = ("running", "pausing")\ntransition_story(s, 1, "queued", state="working")\n')
    assert {v for _, v in state_literals(sample)} == {"ready", "escalated", "dev", "running",
                                                      "pausing", "queued", "working"}
