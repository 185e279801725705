"""The BMAD write-back: a story file's own status (`story_files.read_story_status`), and what the lane writes into
the candidate when a story integrates (the board line, the epic line, the story file)."""

from __future__ import annotations

import pytest

from bmad_loop.engine.lane.writeback import mark_done_on_board, mark_story_file_done
from bmad_loop.bmad.story_files import read_story_status, set_story_status, styled_like

# ------------------------------------------------------------------ the story file's status: every form

V6 = "# Story 1.1: Login\n\nStatus: ready-for-dev\n\n## Story\n\nAs a user...\n"
V4_SECTION = ("# Story 1.2: Logout\n\n## Status\n\nApproved\n\n## Story\n\n"
              "**As a** user,\n\n## Dev Notes\n\nStatus: unrelated\n")
V4_HEADING = "# Story: Brownfield\n\n<!-- Source: docs -->\n\n## Status: Draft\n\n## Story\n"
FRONT = "---\ntitle: Login\nstatus: ready-for-dev   # set by create-story\n---\n# Story 1.1\n"

FORMS = [
    # (text, value, new text after set_story_status(text, "done"))
    (V6, "ready-for-dev", V6.replace("ready-for-dev", "done")),
    (V4_SECTION, "Approved", V4_SECTION.replace("Approved", "Done")),
    (V4_HEADING, "Draft", V4_HEADING.replace("Draft", "Done")),
    (FRONT, "ready-for-dev", FRONT.replace("ready-for-dev", "done")),
    ("---\nTitle: X\nStatus: 'Approved'\n---\n", "Approved", "---\nTitle: X\nStatus: 'Done'\n---\n"),
    ('---\nstatus: "review"\n---\n', "review", '---\nstatus: "done"\n---\n'),
    ("# S\n\n**Status:** Ready for Review\n", "Ready for Review", "# S\n\n**Status:** Done\n"),
    ("# S\n\n**Status**: InProgress\n", "InProgress", "# S\n\n**Status**: Done\n"),
    ("# S\n\nStatus : review\n", "review", "# S\n\nStatus : done\n"),
    ("# S\n\n- Status: in-progress\n", "in-progress", "# S\n\n- Status: done\n"),
    ("# S\n\nstatus: REVIEW\n", "REVIEW", "# S\n\nstatus: DONE\n"),
    ("# S\n## Status\n**Approved**\n## Story\n", "Approved", "# S\n## Status\n**Done**\n## Story\n"),
    ("# S\n\nStatus: review <!-- dev set this -->\n", "review",
     "# S\n\nStatus: done <!-- dev set this -->\n"),
]


@pytest.mark.parametrize("text,value,after", FORMS, ids=[f"form{i}" for i in range(len(FORMS))])
def test_every_form_is_read_and_only_its_value_is_rewritten(text, value, after):
    found = read_story_status(text)
    assert found is not None and found.value == value
    assert text[found.start:found.end] == value
    assert set_story_status(text, "done") == after
    assert set_story_status(after, "done") == after  # idempotent: a second write changes nothing


@pytest.mark.parametrize("text,value,after", FORMS, ids=[f"crlf{i}" for i in range(len(FORMS))])
def test_crlf_line_endings_and_a_bom_survive(text, value, after):
    crlf, want = "\ufeff" + text.replace("\n", "\r\n"), "\ufeff" + after.replace("\n", "\r\n")
    assert read_story_status(crlf).value == value
    assert set_story_status(crlf, "done") == want


def test_trailing_spaces_stay_outside_the_value():
    text = "# S\r\n\r\nStatus: review   \t\r\nrest\r\n"
    assert read_story_status(text).value == "review"
    assert set_story_status(text, "done") == "# S\r\n\r\nStatus: done   \t\r\nrest\r\n"


