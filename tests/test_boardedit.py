"""Status edits that know the board they make (`board.set_statuses`) agree with a fresh parse.

Every edit is checked against the slow way: `board.set_status` (which reads the YAML itself)
for the text, and a fresh parse of that text for the board.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bmad_loop.bmad.board import _parse_board, parse_board, set_status
from bmad_loop.bmad.board import set_statuses
from bmad_loop.engine.lane.writeback import mark_done_on_board

PATH = Path("sprint-status.yaml")

BOARDS = {
    "plain": "development_status:\n  epic-1: in-progress\n  1-1-a: ready-for-dev\n"
             "  1-2-b: review\n  epic-1-retrospective: optional\n",
    "comments and decorations": "# board\ndevelopment_status:\n  epic-1: backlog  # soon\n"
                                "  1-1-a: Backlog (next)   # first\n  1-2-b: done ✅ (merged)\n",
    "quoted values and keys": "development_status:\n  epic-1: 'in-progress'\n  \"1-1-a\": \"ready-for-dev\"\n"
                              "  1-2-b: 'review'  # q\n",
    "crlf": "development_status:\r\n  epic-1: in-progress\r\n  1-1-a: ready-for-dev\r\n"
            "  1-2-b: in-progress\r\n",
    "flow mapping": "development_status: {epic-1: in-progress, 1-1-a: ready-for-dev, 1-2-b: review}\n",
    "unknown statuses": "development_status:\n  epic-1: planning\n  1-1-a: blocked-on-ux\n"
                        "  1-2-b: '42'\n",
    "tabs and spacing": "development_status:\n    epic-1:   in-progress\n    1-1-a:\tready-for-dev\n"
                        "    1-2-b:  review\t# x\n",
}


def slow(text: str, key: str, status: str):
    new = set_status(text, key, status, PATH)
    return new, _parse_board(new, PATH)


@pytest.mark.parametrize("name", sorted(BOARDS))
@pytest.mark.parametrize("key", ["1-1-a", "1-2-b", "epic-1"])
@pytest.mark.parametrize("status", ["done", "in-progress", "review"])
def test_an_edit_gives_the_text_and_board_of_the_slow_way(name, key, status):
    text = BOARDS[name]
    new, board = set_statuses(text, parse_board(text, PATH), {key: status}, PATH)
    expected_text, expected_board = slow(text, key, status)
    assert new == expected_text
    assert board == expected_board
    assert parse_board(new, PATH) == expected_board


def test_the_quick_way_hands_its_board_to_the_next_parse():
    text = BOARDS["plain"]
    new, board = set_statuses(text, parse_board(text, PATH), {"1-1-a": "done"}, PATH)
    assert parse_board(new, PATH) is board  # remembered, not parsed again
    assert board.entry("1-1-a").status == "done"


def _random_board(rng: random.Random) -> str:
    lines = ["# generated", "development_status:"]
    statuses = ["backlog", "ready-for-dev", "in-progress", "review", "done", "Backlog (next)",
                "done ✅ (merged)", "wont-do", "blocked", "In Progress"]
    for epic in range(1, rng.randint(2, 4)):
        lines.append(f"  epic-{epic}: {rng.choice(['backlog', 'in-progress', 'contexted'])}")
        for n in range(1, rng.randint(2, 6)):
            value = rng.choice(statuses)
            style = rng.random()
            if style < 0.15:
                value = f"'{value}'"
            elif style < 0.3:
                value = f'"{value}"'
            comment = rng.choice(["", "", "  # note", " #x"])
            key = f"{epic}-{n}-s{n}"
            if rng.random() < 0.1:
                key = f'"{key}"'
            lines.append(f"  {key}:{rng.choice([' ', '  ', chr(9)])}{value}{comment}")
        lines.append(f"  epic-{epic}-retrospective: optional")
    return "\n".join(lines) + "\n"


def test_random_boards_and_edits_agree_with_a_fresh_parse():
    rng = random.Random(1515)
    checked = 0
    for _ in range(150):
        text = _random_board(rng)
        board = _parse_board(text, PATH)
        keys = [e.key for e in board.entries]
        for _ in range(4):
            key = rng.choice(keys)
            status = rng.choice(["done", "in-progress", "review", "backlog"])
            new, derived = set_statuses(text, parse_board(text, PATH), {key: status}, PATH)
            expected_text, expected_board = slow(text, key, status)
            assert new == expected_text, (text, key, status)
            assert derived == expected_board, (text, key, status)
            text, checked = new, checked + 1
    assert checked == 600


def test_marking_done_moves_the_epic_as_before():
    text = "development_status:\n  epic-1: backlog\n  1-1-a: review\n  1-2-b: done\n"
    once = mark_done_on_board(text, "1-1-a", "1")
    assert once == "development_status:\n  epic-1: done\n  1-1-a: done\n  1-2-b: done\n"
    started = mark_done_on_board("development_status:\n  epic-1: backlog\n  1-1-a: review\n"
                                 "  1-2-b: ready-for-dev\n", "1-1-a", "1")
    assert "epic-1: in-progress" in started and "1-2-b: ready-for-dev" in started
