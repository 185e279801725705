"""The sprint board: parsing, key grammar, in-place status edits, locating the board."""

import shutil
import subprocess

import pytest

from bmad_loop.bmad.board import (
    ACTIONABLE,
    STORY_STATUSES,
    branch_name_ok,
    branch_name_problem,
    load_board,
    parse_board,
    set_status,
    validate_story_key,
)
from bmad_loop.errors import ConfigError
from support import SAMPLE_BOARD, STORY_DIR, board_with, write


@pytest.fixture
def sample_board(tmp_path):
    """The sample board written to a real file in a project folder of its own."""
    return write(tmp_path / STORY_DIR / "sprint-status.yaml", SAMPLE_BOARD)


# --- parsing ---


def test_the_sample_board_parses_every_key_with_its_kind(sample_board):
    board = load_board(sample_board)
    kinds = {e.key: e.kind for e in board.entries}
    assert kinds == {
        "epic-1": "epic",
        "1-1-project-scaffold": "story",
        "1-2-user-auth": "story",
        "1-3-password-reset": "story",
        "1-4-audit-log": "story",
        "epic-1-retrospective": "retrospective",
        "epic-2": "epic",
        "2-1-catalog-model": "story",
        "2-2-catalog-api": "story",
        "2-3a-search-index": "story",
        "2-3b-search-ui": "story",
        "epic-2-retrospective": "retrospective",
        "epic-1-retro-item-1-flaky-login-test": "retro-item",
    }
    assert [e.key for e in board.entries] == list(kinds), "file order is kept"
    assert board.path == sample_board


def test_entries_carry_their_epic_status_and_line(sample_board):
    board = load_board(sample_board)
    auth = board.entry("1-2-user-auth")
    assert (auth.status, auth.epic, auth.line) == ("ready-for-dev", "1", 13)
    assert board.entry("epic-1-retro-item-1-flaky-login-test").epic == "1"
    assert board.entry("2-3b-search-ui").epic == "2"
    assert board.entry("nope") is None


def test_stories_are_only_story_keys_in_file_order(sample_board):
    board = load_board(sample_board)
    assert [e.key for e in board.stories()] == [
        "1-1-project-scaffold",
        "1-2-user-auth",
        "1-3-password-reset",
        "1-4-audit-log",
        "2-1-catalog-model",
        "2-2-catalog-api",
        "2-3a-search-index",
        "2-3b-search-ui",
    ]


def test_epic_status_reads_the_epic_entry(sample_board):
    board = load_board(sample_board)
    assert board.epic_status(1) == "in-progress"
    assert board.epic_status(2) == "backlog"
    assert board.epic_status(3) is None


def test_story_location_is_kept_raw(tmp_path):
    text = 'story_location: "{project-root}/_bmad-output/stories"\n' + board_with("epic-1: backlog")
    board = parse_board(text, tmp_path / "sprint-status.yaml")
    assert board.story_location == "{project-root}/_bmad-output/stories"
    assert parse_board(board_with("epic-1: backlog"), tmp_path / "b.yaml").story_location is None


def test_keys_outside_the_grammar_are_extras_and_retros_are_never_stories(tmp_path):
    text = board_with(
        "epic-3: backlog",
        "epic-3-retrospective: done",
        "epic-3-retro-item-2-speed-up-ci: backlog",
        "3-1xy-double-suffix: backlog",
        "3-1AB-upper: backlog",
        "notes: whatever",
        "epic-x: backlog",
        "3-2: backlog",
        "epic-: backlog",
    )
    board = parse_board(text, tmp_path / "sprint-status.yaml")
    assert board.stories() == []
    assert [e.key for e in board.extras()] == [
        "3-1xy-double-suffix",
        "3-1AB-upper",
        "notes",
        "3-2",
        "epic-",
    ]
    assert board.entry("epic-x").kind == "epic", "a letter epic id (was an error before 0.x)"
    assert board.entry("epic-3-retro-item-2-speed-up-ci").kind == "retro-item"