@pytest.mark.parametrize("text", [
    "# Story 1.1\n\nJust words, no status.\n",
    "",
    "# S\n\n## Story\n\nStatus: mentioned below the head\n",  # not the story's status
    "# S\n\n```\nStatus: in a code block\n```\n",
    "# S\n\n<!--\nStatus: commented out\n-->\n",
    "# S\n\n## Status\n\n## Story\n",  # an empty status section
    "---\ntitle: x\n---\n# S\n",
])
def test_a_file_with_no_status_is_returned_unchanged(text):
    assert read_story_status(text) is None
    assert set_story_status(text, "done") == text  # the lane never inserts a status


def test_front_matter_wins_and_the_body_is_searched_when_it_has_no_status():
    both = "---\nstatus: review\n---\n# S\n\nStatus: ready-for-dev\n"
    assert read_story_status(both).form == "front-matter"
    assert set_story_status(both, "done") == "---\nstatus: done\n---\n# S\n\nStatus: ready-for-dev\n"
    body_only = "---\ntitle: x\n---\n# S\n\nStatus: ready-for-dev\n"
    assert read_story_status(body_only).form == "line"
    assert set_story_status(body_only, "done").endswith("Status: done\n")


def test_a_decorated_value_is_replaced_whole_and_markup_around_it_kept():
    text = "# S\n\n**Status:** `review` ✅ (merged)\n"
    assert read_story_status(text).value == "`review` ✅ (merged)"
    assert set_story_status("# S\n\nStatus: `review`\n", "done") == "# S\n\nStatus: `done`\n"


@pytest.mark.parametrize("old,new", [("ready-for-dev", "done"), ("Approved", "Done"),
                                     ("Ready for Review", "Done"), ("DONE", "DONE"),
                                     ("Draft", "In-Progress"), ("review", "in-progress")])
def test_the_new_value_takes_the_old_case_style(old, new):
    assert styled_like(old, new.lower()) == new


def test_only_the_first_status_in_the_head_changes():
    text = "# S\n\nStatus: review\nStatus: review\n"
    assert set_story_status(text, "done") == "# S\n\nStatus: done\nStatus: review\n"


# ------------------------------------------------------------------ the board: story and epic lines

BOARD = (
    "# sprint board\r\n"
    "development_status:\r\n"
    "  epic-1:   backlog    # the login epic\r\n"
    "  1-1-login:  'ready-for-dev'\r\n"
    "  1-2-logout: \"backlog\"  # later\r\n"
    "  epic-1-retrospective: optional\r\n"
    "  epic-2: contexted\r\n"
    "  2-1-audit: ready-for-dev\r\n"
    "  2-2-purge: wont-do\r\n"
)


def test_the_first_story_of_an_epic_starts_it_and_the_last_finishes_it():
    text = BOARD.replace("  2-2-purge: wont-do\r\n", "")
    first = mark_done_on_board(text, "1-1-login", "1", "b.yaml")
    assert first == (text.replace("1-1-login:  'ready-for-dev'", "1-1-login:  'done'")
                     .replace("epic-1:   backlog ", "epic-1:   in-progress "))
    second = mark_done_on_board(first, "1-2-logout", "1", "b.yaml")
    assert second == (first.replace('1-2-logout: "backlog"', '1-2-logout: "done"')
                      .replace("epic-1:   in-progress ", "epic-1:   done "))
    assert mark_done_on_board(second, "1-2-logout", "1", "b.yaml") == second  # idempotent
    # `contexted` (BMAD's legacy name) goes to `in-progress` or, with its only story, `done`.
    only = mark_done_on_board(text, "2-1-audit", "2", "b.yaml")
    assert "  epic-2: done\r\n" in only and "  2-1-audit: done\r\n" in only
    assert "epic-1:   backlog    # the login epic\r\n" in only  # another epic: untouched


@pytest.mark.parametrize("never", ["wont-do", "won't do", "Cancelled  # by the PO",
                                   "obsolete ❌ (superseded by 2-3)", "done ✅ (merged)"])
def test_a_story_that_will_never_be_done_does_not_keep_its_epic_open(never):
    board = BOARD.replace("2-2-purge: wont-do", f"2-2-purge: {never}")
    after = mark_done_on_board(board, "2-1-audit", "2", "b.yaml")
    assert "  epic-2: done\r\n" in after
    assert f"  2-2-purge: {never}\r\n" in after


