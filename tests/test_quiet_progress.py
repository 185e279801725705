"""`run`'s console lines: the waits of one moment as one line per reason listing the stories,
and a story the create phase has not written yet said so, not as a footprint error. The journal
keeps one `story.waiting` per story and the footprint's reason as they were."""

import re

from support import StoryDef, create_step, drop_story_files

SHARED = "src/shared.py"
READY = [StoryDef(f"1-{n}-s{n}", files=[SHARED]) for n in range(1, 5)]  # all on one file: in turn
LATER = StoryDef("1-5-later", files=["src/later.py"], status="backlog")
SCRIPT = {**{s.key: {"dev": [{"append": {SHARED: f"# {s.key}\n"}}]} for s in READY},
          LATER.key: {"create": [create_step(LATER)],
                      "dev": [{"write": {"src/later.py": "LATER = 1\n"}}]}}
LINE = re.compile(r"^\d\d:\d\d:\d\d story\.waiting (?P<keys>.+?)(?: reason=(?P<reason>.*))?$")


def _run(make_repo):
    repo = make_repo([*READY, LATER], script=SCRIPT, policy='[gates]\nmode = "none"\n')
    drop_story_files(repo, LATER.key)
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    return repo, result.output.splitlines()


def test_waits_print_one_line_per_reason_listing_the_stories(make_repo):
    repo, lines = _run(make_repo)
    printed = [LINE.match(line) for line in lines if " story.waiting " in line]
    assert all(printed), lines
    journaled = [(e["story"], e["data"]["reason"]) for e in repo.journal() if e["kind"] == "story.waiting"]
    # The journal is as it was: one event per story and change.
    assert len(journaled) >= 4 and all(story for story, _ in journaled)
    shown = {(key, m["reason"]) for m in printed for key in m["keys"].split(", ")}
    assert set(journaled) <= shown  # every wait is on the console, grouped
    assert len(printed) < len(journaled), lines
    assert any(len(m["keys"].split(", ")) >= 2 for m in printed), lines
    for m in printed:  # never the same story twice in one line
        keys = m["keys"].split(", ")
        assert len(keys) == len(set(keys))


def test_a_story_not_created_yet_is_not_printed_as_a_footprint_problem(make_repo):
    repo, lines = _run(make_repo)
    assert not [line for line in lines if "footprint.exclusive" in line and "reason=missing" in line], lines
    assert any(f"not created yet: {LATER.key}" in line for line in lines), lines
    # The journal keeps the plan's reason for it.
    assert any(e["kind"] == "footprint.exclusive" and e["story"] == LATER.key
               and e["data"]["reason"] == "missing" for e in repo.journal())