def test_a_split_story_suffix_is_a_single_lower_case_letter(tmp_path):
    board = parse_board(board_with("2-6a-x: backlog", "2-6b-y: backlog", "2-6ab-z: backlog"), tmp_path / "b")
    assert [e.key for e in board.stories()] == ["2-6a-x", "2-6b-y"]
    assert board.entry("2-6ab-z").kind == "extra"


def test_the_old_drafted_status_is_a_valid_actionable_story_status(tmp_path):
    board = parse_board(board_with("epic-1: in-progress", "1-1-a: drafted"), tmp_path / "b.yaml")
    assert board.entry("1-1-a").status == "drafted"
    assert "drafted" in STORY_STATUSES and "drafted" in ACTIONABLE


def test_an_unknown_story_status_is_a_warning_naming_the_key_the_line_and_the_file(tmp_path):
    path = write(tmp_path / "sprint-status.yaml", board_with("1-1-a: doing"))
    board = load_board(path)
    assert board.entry("1-1-a").status == "doing" and not board.entry("1-1-a").known
    assert board.warnings() == [f"{path}: line 2: story '1-1-a' has status 'doing', which "
                                "bmad-loop does not know; it is not run"]


def test_epic_and_retrospective_statuses_are_not_checked_against_story_statuses(tmp_path):
    board = parse_board(board_with("epic-1: contexted", "epic-1-retrospective: optional"), tmp_path / "b")
    assert board.epic_status(1) == "contexted" and board.epic_status("1") == "contexted"
    assert board.warnings() == []


@pytest.mark.parametrize("value", ["[done]", "{a: b}"])
def test_a_status_that_is_not_a_single_value_names_the_key_and_the_file(tmp_path, value):
    path = write(tmp_path / "sprint-status.yaml", board_with(f"1-1-a: {value}"))
    with pytest.raises(ConfigError, match=r"sprint-status\.yaml: key '1-1-a': status is not a single value"):
        load_board(path)


@pytest.mark.parametrize("value, status", [("", ""), ("42", "42"), ("true", "true"), ("null", "null")])
def test_a_scalar_status_that_is_not_a_string_is_an_unknown_status(tmp_path, value, status):
    board = parse_board(board_with(f"1-1-a: {value}"), tmp_path / "sprint-status.yaml")
    assert (board.entry("1-1-a").status, board.entry("1-1-a").known) == (status, False)
    assert len(board.warnings()) == 1


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    path = write(tmp_path / "sprint-status.yaml", "development_status:\n  epic-1: [unclosed\n  1-1-a: done\n")
    with pytest.raises(ConfigError) as info:
        load_board(path)
    message = str(info.value)
    assert message.startswith(f"{path}: invalid YAML")
    assert "\n" not in message


def test_a_missing_board_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"sprint-status\.yaml: sprint status file not found"):
        load_board(tmp_path / "sprint-status.yaml")


@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "not a YAML mapping"),
        ("- a\n- b\n", "not a YAML mapping"),
        ("project: x\n", "no 'development_status' mapping"),
        ("development_status: [a, b]\n", "'development_status' is not a mapping"),
        ("development_status:\n", "'development_status' is not a mapping"),
    ],
)
def test_a_board_without_a_development_status_mapping_is_refused(tmp_path, text, problem):
    path = write(tmp_path / "sprint-status.yaml", text)
    with pytest.raises(ConfigError, match=problem) as info:
        load_board(path)
    assert str(info.value).startswith(str(path))


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    path = write(tmp_path / "sprint-status.yaml", board_with("1-1-a: done", "1-1-a: backlog"))
    with pytest.raises(ConfigError, match=r"key '1-1-a' appears twice \(lines 2 and 3\)"):
        load_board(path)


def test_a_non_string_story_location_is_refused(tmp_path):
    path = write(tmp_path / "sprint-status.yaml", "story_location: [a]\n" + board_with("epic-1: backlog"))
    with pytest.raises(ConfigError, match="'story_location' is not a string"):
        load_board(path)


