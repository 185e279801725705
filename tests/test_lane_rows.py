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
