"""A story worker that stalled past its lease and lost the story to recovery writes nothing.

Recovery re-queues the story and another worker claims it (the row's `claim` grows); when the
stalled worker wakes up, every write it attempts is refused (Fenced), so it can neither move
the story's phase, nor close attempts as its own, nor escalate someone else's claim.
"""

import pytest

from support import StoryDef
from bmad_loop.db.models import Event, Run, Story
from bmad_loop.engine.project import Project
from bmad_loop.engine.worker.context import Claim, story_context
from bmad_loop.engine.runrows import run_policy
from bmad_loop.engine.worker.walk import Fenced, Outcome, StoryWorker


def test_a_stalled_worker_whose_story_was_reclaimed_is_fenced_out(make_repo):
    repo = make_repo([StoryDef("1-1-a", files=["src/a.py"])])
    run_id = repo.cli("enqueue").output.strip()
    project = Project.open(repo.root)
    with project.db.transaction() as s:
        story = s.query(Story).filter_by(run_id=run_id).one()
        story.state, story.claim = "queued", 1
        story.state = "working"
        run = s.get(Run, run_id)
        policy = run_policy(run)
        ctx = story_context(project, run, story, policy)
    stale = StoryWorker(ctx, Claim(project.db, run_id, story.id, generation=1, owner="host:1:stale",
                                   token=0, ttl_s=policy.leases.ttl_s))
    stale._enter_phase("dev")  # still its own: allowed
    with project.db.transaction() as s:  # recovery + a new claim by another worker
        row = s.get(Story, story.id)
        row.state, row.claim, row.phase = "working", 2, "verify"
        before = s.query(Event).filter_by(run_id=run_id).count()
    with pytest.raises(Fenced):
        stale._enter_phase("review")
    with pytest.raises(Fenced):
        stale._apply(Outcome("commit", counters={"dev_attempts": 1}))
    with pytest.raises(Fenced):
        stale._apply(Outcome("fix", feedback={"verify_output": "stale"}))
    with project.db.transaction() as s:
        row = s.get(Story, story.id)
        assert (row.phase, row.dev_attempts, row.feedback, row.claim) == ("verify", 0, {}, 2)
        assert s.query(Event).filter_by(run_id=run_id).count() == before