# --- bad story keys ---


@pytest.mark.parametrize("key", ["1-2-../x", "1-2-a/b", "1-2-a\\\\b", "1-2-..", "1-2-a..b"])
def test_a_story_key_that_could_escape_the_worktree_root_is_refused(tmp_path, key):
    path = write(tmp_path / "sprint-status.yaml", board_with(f'"{key}": backlog'))
    shown = key.replace("\\\\", "\\")
    with pytest.raises(ConfigError) as info:
        load_board(path)
    assert str(info.value) == f"{path}: story '{shown}': key would escape the worktree root"


@pytest.mark.parametrize(
    "key",
    ["1-2-a b", "1-2-a~b", "1-2-a^b", "1-2-a:b", "1-2-a?b", "1-2-a*b", "1-2-a[b", "1-2-a@{b",
     "1-2-a.", "1-2-a.lock", "1-2-a\\tb"],
)
def test_a_story_key_git_refuses_in_a_branch_name_is_refused(tmp_path, key):
    path = write(tmp_path / "sprint-status.yaml", board_with(f'"{key}": backlog'))
    with pytest.raises(ConfigError, match="not a valid git branch name component") as info:
        load_board(path)
    assert str(info.value).startswith(f"{path}: story ")
    assert "\n" not in str(info.value) and "\t" not in str(info.value)


def test_validate_story_key_accepts_ordinary_keys(tmp_path):
    for key in ("1-2-user-auth", "2-3a-search-index", "10-12-a.b_c", "1-1-é-unicode", "1-1-a@b"):
        validate_story_key(key, tmp_path / "b.yaml")


# Keys for the cross-check with git itself (no NUL: it cannot travel in argv).
GIT_CHECK_KEYS = [
    "1-2-ok", "1-2-a.lock", "1-2-a.lock.x", "1-2-a.", "1-2-a..b", "1-2-a b", "1-2-a~b", "1-2-a^b",
    "1-2-a:b", "1-2-a?b", "1-2-a*b", "1-2-a[b", "1-2-a]b", "1-2-a@{b", "1-2-a@b", "1-2-a{b",
    "1-2-a}b", "1-2-a/b", "1-2-a//b", "1-2-a/.b", "1-2-a/b.lock/c", "1-2-a\\b", "1-2-a\tb",
    "1-2-a\x7fb", "1-2-a\x01b", "1-2-é", "1-2-a/", "1-2-.x", "1-2-a-", "1-2-@", "1-2-a'b",
    '1-2-a"b', "1-2-a#b", "1-2-a!b", "1-2-a$b", "1-2-a%b", "1-2-a&b", "1-2-a(b)", "1-2-a+b",
    "1-2-a,b", "1-2-a;b", "1-2-a<b>", "1-2-a=b", "1-2-a|b", "1-2-a`b", "1-2-a/..", "1-2-a/.",
    "1-2-a.b/c", "1-2-x.lock/y", "1-2-\u00a0nbsp", "1-2-a\u2028b",
]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_branch_name_rules_agree_with_git_check_ref_format(tmp_path):
    disagreements = []
    for key in GIT_CHECK_KEYS:
        name = f"bmad-loop/run/{key}"
        git_ok = (
            subprocess.run(
                ["git", "check-ref-format", "--branch", name],
                cwd=tmp_path,
                capture_output=True,
            ).returncode
            == 0
        )
        ours_ok = branch_name_problem(name) is None
        if git_ok != ours_ok:
            disagreements.append((key, git_ok, ours_ok))
    assert disagreements == []


# --- editing the board in place ---


def test_set_status_changes_only_the_status_token(sample_board):
    before = sample_board.read_text()
    after = set_status(before, "1-2-user-auth", "in-progress")
    assert after == before.replace("  1-2-user-auth: ready-for-dev\n", "  1-2-user-auth: in-progress\n")
    assert parse_board(after, sample_board).entry("1-2-user-auth").status == "in-progress"