@pytest.mark.parametrize("pending", ["blocked", "on-hold", "deferred", "optional", "review",
                                     "backlog  # later"])
def test_a_story_still_to_come_keeps_its_epic_in_progress(pending):
    board = BOARD.replace("2-2-purge: wont-do", f"2-2-purge: {pending}")
    after = mark_done_on_board(board, "2-1-audit", "2", "b.yaml")
    assert "  epic-2: in-progress\r\n" in after and "  2-1-audit: done\r\n" in after


def test_an_epic_already_moved_on_is_not_moved_back_and_a_missing_epic_line_is_fine():
    text = BOARD.replace("  2-2-purge: wont-do\r\n", "").replace("epic-1:   backlog", "epic-1: done")
    after = mark_done_on_board(text, "1-1-login", "1", "b.yaml")
    assert "epic-1: done    # the login epic" in after
    no_epic = text.replace("  epic-2: contexted\r\n", "")
    assert mark_done_on_board(no_epic, "2-1-audit", "2", "b.yaml") == no_epic.replace(
        "2-1-audit: ready-for-dev", "2-1-audit: done")


def test_a_key_not_on_the_board_changes_nothing():
    text = BOARD.replace("  2-2-purge: wont-do\r\n", "")
    assert mark_done_on_board(text, "9-9-ghost", "9", "b.yaml") == text


def test_the_story_file_goes_to_done_in_its_own_style():
    assert mark_story_file_done("# S\r\n\r\n## Status\r\n\r\nApproved\r\n") == \
        "# S\r\n\r\n## Status\r\n\r\nDone\r\n"
    assert mark_story_file_done("# S\n\nnothing\n") == "# S\n\nnothing\n"


# ------------------------------------------------------------------ through the CLI: a real run

import subprocess  # noqa: E402

from support import STORY_DIR, StoryDef  # noqa: E402

RUN_STORIES = [StoryDef("1-1-login", files=["src/login.py"]),
               StoryDef("1-2-logout", files=["src/logout.py"]),
               StoryDef("2-1-audit", files=["src/audit.py"])]

# A board as people keep it: comments, odd spacing, both quotings, other top-level keys, a
# non-actionable story of another epic, and CRLF line endings.
RUN_BOARD = (
    "# Sprint status, kept by hand as well as by sprint-planning\r\n"
    "generated: 2026-01-05\r\n"
    "project:   demo   # the demo\r\n"
    "\r\n"
    "development_status:\r\n"
    "  # --- Epic 1: accounts ---\r\n"
    "  epic-1:    backlog      # login epic\r\n"
    "  1-1-login:   \"ready-for-dev\"\r\n"
    "  1-2-logout:  'ready-for-dev'   # after login\r\n"
    "  epic-1-retrospective: optional\r\n"
    "\r\n"
    "  epic-2: backlog\r\n"
    "  2-1-audit:     ready-for-dev\r\n"
    "  epic-2-retrospective:   optional\r\n"
    "  epic-3: in-progress\r\n"
    "  3-1-later: in-progress   # someone is on it\r\n"
)


def _front(files: list[str]) -> str:
    return "---\r\nfootprint:\r\n  files: [" + ", ".join(f'"{f}"' for f in files) + "]\r\n"


# Story files in three forms (a status line with trailing spaces, a bold status, a status key in
# the front matter), each with a `Status:` mention further down that is not the story's.
RUN_STORY_FILES = {
    "1-1-login": (_front(["src/login.py"]) + "---\r\n# Story 1.1: Login\r\n\r\n"
                  "Status: ready-for-dev  \r\n\r\n## Story\r\n\r\nAs a user, I log in.\r\n\r\n"
                  "## Dev Notes\r\n\r\nStatus: codes are documented elsewhere.\r\n"),
    "1-2-logout": (_front(["src/logout.py"]) + "---\r\n# Story 1.2: Logout\r\n\r\n"
                   "**Status:** ready-for-dev <!-- set by create-story -->\r\n\r\n"
                   "## Story\r\n\r\nStatus: no\r\n"),
    "2-1-audit": (_front(["src/audit.py"]) + "status: ready-for-dev   # front matter\r\n"
                  "---\r\n# Story 2.1: Audit\r\n\r\n## Story\r\n\r\nStatus: no\r\n"),
}


