"""Stories joined with their files, selectors, plan order and dependencies."""

from pathlib import Path

import pytest

from bmad_loop.bmad.board import load_board, parse_board
from bmad_loop.errors import ConfigError
from bmad_loop.bmad.footprint import Footprint
from bmad_loop.bmad.selection import StorySpec, check_dependencies, match_story, select_stories
from bmad_loop.bmad.story_files import load_stories
from support import SAMPLE_BOARD, SAMPLE_STORY, STORY_DIR, board_with, write


@pytest.fixture
def project(tmp_path):
    """A project folder holding the sample board and the sample story, as real files."""
    write(tmp_path / STORY_DIR / "sprint-status.yaml", SAMPLE_BOARD)
    write(tmp_path / STORY_DIR / "1-2-user-auth.md", SAMPLE_STORY)
    return tmp_path


def load(project: Path, overrides=None):
    board = load_board(project / STORY_DIR / "sprint-status.yaml")
    return board, load_stories(project, board, project / STORY_DIR, overrides or {})


def keys(specs):
    return [s.key for s in specs]


def board_of(tmp_path: Path, *lines: str):
    return parse_board(board_with(*lines), tmp_path / "sprint-status.yaml")


# --- load_stories ---


def test_every_story_of_the_board_is_loaded_in_file_order_with_its_position(project):
    _, stories = load(project)
    assert keys(stories) == [
        "1-1-project-scaffold", "1-2-user-auth", "1-3-password-reset", "1-4-audit-log",
        "2-1-catalog-model", "2-2-catalog-api", "2-3a-search-index", "2-3b-search-ui",
    ]
    assert [s.position for s in stories] == list(range(8))
    assert [s.epic for s in stories] == ["1", "1", "1", "1", "2", "2", "2", "2"]


def test_a_story_with_a_file_gets_its_metadata_and_its_own_path_in_the_footprint(project):
    _, stories = load(project)
    auth = stories[1]
    assert auth.title == "User authentication"
    assert auth.status == "ready-for-dev"
    assert auth.story_file == project / STORY_DIR / "1-2-user-auth.md"
    assert auth.story_file.is_absolute()
    assert auth.story_path == f"{STORY_DIR}/1-2-user-auth.md"
    assert auth.footprint == Footprint(
        files=("src/shop/auth/**", "tests/auth/**", f"{STORY_DIR}/1-2-user-auth.md"),
        shared=("src/shop/__init__.py", "CHANGELOG.md"),
        resources=("database",),
    )


def test_a_story_without_a_file_is_missing_and_still_names_its_path(project):
    _, stories = load(project)
    reset = stories[2]
    assert reset.story_file is None
    assert reset.story_path == f"{STORY_DIR}/1-3-password-reset.md"
    assert reset.footprint.reason == "missing" and reset.footprint.exclusive
    assert reset.footprint.files == (f"{STORY_DIR}/1-3-password-reset.md",)
    assert reset.title == "Password reset"


def test_a_story_file_at_the_project_root_is_anchored_in_the_footprint(tmp_path):
    board = board_of(tmp_path, "1-1-a: backlog")
    (spec,) = load_stories(tmp_path, board, tmp_path)
    assert spec.story_path == "1-1-a.md"
    assert spec.footprint.files == ("/1-1-a.md",)


def test_a_policy_override_replaces_the_story_footprint(project):
    overrides = {
        "1-2-user-auth": {"files": ["src/shop/login/**"]},
        "1-3-password-reset": {"files": ["src/shop/reset/**"], "resources": ["smtp"]},
    }
    _, stories = load(project, overrides)
    auth, reset = stories[1], stories[2]
    assert auth.footprint == Footprint(files=("src/shop/login/**", f"{STORY_DIR}/1-2-user-auth.md"))
    assert auth.title == "User authentication", "the rest of the metadata still comes from the file"
    assert reset.footprint == Footprint(
        files=("src/shop/reset/**", f"{STORY_DIR}/1-3-password-reset.md"), resources=("smtp",)
    )