def test_set_status_keeps_quotes_trailing_comments_and_spacing():
    before = (
        "# header comment\n"
        "development_status:   # the map\n"
        "  epic-1:    'in-progress'   # quoted single\n"
        '  "1-1-a":  "ready-for-dev"  # quoted double\n'
        "  1-2-b: backlog # plain with a comment\n"
        "\n"
        "  # a comment between entries\n"
        "  1-3-c: backlog\n"
    )
    after = set_status(before, "epic-1", "done")
    after = set_status(after, "1-1-a", "review")
    after = set_status(after, "1-2-b", "in-progress")
    assert after == (
        "# header comment\n"
        "development_status:   # the map\n"
        "  epic-1:    'done'   # quoted single\n"
        '  "1-1-a":  "review"  # quoted double\n'
        "  1-2-b: in-progress # plain with a comment\n"
        "\n"
        "  # a comment between entries\n"
        "  1-3-c: backlog\n"
    )


def test_set_status_keeps_crlf_line_endings_and_a_missing_final_newline(tmp_path):
    raw = "development_status:\r\n  1-1-a: backlog\r\n  1-2-b: backlog"
    path = tmp_path / "sprint-status.yaml"
    path.write_bytes(raw.encode())
    board = load_board(path)
    assert board.entry("1-2-b").status == "backlog"
    with open(path, encoding="utf-8", newline="") as fh:
        text = fh.read()
    assert set_status(text, "1-2-b", "done") == "development_status:\r\n  1-1-a: backlog\r\n  1-2-b: done"


def test_set_status_does_not_touch_a_same_named_key_outside_development_status():
    before = "other:\n  1-1-a: backlog\ndevelopment_status:\n  1-1-a: backlog\n"
    assert set_status(before, "1-1-a", "done") == "other:\n  1-1-a: backlog\ndevelopment_status:\n  1-1-a: done\n"


def test_set_status_on_an_absent_key_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"board\.yaml: no key '9-9-x' in development_status"):
        set_status(board_with("1-1-a: backlog"), "9-9-x", "done", source="board.yaml")


def test_set_status_refuses_a_status_that_is_not_one_token():
    with pytest.raises(ValueError):
        set_status(board_with("1-1-a: backlog"), "1-1-a", "done # sneaky")


# Whole branch names (not story keys) for the cross-check of `branch_name_ok` with git itself.
GIT_CHECK_BRANCHES = [
    "main", "a/b/c", "HEAD", "HEAD/x", "x/HEAD", "@", "@/x", "x/@", "@@", "a@", "@a", "a@b", "@{-1}",
    "@{u}", "a@{1}", "x@{", "-", "-x", "x/-y", "a-", ".x", "x.", "a.b", "..", "a..b", "x/..", "a/.",
    "./a", "a/./b", "/a", "a/", "a//b", ".lock", "foo.lock", "a/.lock", "a.lock/b", "a/b.lock",
    "a.loc", "refs/heads/x", "a b", "a\tb", "a~b", "a^b", "a:b", "a?b", "a*b", "a[b", "a]b", "a{b",
    "a\\b", "a\x7fb", "\u00e9", "x/\u2028",
]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_branch_name_ok_agrees_with_git_check_ref_format_on_tricky_names(tmp_path):
    disagreements = []
    for name in GIT_CHECK_BRANCHES:
        proc = subprocess.run(
            ["git", "check-ref-format", "--branch", name], cwd=tmp_path, capture_output=True, text=True
        )
        git_ok = proc.returncode == 0 and proc.stdout == name + "\n"  # not expanded (@{-1})
        if git_ok != branch_name_ok(name):
            disagreements.append((name, git_ok))
    assert disagreements == []
    assert not branch_name_ok("") and not branch_name_ok("a\0b")  # cannot travel in argv


def test_gitcmd_uses_the_same_branch_name_check():
    from bmad_loop.git import runner as gitcmd

    assert gitcmd.branch_name_ok is branch_name_ok
