"""Every command that takes a story reads its name the same way: the full key, a short key
`E-S` (its split halves too: then ambiguous), a unique fragment. Unknown or ambiguous is exit 2
with one line."""

import json

import pytest

from support import StoryDef

STORIES = [StoryDef("1-1a-left", files=["src/left.py"]), StoryDef("1-1b-right", files=["src/right.py"]),
           StoryDef("1-2-login", files=["src/login.py"]), StoryDef("1-12-other", files=["src/other.py"])]
SCRIPT = {s.key: {"dev": [{"write": {s.files[0]: f"NAME = '{s.key}'\n"}}]} for s in STORIES}


@pytest.fixture
def finished(make_repo):
    repo = make_repo(STORIES, script=SCRIPT, policy='[gates]\nmode = "none"\n')
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    return repo


def test_journal_story_takes_the_short_key_like_attach_and_retry(finished):
    result = finished.cli("journal", "--story", "1-2", "--json")
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.output.splitlines()]
    assert events and {e["story"] for e in events} == {"1-2-login"}
    assert any(e["kind"] == "story.integrated" for e in events)


@pytest.mark.parametrize("command", [("journal", "--story"), ("attach", "--no-follow"),
                                     ("retry", "--from", "dev")])
def test_a_short_key_with_two_halves_is_ambiguous_and_lists_only_the_halves(finished, command):
    args = [*command, "1-1"] if command[0] != "attach" else ["attach", "1-1", "--no-follow"]
    result = finished.cli(*args)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "ambiguous" in line and "1-1a-left" in line and "1-1b-right" in line
    assert "1-12-other" not in line  # `1-1` is story 1.1, not a fragment of 1-12


@pytest.mark.parametrize("command", [("journal", "--story", "9-9"), ("attach", "9-9", "--no-follow"),
                                     ("retry", "9-9", "--from", "dev")])
def test_an_unknown_story_is_exit_2_with_one_line_naming_it(finished, command):
    result = finished.cli(*command)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "no story '9-9'" in line


def test_the_short_key_of_a_whole_story_is_never_taken_for_a_longer_number(finished):
    result = finished.cli("attach", "1-1b", "--all")
    assert result.exit_code == 0, result.output
    result = finished.cli("journal", "--story", "1-12", "--json")
    assert {json.loads(line)["story"] for line in result.output.splitlines()} == {"1-12-other"}