def test_an_invalid_override_is_an_exclusive_footprint(project):
    _, stories = load(project, {"1-2-user-auth": {"files": ["!x"]}})
    assert stories[1].footprint.reason.startswith("invalid: negation")


def test_story_metadata_is_read_from_front_matter(project):
    write(
        project / STORY_DIR / "1-3-password-reset.md",
        "---\ndepends_on: [1-2-user-auth]\nmerge_class: operator\ntier: heavy\ndone_checkpoint: true\n"
        "footprint: {files: [src/shop/reset/**]}\n---\n# Story 1.3: Password reset by mail\n",
    )
    _, stories = load(project)
    reset = stories[2]
    assert reset.depends_on == ("1-2-user-auth",)
    assert (reset.merge_class, reset.tier, reset.done_checkpoint) == ("operator", "heavy", True)
    assert reset.title == "Password reset by mail"


def test_a_metadata_error_in_a_story_file_names_the_file(project):
    path = write(project / STORY_DIR / "1-4-audit-log.md", "---\ndepends_on: {key: 1-1-project-scaffold}\n---\n# S\n")
    with pytest.raises(ConfigError) as info:
        load(project)
    assert str(info.value) == f"{path}: 'depends_on' must be a list of story keys"


# --- selection ---


def test_without_selectors_the_plan_is_every_actionable_story_in_file_order(project):
    board, stories = load(project)
    assert keys(select_stories(stories, board)) == [
        "1-2-user-auth", "1-3-password-reset", "1-4-audit-log",
        "2-1-catalog-model", "2-2-catalog-api", "2-3a-search-index", "2-3b-search-ui",
    ]


def test_the_current_epic_comes_first_then_file_order(tmp_path):
    board = board_of(
        tmp_path,
        "epic-1: done", "1-1-a: backlog",
        "epic-2: backlog", "2-1-b: backlog",
        "epic-3: in-progress", "3-1-c: ready-for-dev", "3-2-d: in-progress", "3-3-e: backlog",
    )
    stories = load_stories(tmp_path, board, tmp_path)
    assert keys(select_stories(stories, board)) == ["3-1-c", "3-3-e", "1-1-a", "2-1-b"]


def test_without_an_in_progress_epic_there_is_no_reordering(tmp_path):
    board = board_of(tmp_path, "epic-2: backlog", "2-1-b: backlog", "epic-1: backlog", "1-1-a: drafted")
    stories = load_stories(tmp_path, board, tmp_path)
    assert keys(select_stories(stories, board)) == ["2-1-b", "1-1-a"]


def test_old_drafted_stories_are_actionable(tmp_path):
    board = board_of(tmp_path, "1-1-a: drafted", "1-2-b: review", "1-3-c: in-progress", "1-4-d: done")
    stories = load_stories(tmp_path, board, tmp_path)
    assert keys(select_stories(stories, board)) == ["1-1-a"]


def test_epic_selects_only_that_epics_actionable_stories(project):
    board, stories = load(project)
    assert keys(select_stories(stories, board, epic=2)) == [
        "2-1-catalog-model", "2-2-catalog-api", "2-3a-search-index", "2-3b-search-ui",
    ]


def test_an_epic_with_nothing_actionable_selects_nothing(tmp_path):
    board = board_of(tmp_path, "epic-1: done", "1-1-a: done", "epic-2: backlog", "2-1-b: backlog")
    stories = load_stories(tmp_path, board, tmp_path)
    assert select_stories(stories, board, epic=1) == []


def test_an_epic_that_is_not_on_the_board_is_an_error(project):
    board, stories = load(project)
    with pytest.raises(ConfigError, match="no epic 9 on the board"):
        select_stories(stories, board, epic=9)


