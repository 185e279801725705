"""A board of many thousand entries: read quickly, and read exactly as before.

Timing note (not asserted; a 2-CPU machine under other load, PyYAML 6.0.4 with libyaml): an
11 MB board of 100,000 keys took 17.5 s in `parse_board` when it composed a node graph with the
pure-Python loader (and 2.7 s with libyaml's composer); walking libyaml's event stream
(`bmad_loop.bmad.board`) takes 1.3 s, and the same text a second time (the lane's next tick) is
answered from the last-parsed cache at once. `validate` plus `enqueue` on the 30,000-key board
below took 29 s, 25 s of it resolving every story file's path through the file system, which
now happens only when the plain path check fails; they take about 5 s together now. These tests
assert behaviour only: that a board that size parses, validates, plans and is edited correctly,
and that the fast reader agrees with the reference one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bmad_loop.bmad.board import parse_board, set_status
from bmad_loop.bmad.board import LOADER, read_board_yaml
from support import StoryDef

EPICS, PER_EPIC = 30, 1000  # 30,000 stories (plus epics and retrospectives)


def big_board(head: list[str]) -> str:
    lines = ["# a long-running project", "development_status:", *head]
    for epic in range(2, EPICS + 2):
        lines.append(f"  epic-{epic}: done  # epic {epic}")
        for story in range(1, PER_EPIC + 1):
            lines.append(f"  {epic}-{story}-a-story-with-a-long-descriptive-slug-{epic}x{story}: done")
        lines.append(f"  epic-{epic}-retrospective: optional")
    return "\n".join(lines) + "\n"


def test_validate_and_enqueue_read_a_board_of_thirty_thousand_stories(make_repo):
    repo = make_repo([StoryDef("1-1-alpha", files=["src/alpha.py"]),
                      StoryDef("1-2-beta", files=["src/beta.py"])])
    repo.board.write_text(big_board(["  epic-1: in-progress", "  1-1-alpha: ready-for-dev",
                                     "  1-2-beta: backlog", "  epic-1-retrospective: optional"]))
    repo.commit_all("a big board")
    assert repo.board.stat().st_size > 1_500_000

    result = repo.cli("validate")
    assert result.exit_code == 0, result.output
    assert f"{EPICS * PER_EPIC + 2} stories, 2 actionable" in result.output

    result = repo.cli("enqueue", "--story", "1-2")
    assert result.exit_code == 0, result.output
    run_id = result.stdout.strip().splitlines()[-1]
    assert [s["key"] for s in repo.status(run_id)["stories"]] == ["1-2-beta"]


def test_a_board_of_thirty_thousand_stories_parses_in_order_with_its_lines_and_edits_one_line():
    text = big_board([])
    board = parse_board(text, Path("sprint-status.yaml"))
    stories = board.stories()
    assert len(stories) == EPICS * PER_EPIC
    assert len(board.entries) == EPICS * (PER_EPIC + 2)
    last = board.entries[-2]
    assert last.key == f"{EPICS + 1}-{PER_EPIC}-a-story-with-a-long-descriptive-slug-{EPICS + 1}x{PER_EPIC}"
    assert text.splitlines()[last.line - 1].strip() == f"{last.key}: done"
    assert [e.line for e in board.entries] == list(range(3, 3 + len(board.entries)))

    edited = set_status(text, last.key, "in-progress")
    changed = [(a, b) for a, b in zip(text.splitlines(), edited.splitlines()) if a != b]
    assert changed == [(f"  {last.key}: done", f"  {last.key}: in-progress")]
    assert parse_board(edited, Path("sprint-status.yaml")).entry(last.key).status == "in-progress"
    # The same text again (the lane's next tick) gives the same, immutable board.
    assert parse_board(text, Path("sprint-status.yaml")) is parse_board(text, Path("sprint-status.yaml"))


MIXED = (
    "\ufeff# héllo ✓ 😀\r\n"
    "story_location: '{project-root}/stories'\r\n"
    "development_status:\r\n"
    "  epic-1: in-progress  # ü\r\n"
    "  1-1-ä-umlaut: \"done\"\r\n"
    "  '1-2-😀-emoji': 'ready-for-dev'\r\n"
    "  1-3-plain: backlog   \r\n"
    "  1-4-tagged: !!str review\r\n"
    "  odd-key: [1, 2]\r\n"
    "  ? [complex, key]\r\n"
    "  : backlog\r\n"
    "other: {development_status: nested}\r\n"
)


@pytest.mark.skipif(LOADER is yaml.SafeLoader, reason="PyYAML was built without libyaml")
def test_the_c_reader_and_the_pure_python_reader_agree_on_keys_values_tags_and_offsets():
    path = Path("b.yaml")
    fast, slow = read_board_yaml(MIXED, path), read_board_yaml(MIXED, path, yaml.SafeLoader)
    assert fast == slow
    assert [k.value for k, _ in fast.pairs][:5] == ["epic-1", "1-1-ä-umlaut", "1-2-😀-emoji",
                                                   "1-3-plain", "1-4-tagged"]
    for key, value in fast.pairs:  # offsets index the Python string, BOM and emoji included
        if value.scalar and value.style is None and not MIXED[value.start:].startswith("!"):
            assert MIXED[value.start:value.end] == value.value


@pytest.mark.parametrize("key, new", [("1-1-ä-umlaut", "review"), ("1-2-😀-emoji", "done"),
                                      ("1-3-plain", "done"), ("1-4-tagged", "done")])
def test_set_status_changes_only_the_status_token_of_a_board_with_bom_crlf_and_emoji(key, new):
    board = MIXED.replace("  odd-key: [1, 2]\r\n  ? [complex, key]\r\n  : backlog\r\n", "")
    edited = set_status(board, key, new, Path("b.yaml"))
    before, after = board.split("\r\n"), edited.split("\r\n")
    assert len(before) == len(after)
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(changed) == 1
    assert after[changed[0]].replace(new, "X", 1).startswith(before[changed[0]].split(":")[0])
    assert parse_board(edited, Path("b.yaml")).entry(key).status == new


def test_anchors_and_aliases_read_as_the_values_they_stand_for():
    plain = "development_status:\n  1-1-a: backlog\n  1-2-b: backlog\nstory_location: s\n"
    aliased = "base: &st backlog\ndevelopment_status:\n  1-1-a: *st\n  1-2-b: *st\nstory_location: s\n"
    a, b = parse_board(plain, Path("b.yaml")), parse_board(aliased, Path("b.yaml"))
    assert [(e.key, e.status) for e in a.entries] == [(e.key, e.status) for e in b.entries]
    assert b.story_location == "s"
