"""The lane's rows: kept across passes, read again only when the database moved their `rev`
(runs.lane_rows; the trigger of migration 0010 moves it on every UPDATE, whoever runs it)."""

from __future__ import annotations

import contextlib
import subprocess
import sys

from sqlalchemy import event, update

from bmad_loop.db.models import Story
from bmad_loop.engine.project import Project
from bmad_loop.engine.runrows import lane_rows
from bmad_loop.policy import load_policy
from support import ALPHA_BETA_GAMMA, MERGE_NONE, query, write_each


@contextlib.contextmanager
def _statements(engine):
    seen: list[str] = []

    def note(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", note)


def test_kept_rows_are_read_again_only_when_an_update_moved_their_rev(make_repo):
    repo = make_repo(ALPHA_BETA_GAMMA, script=write_each(ALPHA_BETA_GAMMA),
                     policy=MERGE_NONE.format(n=1, strategy="merge"))
    assert repo.cli("run").exit_code == 0
    run_id = query(repo, "SELECT id FROM runs")[0][0]
    project = Project(root=repo.root, policy=load_policy(repo.root))
    try:
        kept: dict = {}
        with project.db.read() as s:
            plain = lane_rows(s, run_id)
            first = lane_rows(s, run_id, kept)
        assert first == plain and [r.key for r in first] == [st.key for st in ALPHA_BETA_GAMMA]
        assert sorted(kept) == sorted(r.id for r in plain)
        # Nothing changed: one narrow read of the versions, every row the one kept.
        with project.db.read() as s, _statements(project.db.engine) as seen:
            again = lane_rows(s, run_id, kept)
        assert all(a is b for a, b in zip(again, first, strict=True))
        assert len(seen) == 1 and "rev" in seen[0] and "footprint" not in seen[0]
        # Three writers: the code's Core UPDATE, an ORM flush, and another process writing with
        # the sqlite3 module (not bmad-loop's code, not SQLAlchemy): each moves its row's rev.
        with project.db.transaction() as s:
            s.execute(update(Story).where(Story.run_id == run_id, Story.seq == 1)
                      .values(wait_reason="a Core UPDATE"))
            s.get(Story, first[1].id).reason = "an ORM flush"
        subprocess.run([sys.executable, "-c", (
            "import sqlite3, sys; conn = sqlite3.connect(sys.argv[1]); "
            "conn.execute(\"UPDATE stories SET state = 'escalated', reason = 'another process' "
            "WHERE seq = 3\"); conn.commit()"), project.db.path], check=True)
        with project.db.read() as s:
            third = lane_rows(s, run_id, kept)
        assert [r.seq for r in third] == [1, 2, 3]
        assert third[0].wait_reason == "a Core UPDATE" and third[0].rev > first[0].rev
        assert third[1].reason == "an ORM flush" and third[1].rev > first[1].rev
        assert (third[2].state, third[2].reason) == ("escalated", "another process")
        with project.db.read() as s:  # and kept again from here on
            fourth = lane_rows(s, run_id, kept)
        assert all(a is b for a, b in zip(fourth, third, strict=True))
    finally:
        project.close()


def test_a_first_pass_reads_all_rows_at_once_and_later_ones_only_the_moved_ids(tmp_path):
    """Many stale rows (a first pass over a long sprint) are one read of the run, not a list of
    ids; a few moved rows are read by id; a story gone from the run leaves the kept rows."""
    from support import state_database

    db = state_database(tmp_path, runs=("r1", "r2"))
    try:
        with db.transaction() as s:
            s.add_all(Story(run_id="r1", key=f"1-{i}-s", seq=i, epic="1", title="t",
                            story_path=f"{i}.md", state="pending") for i in range(1, 81))
        kept: dict = {}
        with db.read() as s, _statements(db.engine) as seen:
            first = lane_rows(s, "r1", kept)
        assert [r.seq for r in first] == list(range(1, 81)) and len(seen) == 2
        assert " IN " not in seen[1].upper()  # the whole run, not 80 ids
        with db.transaction() as s:
            s.execute(update(Story).where(Story.seq.in_((5, 60))).values(wait_reason="moved"))
            s.execute(update(Story).where(Story.seq == 80).values(run_id="r2"))
        with db.read() as s, _statements(db.engine) as seen:
            again = lane_rows(s, "r1", kept)
        assert [r.seq for r in again] == list(range(1, 80))
        assert [r.seq for r in again if r.wait_reason == "moved"] == [5, 60]
        assert len(seen) == 2 and " IN " in seen[1].upper()  # only the two moved rows
        assert all(a is b for a, b in zip(again, first) if a.seq not in (5, 60))
        assert len(kept) == 79  # the row that left the run is not kept
    finally:
        db.dispose()


def test_a_kept_row_keeps_its_admission_view_and_a_row_read_again_gets_a_new_one(tmp_path):
    from support import state_database

    from bmad_loop.engine.lane.admission import views_of
    from bmad_loop.engine.lane.tick import LaneMemo

    db = state_database(tmp_path)
    try:
        with db.transaction() as s:
            s.add_all(Story(run_id="r1", key=f"1-{i}-s", seq=i, epic="1", title="t",
                            story_path=f"{i}.md", state="pending",
                            footprint={"files": [f"src/{i}.py"]}) for i in (1, 2))
        memo = LaneMemo()
        with db.read() as s:
            rows = lane_rows(s, "r1", memo.rows)
        first = memo.views_of(rows)
        assert first == views_of(rows)  # the same answer as building them
        assert all(a is b for a, b in zip(memo.views_of(rows), first))  # kept: not rebuilt
        stacking = memo.views_of(rows, stacking=True)
        assert [v.can_stack for v in stacking] == [True, True] and stacking[0] is not first[0]
        with db.transaction() as s:
            s.execute(update(Story).where(Story.seq == 2).values(footprint={"files": ["b.py"]}))
        with db.read() as s:
            rows = lane_rows(s, "r1", memo.rows)
        again = memo.views_of(rows)
        assert again[0] is first[0]
        assert again[1] is not first[1] and again[1].footprint.files == ("b.py",)
    finally:
        db.dispose()


def test_run_policy_parses_each_snapshot_once_and_keeps_nothing_of_a_bad_one():
    """The lane and every worker ask for the run's policy; one snapshot is one (frozen) object,
    a changed snapshot (a resume with other settings) a new one, and a bad one raises each time."""
    import json

    import pytest

    from bmad_loop.db.models import Run
    from bmad_loop.errors import ConfigError
    from bmad_loop.engine.runrows import run_policy

    snapshot = {"scm": {"max_parallel": 3}, "gates": {"mode": "none"}}
    first = run_policy(Run(id="r-policy", policy=snapshot))
    again = run_policy(Run(id="r-policy", policy=json.loads(json.dumps(snapshot))))
    assert again is first and first.scm.max_parallel == 3
    changed = run_policy(Run(id="r-policy", policy={**snapshot, "scm": {"max_parallel": 2}}))
    assert changed is not first and changed.scm.max_parallel == 2
    for _ in range(2):
        with pytest.raises(ConfigError, match="max_parallel"):
            run_policy(Run(id="r-policy", policy={"scm": {"max_parallel": "many"}}))


def test_a_running_lane_sees_an_approval_another_process_wrote_into_a_row_it_keeps(make_repo, bar):
    """The lane keeps the waiting story's row across passes; `approve`, run as another process,
    changes it. The next passes must read it again (its `rev` moved), or the story would wait
    for an approval it has."""
    from support import StoryDef, barrier_script, go, inside, states, wait_until

    a = StoryDef("1-1-a", files=["src/a.py"])
    b = StoryDef("1-2-b", files=["src/b.py"])
    policy = MERGE_NONE.format(n=1, strategy="merge").replace(
        'mode = "none"', 'mode = "per-story-spec-approval"')
    repo = make_repo([a, b], script=barrier_script([a, b], bar), policy=policy)
    run_id = repo.cli("enqueue").output.strip()
    assert repo.cli("approve", run_id, a.key).exit_code == 0
    proc = repo.spawn("resume", run_id)
    wait_until(lambda: a.key in inside(bar), what="a inside")
    assert repo.story(b.key)["waiting_for"].startswith("awaiting spec approval")
    assert repo.cli("approve", run_id, b.key).exit_code == 0  # this process, not the run's
    go(bar, a.key)
    wait_until(lambda: b.key in inside(bar), what="b starts once approved and a is done")
    go(bar, b.key)
    assert proc.wait(timeout=60) == 0
    assert states(repo) == {a.key: "integrated", b.key: "integrated"}