def _blob(repo, ref: str, rel: str) -> bytes:
    return subprocess.run(["git", "show", f"{ref}:{rel}"], cwd=repo.root, capture_output=True,
                          check=True).stdout


def _crlf_project(make_repo, strategy: str):
    script = {s.key: {"dev": [{"write": {s.files[0]: f"NAME = '{s.key}'\n"},
                               "commit": strategy == "ff"}]} for s in RUN_STORIES}
    repo = make_repo(RUN_STORIES, script=script,
                     policy=f'[scm]\nmerge_strategy = "{strategy}"\n[gates]\nmode = "none"\n')
    repo.board.write_bytes(RUN_BOARD.encode())
    for key, text in RUN_STORY_FILES.items():
        (repo.root / STORY_DIR / f"{key}.md").write_bytes(text.encode())
    return repo, repo.commit_all("a board and story files as people keep them")


@pytest.mark.parametrize("strategy", ["merge", "ff"])
def test_a_run_changes_only_the_status_tokens_of_the_board_and_the_story_files(make_repo, strategy,
                                                                             request):
    if strategy == "ff":  # the agent's own commit: only an unboxed agent can commit
        request.getfixturevalue("unboxed")
    repo, start = _crlf_project(make_repo, strategy)
    result = repo.cli("run")
    assert result.exit_code == 0, result.output

    board = _blob(repo, "main", repo.board_rel).decode()
    assert board == (RUN_BOARD
                     .replace('1-1-login:   "ready-for-dev"', '1-1-login:   "done"')
                     .replace("1-2-logout:  'ready-for-dev'", "1-2-logout:  'done'")
                     .replace("2-1-audit:     ready-for-dev", "2-1-audit:     done")
                     .replace("epic-1:    backlog ", "epic-1:    done ")
                     .replace("epic-2: backlog", "epic-2: done"))
    for key, text in RUN_STORY_FILES.items():
        after = _blob(repo, "main", f"{STORY_DIR}/{key}.md").decode()
        assert after == text.replace("ready-for-dev", "done", 1), key
    # Nothing else the lane wrote: the diff names the stories' code, the board and story files.
    changed = repo.git("diff", "--name-only", start, "main").splitlines()
    assert sorted(changed) == sorted([repo.board_rel, *(f"{STORY_DIR}/{k}.md" for k in RUN_STORY_FILES),
                                      *(s.files[0] for s in RUN_STORIES)])


def test_the_epic_line_goes_backlog_in_progress_done_along_the_targets_history(make_repo):
    repo, start = _crlf_project(make_repo, "merge")
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    history = repo.first_parent_trees()
    history = history[[c["sha"] for c in history].index(start):]
    steps = [(repo.board_status("epic-1", c["sha"]), repo.board_status("epic-2", c["sha"]),
              repo.board_status("epic-3", c["sha"])) for c in history]
    assert steps == [("backlog", "backlog", "in-progress"),
                     ("in-progress", "backlog", "in-progress"),   # 1-1-login: first of epic 1
                     ("done", "backlog", "in-progress"),          # 1-2-logout: its last
                     ("done", "done", "in-progress")]             # 2-1-audit: first and last
    # Each story's file says done from its own integration on, not before.
    for index, key in enumerate(["1-1-login", "1-2-logout", "2-1-audit"], start=1):
        path = f"{STORY_DIR}/{key}.md"
        assert b"ready-for-dev" in _blob(repo, history[index - 1]["sha"], path)
        assert b"ready-for-dev" not in _blob(repo, history[index]["sha"], path)


# ------------------------------------------------------------------ the tree edit on real git trees

