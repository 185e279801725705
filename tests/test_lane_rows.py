"""The lane's rows: integrated and skipped stories are read once, then kept (runs.lane_rows)."""

from __future__ import annotations

from sqlalchemy import update

from bmad_loop.db.models import Story
from bmad_loop.engine.project import Project
from bmad_loop.engine.runs import lane_rows
from bmad_loop.policy import load_policy
from support import ALPHA_BETA_GAMMA, MERGE_NONE, query, write_each


def test_settled_rows_are_kept_and_the_rest_read_fresh_in_plan_order(make_repo):
    repo = make_repo(ALPHA_BETA_GAMMA, script=write_each(ALPHA_BETA_GAMMA),
                     policy=MERGE_NONE.format(n=1, strategy="merge"))
    assert repo.cli("run").exit_code == 0
    run_id = query(repo, "SELECT id FROM runs")[0][0]
    project = Project(root=repo.root, policy=load_policy(repo.root))
    try:
        kept: dict = {}
        with project.db.transaction() as s:
            plain = lane_rows(s, run_id)
            first = lane_rows(s, run_id, kept)
        assert first == plain and [r.key for r in first] == [st.key for st in ALPHA_BETA_GAMMA]
        assert sorted(kept) == sorted(r.id for r in plain)  # all three integrated: kept
        # A kept row is not read again (its stored copy answers), a story that is not
        # settled for good is.
        with project.db.transaction() as s:
            s.execute(update(Story).where(Story.run_id == run_id, Story.seq == 1)
                      .values(wait_reason="edited behind the lane"))
            s.execute(update(Story).where(Story.run_id == run_id, Story.seq == 3)
                      .values(state="escalated", reason="for the test"))
        with project.db.transaction() as s:
            again = lane_rows(s, run_id, kept)
        assert [r.seq for r in again] == [1, 2, 3]
        assert again[0].wait_reason is None            # kept: integrated rows never change
        assert again[2].state == "escalated"           # no longer settled: read fresh
    finally:
        project.close()


def test_run_policy_parses_each_snapshot_once_and_keeps_nothing_of_a_bad_one():
    """The lane and every worker ask for the run's policy; one snapshot is one (frozen) object,
    a changed snapshot (a resume with other settings) a new one, and a bad one raises each time."""
    import json

    import pytest

    from bmad_loop.db.models import Run
    from bmad_loop.errors import ConfigError
    from bmad_loop.engine.runs import run_policy

    snapshot = {"scm": {"max_parallel": 3}, "gates": {"mode": "none"}}
    first = run_policy(Run(id="r-policy", policy=snapshot))
    again = run_policy(Run(id="r-policy", policy=json.loads(json.dumps(snapshot))))
    assert again is first and first.scm.max_parallel == 3
    changed = run_policy(Run(id="r-policy", policy={**snapshot, "scm": {"max_parallel": 2}}))
    assert changed is not first and changed.scm.max_parallel == 2
    for _ in range(2):
        with pytest.raises(ConfigError, match="max_parallel"):
            run_policy(Run(id="r-policy", policy={"scm": {"max_parallel": "many"}}))