@pytest.mark.parametrize(
    "query, expected",
    [
        ("1-3-password-reset", ["1-3-password-reset"]),
        ("1-3", ["1-3-password-reset"]),
        ("1.3", ["1-3-password-reset"]),
        ("2-3", ["2-3a-search-index", "2-3b-search-ui"]),
        ("2.3", ["2-3a-search-index", "2-3b-search-ui"]),
        ("2-3b", ["2-3b-search-ui"]),
        ("2.3a", ["2-3a-search-index"]),
        ("password", ["1-3-password-reset"]),
        ("search-ui", ["2-3b-search-ui"]),
        ("2-2-cat", ["2-2-catalog-api"]),
        ("  1-2-user-auth  ", ["1-2-user-auth"]),
    ],
)
def test_every_story_query_form_selects_its_stories(project, query, expected):
    board, stories = load(project)
    assert keys(select_stories(stories, board, story=[query])) == expected


def test_repeated_story_queries_are_a_union_in_plan_order(project):
    board, stories = load(project)
    selected = select_stories(stories, board, story=["2-3b", "1.4", "password", "1-4"])
    assert keys(selected) == ["1-3-password-reset", "1-4-audit-log", "2-3b-search-ui"]


def test_a_story_query_with_an_epic_is_the_intersection(project):
    board, stories = load(project)
    assert keys(select_stories(stories, board, epic=2, story=["2-3", "1-3"])) == [
        "2-3a-search-index", "2-3b-search-ui",
    ]
    assert select_stories(stories, board, epic=2, story=["1-3"]) == []


def test_an_ambiguous_fragment_lists_the_candidates(project):
    board, stories = load(project)
    with pytest.raises(ConfigError) as info:
        select_stories(stories, board, story=["catalog"])
    assert str(info.value) == (
        f"{board.path}: story query 'catalog' is ambiguous: 2-1-catalog-model, 2-2-catalog-api"
    )


def test_a_query_that_matches_nothing_names_the_board_and_the_query(project):
    board, stories = load(project)
    for query in ("xyz", "9-9", "2-3c"):
        with pytest.raises(ConfigError) as info:
            select_stories(stories, board, story=[query])
        assert str(info.value) == f"{board.path}: no story matches '{query}'"


def test_a_query_for_a_story_that_is_not_actionable_names_it_and_its_status(project):
    board, stories = load(project)
    with pytest.raises(ConfigError) as info:
        select_stories(stories, board, story=["1-1"])
    assert str(info.value) == f"{board.path}: story 1-1-project-scaffold is done, not actionable"


def test_split_halves_that_are_all_finished_are_named_with_their_statuses(tmp_path):
    board = board_of(tmp_path, "2-3a-x: done", "2-3b-y: review", "2-4a-z: done", "2-4b-w: backlog")
    stories = load_stories(tmp_path, board, tmp_path)
    with pytest.raises(ConfigError, match=r"stories 2-3a-x \(done\), 2-3b-y \(review\) are not actionable"):
        select_stories(stories, board, story=["2-3"])
    assert keys(select_stories(stories, board, story=["2-4"])) == ["2-4b-w"], "the finished half is left out"


def test_retrospectives_are_never_selected(project):
    board, stories = load(project)
    with pytest.raises(ConfigError, match="no story matches 'epic-1-retrospective'"):
        select_stories(stories, board, story=["epic-1-retrospective"])
    with pytest.raises(ConfigError, match="no story matches 'flaky'"):
        select_stories(stories, board, story=["flaky"])


def test_max_stories_truncates_the_ordered_plan(project):
    board, stories = load(project)
    assert keys(select_stories(stories, board, max_stories=2)) == ["1-2-user-auth", "1-3-password-reset"]
    assert keys(select_stories(stories, board, epic=2, max_stories=1)) == ["2-1-catalog-model"]
    assert len(select_stories(stories, board, max_stories=100)) == 7


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_max_stories_below_one_is_an_error(project, bad):
    board, stories = load(project)
    with pytest.raises(ConfigError, match="max_stories must be"):
        select_stories(stories, board, max_stories=bad)