def test_the_tree_edit_writes_both_files_once_and_skips_what_the_tree_does_not_hold(tmp_path):
    from bmad_loop.git.trees.compose import blob_at
    from bmad_loop.engine.lane.writeback import lane_tree_edit
    from support import git_repo

    board_rel, story_rel = "sprint/sprint-status.yaml", "sprint/1-1-login.md"
    story = "# Story 1.1\r\n\r\n## Status\r\n\r\nApproved\r\n"
    git = git_repo(tmp_path / "r", {board_rel: BOARD, story_rel: story, "README.md": "x\n"})
    tree = git.out("rev-parse", "HEAD^{tree}")
    edit = lane_tree_edit(git, key="1-1-login", epic="1", board_rel=board_rel, story_path=story_rel)

    edited = edit(tree)
    assert blob_at(git, edited, story_rel).decode() == story.replace("Approved", "Done")
    board = blob_at(git, edited, board_rel).decode()
    assert "1-1-login:  'done'\r\n" in board and "epic-1:   in-progress " in board
    assert sorted(git.out("diff-tree", "-r", "--name-only", tree, edited).splitlines()) == [
        story_rel, board_rel]
    # Composing again on an edited tree (a lane that crashed and recomposes) changes nothing.
    assert edit(edited) == edited
    # A story file or board the tree does not hold: nothing to fold in.
    only_readme = git.out("mktree", input=git.out("ls-tree", tree, "README.md") + "\n")
    assert edit(only_readme) == only_readme
    # A v4 run: no board, only the story file.
    v4 = lane_tree_edit(git, key="1.1.login", epic="1", board_rel=None, story_path=story_rel)
    v4_tree = v4(tree)
    assert git.out("diff-tree", "-r", "--name-only", tree, v4_tree) == story_rel
    assert lane_tree_edit(git, key="k", epic=None, board_rel=None, story_path=None) is None


# ------------------------------------------------------------------ a BMAD v4 project (no board)

V4_STORIES = {
    "1.1.login": ("# Story 1.1: Login\r\n\r\n## Status\r\n\r\nApproved\r\n\r\n## Story\r\n\r\n"
                  "**As a** user, **I want** to log in.\r\n"),
    "1.2.logout": "# Story 1.2: Logout\n\n## Status: Approved\n\n## Story\n\nStatus: no\n",
    "1.3.later": "# Story 1.3: Later\n\n## Status\n\nDraft\n",
}


def test_a_v4_run_sets_each_integrated_story_file_from_approved_to_done(tmp_path):
    from support import SprintRepo, init_repo

    root = tmp_path / "v4"
    (root / ".bmad-core").mkdir(parents=True)
    (root / ".bmad-core" / "core-config.yaml").write_text("devStoryLocation: docs/stories\n")
    (root / "docs" / "stories").mkdir(parents=True)
    for key, text in V4_STORIES.items():
        (root / "docs" / "stories" / f"{key}.md").write_bytes(text.encode())
    (root / "src").mkdir()
    (root / "src" / "__init__.py").write_text("")
    (root / ".gitignore").write_text(".bmad-loop/\n")
    init_repo(root)
    repo = SprintRepo(root=root, script_path=tmp_path / "v4-script.json")
    repo.write_script({k: {"dev": [{"write": {f"src/{k.split('.')[2]}.py": f"NAME = '{k}'\n"}}]}
                       for k in V4_STORIES})
    repo.write_policy('[gates]\nmode = "none"\n')
    start = repo.commit_all("a v4 project")
    try:
        result = repo.cli("run")
        assert result.exit_code == 0, result.output
    finally:
        repo.kill_spawned()
    for key, text in V4_STORIES.items():
        after = _blob(repo, "main", f"docs/stories/{key}.md").decode()
        want = text if key == "1.3.later" else text.replace("Approved", "Done")  # Draft: not run
        assert after == want, key
    changed = repo.git("diff", "--name-only", start, "main").splitlines()
    assert sorted(changed) == ["docs/stories/1.1.login.md", "docs/stories/1.2.logout.md",
                               "src/login.py", "src/logout.py"]