def test_match_story_returns_stories_whatever_their_status(project):
    board, stories = load(project)
    assert keys(match_story(stories, "1.1", board.path)) == ["1-1-project-scaffold"]


# --- dependencies ---


def spec(key: str, status: str = "backlog", depends_on=(), position: int = 0) -> StorySpec:
    return StorySpec(
        key=key, epic=key.split("-")[0], status=status, title=key,
        story_file=Path(f"/p/{key}.md"), story_path=f"s/{key}.md", footprint=Footprint(reason="missing"),
        depends_on=tuple(depends_on), merge_class=None, tier=None, done_checkpoint=False, position=position,
    )


def test_dependencies_on_done_or_earlier_selected_stories_are_fine():
    a = spec("1-1-a", "done")
    b = spec("1-2-b", depends_on=["1-1-a"])
    c = spec("1-3-c", depends_on=["1-2-b", "1-1-a"])
    check_dependencies([a, b, c], [b, c])


def test_an_unknown_dependency_names_the_story_and_the_key():
    b = spec("1-2-b", depends_on=["1-9-nope"])
    with pytest.raises(ConfigError) as info:
        check_dependencies([b], [b])
    assert str(info.value) == "/p/1-2-b.md: story 1-2-b depends on unknown story '1-9-nope'"


def test_a_dependency_cycle_is_named_in_full():
    a = spec("1-2-a", depends_on=["1-3-b"])
    b = spec("1-3-b", depends_on=["1-2-a"])
    c = spec("1-4-c")
    with pytest.raises(ConfigError, match=r"dependency cycle: 1-2-a -> 1-3-b -> 1-2-a$"):
        check_dependencies([a, b, c], [a, b])
    check_dependencies([a, b, c], [c])  # a cycle among stories not selected blocks nothing


def test_a_story_depending_on_itself_is_a_cycle():
    a = spec("1-2-a", depends_on=["1-2-a"])
    with pytest.raises(ConfigError, match=r"dependency cycle: 1-2-a -> 1-2-a$"):
        check_dependencies([a], [a])


def test_a_longer_cycle_behind_a_chain_is_found():
    a = spec("1-1-a", depends_on=["1-2-b"])
    b = spec("1-2-b", depends_on=["1-3-c"])
    c = spec("1-3-c", depends_on=["1-4-d"])
    d = spec("1-4-d", depends_on=["1-2-b"])
    with pytest.raises(ConfigError, match=r"dependency cycle: 1-2-b -> 1-3-c -> 1-4-d -> 1-2-b$"):
        check_dependencies([a, b, c, d], [a, b, c, d])


def test_a_selected_story_depending_on_unfinished_unselected_work_names_both():
    a = spec("1-1-a", "ready-for-dev")
    b = spec("1-2-b", depends_on=["1-1-a"])
    with pytest.raises(ConfigError) as info:
        check_dependencies([a, b], [b])
    assert str(info.value) == "/p/1-2-b.md: story 1-2-b depends on 1-1-a, which is ready-for-dev and not selected"


def test_a_selected_story_depending_on_a_later_story_in_the_plan_is_refused():
    a = spec("1-1-a", depends_on=["1-2-b"])
    b = spec("1-2-b")
    with pytest.raises(ConfigError, match="story 1-1-a depends on 1-2-b, which comes later in the plan"):
        check_dependencies([a, b], [a, b])


def test_dependencies_of_loaded_stories_are_checked_end_to_end(project):
    write(
        project / STORY_DIR / "2-2-catalog-api.md",
        "---\ndepends_on: [2-1-catalog-model]\nfootprint: {files: [src/api/**]}\n---\n# S\n",
    )
    board, stories = load(project)
    check_dependencies(stories, select_stories(stories, board, epic=2))
    with pytest.raises(ConfigError, match="depends on 2-1-catalog-model, which is backlog and not selected"):
        check_dependencies(stories, select_stories(stories, board, story=["2-2"]))
