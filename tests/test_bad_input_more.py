"""More bad input and a broken environment: exit 2, one line naming the file, key or story, and
nothing created.

"Nothing created" is checked strictly here: the listing of `.bmad-loop/` is the same before and
after (so no `state.db`, `queue.db`, `-wal`/`-shm` file, lock file or `.gitignore` appeared), a
damaged database file keeps its exact bytes, and there are no new rows, refs or worktrees. Every
case runs the real CLI against a real repository: in process (`repo.cli`), or as a child process
when a module must be missing (`sys.modules[name] = None` before `bmad_loop.cli.main`), when
another process must hold a lock, or when the state folder must be read-only.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from support import StoryDef, agent_command, cli_argv, git, init_repo

TWO = [
    StoryDef("1-1-alpha", files=["src/alpha.py"]),
    StoryDef("1-2-beta", files=["src/beta.py"]),
]
ENTRY_POINTS = ["run", "enqueue"]
WITH_VALIDATE = ENTRY_POINTS + ["validate"]


# ------------------------------------------------------------------------------ helpers
def listing(folder: Path) -> dict[str, int]:
    """Every file under `folder` with its size ({} when the folder does not exist)."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))}


def run_rows(root: Path) -> list[tuple]:
    path = root / ".bmad-loop" / "state.db"
    if not path.exists() or path.stat().st_size < 100:
        return []
    try:
        with sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True) as conn:  # no -shm
            return conn.execute("SELECT id, state FROM runs ORDER BY id").fetchall()
    except sqlite3.DatabaseError:
        return []  # a file a test damaged on purpose


class Snapshot:
    """What a refused command must leave as it was: files, rows, refs, worktrees."""

    def __init__(self, root: Path):
        self.root = root
        self.files = listing(root / ".bmad-loop")
        self.rows = run_rows(root)
        self.refs = git(root, "for-each-ref", "--format=%(refname) %(objectname)", check=False)
        self.worktrees = git(root, "worktree", "list", "--porcelain", check=False)

    def assert_unchanged(self):
        after = Snapshot(self.root)
        assert after.files == self.files, "a refused command created or changed files"
        assert after.rows == self.rows, "a refused command wrote rows"
        assert after.refs == self.refs, "a refused command moved or made refs"
        assert after.worktrees == self.worktrees, "a refused command made worktrees"


def one_line(result, *needles: str) -> str:
    """Exit 2 with exactly one line on stderr, naming every needle."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got: {result.stderr!r}"
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not named in: {lines[0]}"
    return lines[0]


def refused(repo, *args: str, needles=(), result=None) -> str:
    """Run `bmad-loop ARGS` (or take `result`) and check: exit 2, one line, nothing changed."""
    before = Snapshot(repo.root)
    result = result or repo.cli(*args)
    line = one_line(result, *needles)
    before.assert_unchanged()
    return line


def validate_fails(repo, *needles: str) -> str:
    before = Snapshot(repo.root)
    result = repo.cli("validate")
    assert result.exit_code == 2, result.output
    failed = [line for line in result.output.splitlines() if line.startswith("FAIL")]
    assert failed, f"validate reported no failure:\n{result.output}"
    matching = [line for line in failed if all(n in line for n in needles)]
    assert matching, f"no FAIL line names {needles}: {failed}"
    before.assert_unchanged()
    return matching[0]


def check(repo, command: str, *needles: str) -> None:
    if command == "validate":
        validate_fails(repo, *needles)
    else:
        refused(repo, command, needles=needles)


def child(argv: list[str], *, hide: tuple[str, ...] = (), env: dict | None = None,
          timeout: float = 120) -> SimpleNamespace:
    """`bmad-loop ARGV` in a child process whose Python cannot import the `hide` modules."""
    code = ("import sys\n"
            "for name in sys.argv[1].split(','):\n"
            "    if name:\n"
            "        sys.modules[name] = None  # `import name` now raises ImportError\n"
            "sys.argv = ['bmad-loop'] + sys.argv[2:]\n"
            "from bmad_loop.cli import main\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code, ",".join(hide), *argv],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return SimpleNamespace(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr,
                           output=proc.stdout + proc.stderr)


def in_process(command: str, project: Path):
    """`bmad-loop COMMAND --project PROJECT` in this process, for a folder that is no SprintRepo."""
    from click.testing import CliRunner

    from bmad_loop.cli import cli

    return CliRunner().invoke(cli, [command, "--project", str(project)], catch_exceptions=False)


def on(repo, *args: str) -> list[str]:
    return [args[0], "--project", str(repo.root), *args[1:]]


def real_state(repo) -> None:
    """A real run in a real state database and queue, written by a child process that exits
    (so SQLite has checkpointed its WAL and the files stand alone)."""
    proc = subprocess.run(cli_argv(*on(repo, "enqueue")), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    state = repo.root / ".bmad-loop"
    assert (state / "state.db").exists() and (state / "queue.db").exists()
    assert not (state / "state.db-wal").exists(), "the child left its WAL behind"


# ------------------------------------------------------------------------------ 1. placeholders
BAD_PLACEHOLDERS = {
    "adapter": ('command = ["{agent}", "{{nope}}"]\n', "[adapter] command", "{nope}"),
    "phase": ('command = ["{agent}"]\n[adapter.review]\ncommand = ["{agent}", "--x={{storykey}}"]\n',
              "[adapter.review] command", "{storykey}"),
    "tier": ('command = ["{agent}"]\n[adapter.tiers.deep]\nargs = ["--model", "{{modle}}"]\n',
             "[adapter.tiers.deep] args", "{modle}"),
}


@pytest.mark.parametrize("where", sorted(BAD_PLACEHOLDERS))
@pytest.mark.parametrize("command", WITH_VALIDATE)
def test_an_unknown_placeholder_in_the_agent_argv_is_refused_naming_the_key(make_repo, command, where):
    repo = make_repo(TWO)
    body, key, placeholder = BAD_PLACEHOLDERS[where]
    repo.write_policy("[adapter]\n" + body.format(agent=agent_command(repo.script_path)[0]))
    check(repo, command, "policy.toml", key, placeholder, "unknown placeholder")


def test_known_placeholders_and_other_braces_are_accepted(make_repo):
    repo = make_repo(TWO)
    argv = agent_command(repo.script_path) + ["{model}", '{"json": 1}', "{}", "--task={prompt_file}"]
    repo.write_policy(f"[adapter]\ncommand = {json.dumps(argv)}\n"
                      '[adapter.tiers.deep]\nargs = ["--tier={tier}"]\n')
    result = repo.cli("validate")
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------------------ 2, 3. [scm] paths and globs
@pytest.mark.parametrize("seed", ["/etc/passwd", "../secret.env", "config/../../x", "~/.ssh/id_rsa",
                                  ".", ".bmad-loop/state.db", ".git/config"])
@pytest.mark.parametrize("command", WITH_VALIDATE)
def test_a_worktree_seed_outside_the_repository_is_refused_naming_it(make_repo, command, seed):
    repo = make_repo(TWO, policy=f"[scm]\nworktree_seed = [\".env\", {json.dumps(seed)}]\n")
    check(repo, command, "policy.toml", "[scm] worktree_seed", seed)


@pytest.mark.parametrize("glob", ["!docs/CHANGELOG.md", "/abs/../x", "a\\\\b"])
@pytest.mark.parametrize("command", WITH_VALIDATE)
def test_an_invalid_lane_owned_glob_is_refused_naming_it(make_repo, command, glob):
    repo = make_repo(TWO, policy=f'[scm]\nlane_owned = ["docs/ok.md", "{glob}"]\n')
    check(repo, command, "policy.toml", "[scm] lane_owned", "invalid glob")


def test_a_negated_lane_owned_glob_says_negation(make_repo):
    repo = make_repo(TWO, policy='[scm]\nlane_owned = ["!docs/CHANGELOG.md"]\n')
    line = refused(repo, "enqueue")
    assert "negation" in line and "!docs/CHANGELOG.md" in line


def test_seeds_and_lane_owned_globs_inside_the_repository_are_accepted(make_repo):
    repo = make_repo(TWO, policy='[scm]\nworktree_seed = [".env", "config/local.yaml"]\n'
                                 'lane_owned = ["docs/CHANGELOG.md", "_bmad-output/**/retro*.md"]\n')
    result = repo.cli("validate")
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------------------ 4. story_dir
@pytest.mark.parametrize("story_dir", ["../elsewhere", "{project-root}/../elsewhere", "/"])
@pytest.mark.parametrize("command", WITH_VALIDATE)
def test_a_story_dir_outside_the_repository_is_refused_naming_the_key(make_repo, command, story_dir):
    repo = make_repo(TWO, policy=f"[stories]\nstory_dir = {json.dumps(story_dir)}\n")
    check(repo, command, "policy.toml", "[stories] story_dir", "outside the repository")


def test_a_story_dir_inside_the_repository_is_accepted(make_repo):
    repo = make_repo(TWO, policy='[stories]\nstory_dir = "{project-root}/_bmad-output/implementation-artifacts"\n')
    result = repo.cli("validate")
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------------------ 5. huge integers
HUGE = "99999999999999999999999"


@pytest.mark.parametrize("policy, key", [
    (f"[scm]\nmax_parallel = {HUGE}\n", "[scm] max_parallel"),
    (f"[resources]\ngpu = {HUGE}\n", "[resources] gpu"),
    (f"[limits]\nmax_dev_attempts = -{HUGE}\n", "[limits] max_dev_attempts"),
    (f"[cleanup]\nkeep_runs = {HUGE}\n", "[cleanup] keep_runs"),
])
@pytest.mark.parametrize("command", WITH_VALIDATE + ["history"])
def test_an_integer_past_64_bits_is_refused_naming_the_key(make_repo, command, policy, key):
    repo = make_repo(TWO, policy=policy)
    if command == "history":  # a read command reads on, warning once (test_broken_policy_reads)
        before = Snapshot(repo.root)
        result = repo.cli(command)
        assert result.exit_code == 0 and "64-bit" in result.stderr and key in result.stderr
        before.assert_unchanged()
        return
    check(repo, command, "policy.toml", key, "64-bit")


@pytest.mark.parametrize("policy, key", [
    ("[leases]\nttl_s = 9223372036854775807\n", "[leases] ttl_s"),
    ("[verify]\ntimeout_s = 4000000000\n", "[verify] timeout_s"),
    ("[adapter.tiers.deep]\ntimeout_s = 9000000000000\n", "[adapter.tiers.deep] timeout_s"),
])
@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_a_duration_that_would_overflow_time_arithmetic_is_refused(make_repo, command, policy, key):
    repo = make_repo(TWO, policy=policy)
    check(repo, command, "policy.toml", key, "must be <= 1000000000")


@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_a_max_parallel_no_machine_could_run_is_refused_not_attempted(make_repo, command):
    # 10**9 fits in 64 bits, but `run` would try to start 10**9 consumer threads (it hung).
    repo = make_repo(TWO, policy="[scm]\nmax_parallel = 1000000000\n")
    check(repo, command, "policy.toml", "[scm] max_parallel", "must be <= 1024")
    repo.write_policy("")
    refused(repo, command, "--parallel", "5000", needles=("--parallel", "must be <= 1024"))


@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_a_huge_integer_from_the_environment_or_the_command_line_is_refused(make_repo, monkeypatch, command):
    repo = make_repo(TWO)
    refused(repo, command, "--parallel", HUGE, needles=("--parallel", "64-bit"))
    monkeypatch.setenv("BMAD_LOOP_VERIFY_TIMEOUT_S", HUGE)
    refused(repo, command, needles=("BMAD_LOOP_VERIFY_TIMEOUT_S", "[verify] timeout_s", "64-bit"))


# ------------------------------------------------------------------------------ 6. missing drivers
POSTGRES = 'url = "postgresql+psycopg://nobody@127.0.0.1:1/none"'


@pytest.mark.parametrize("url", [POSTGRES, 'url = "postgresql://nobody@127.0.0.1:1/none"'])
@pytest.mark.parametrize("command", ["status", "history", "enqueue", "run", "init"])
def test_a_postgres_url_without_psycopg_says_which_extra_to_install(make_repo, command, url):
    repo = make_repo(TWO, policy=f"[database]\n{url}\n")
    result = child(on(repo, command), hide=("psycopg", "psycopg2"))
    refused(repo, result=result, needles=("policy.toml", "[database] url",
                                          "install bmad-loop[postgres]"))


def test_validate_reports_a_missing_postgres_driver(make_repo):
    repo = make_repo(TWO, policy=f"[database]\n{POSTGRES}\n")
    result = child(on(repo, "validate"), hide=("psycopg",))
    assert result.exit_code == 2, result.output
    assert any(line.startswith("FAIL state:") and "install bmad-loop[postgres]" in line
               for line in result.stdout.splitlines()), result.output


@pytest.mark.parametrize("command", ["enqueue", "run", "stop", "resume", "worker"])
def test_a_redis_queue_without_the_redis_module_says_which_extra_to_install(make_repo, command):
    repo = make_repo(TWO)
    if command in ("stop", "resume"):  # these need a run: one made with the default queue
        real_state(repo)
    repo.write_policy('[queue]\nbackend = "redis"\nurl = "redis://127.0.0.1:1/0"\n')
    result = child(on(repo, command), hide=("redis",))
    refused(repo, result=result, needles=("policy.toml", '[queue] backend = "redis"',
                                          "install bmad-loop[redis]"))


def test_validate_reports_a_missing_redis_module(make_repo):
    repo = make_repo(TWO, policy='[queue]\nbackend = "redis"\nurl = "redis://127.0.0.1:1/0"\n')
    result = child(on(repo, "validate"), hide=("redis",))
    assert result.exit_code == 2, result.output
    assert any(line.startswith("FAIL state:") and "install bmad-loop[redis]" in line
               for line in result.stdout.splitlines()), result.output


# ------------------------------------------------------------------------------ 7. damaged databases
def garbage(path: Path) -> bytes:
    data = os.urandom(16384)
    path.write_bytes(data)
    return data


def cut_in_half(path: Path, *, page_aligned: bool) -> bytes:
    data = path.read_bytes()
    half = len(data) // 2
    if page_aligned:
        half -= half % 4096
    else:
        half += 1 if half % 4096 == 0 else 0
    path.write_bytes(data[:half])
    return data[:half]


STATE_COMMANDS = ["status", "journal", "history", "sql", "reconcile", "resume", "stop",
                  "enqueue", "run", "init"]


def _sql_args(command: str) -> tuple[str, ...]:
    return ("sql", "SELECT 1") if command == "sql" else (command,)


@pytest.mark.parametrize("command", STATE_COMMANDS)
def test_a_state_db_of_random_bytes_is_refused_naming_it_and_left_untouched(make_repo, command):
    repo = make_repo(TWO)
    path = repo.root / ".bmad-loop" / "state.db"
    data = garbage(path)
    refused(repo, *_sql_args(command), needles=(str(path), "not a SQLite database"))
    assert path.read_bytes() == data


@pytest.mark.parametrize("page_aligned", [True, False], ids=["at-a-page", "mid-page"])
@pytest.mark.parametrize("command", ["status", "history", "enqueue", "resume", "sql"])
def test_a_state_db_cut_in_half_is_refused_naming_it_and_left_untouched(make_repo, command, page_aligned):
    repo = make_repo(TWO)
    real_state(repo)
    path = repo.root / ".bmad-loop" / "state.db"
    data = cut_in_half(path, page_aligned=page_aligned)
    refused(repo, *_sql_args(command), needles=(str(path), "truncated"))
    assert path.read_bytes() == data


@pytest.mark.parametrize("damage", ["garbage", "cut"])
@pytest.mark.parametrize("command", ["enqueue", "run", "stop", "resume", "worker"])
def test_a_damaged_queue_db_is_refused_naming_it_and_left_untouched(make_repo, command, damage):
    repo = make_repo(TWO)
    real_state(repo)
    path = repo.root / ".bmad-loop" / "queue.db"
    data = garbage(path) if damage == "garbage" else cut_in_half(path, page_aligned=False)
    if command == "worker":  # a real consumer process; it must refuse before it starts
        result = child(on(repo, "worker"), timeout=60)
    else:
        result = repo.cli(command)
    refused(repo, result=result, needles=(str(path), "queue database"))
    assert path.read_bytes() == data


def test_validate_reports_a_damaged_state_db_and_queue_db(make_repo):
    repo = make_repo(TWO)
    garbage(repo.root / ".bmad-loop" / "state.db")
    validate_fails(repo, "state.db", "not a SQLite database")
    (repo.root / ".bmad-loop" / "state.db").unlink()
    garbage(repo.root / ".bmad-loop" / "queue.db")
    validate_fails(repo, "queue.db", "not a SQLite database")


# ------------------------------------------------------------------------------ 8. a locked database
HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()  # hold it until the test closes our stdin
"""


@pytest.mark.parametrize("command", ["status", "history", "enqueue", "stop", "resume"])
def test_a_state_db_locked_by_another_process_is_waited_for_then_refused_in_one_line(make_repo, command):
    repo = make_repo(TWO, policy="[database]\nlock_wait_s = 1\n")
    real_state(repo)
    path = repo.root / ".bmad-loop" / "state.db"
    before = Snapshot(repo.root)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        result = child(on(repo, command))
        waited = time.monotonic() - started
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    one_line(result, str(path), "locked by another process", "lock_wait_s")
    assert 1.0 <= waited < 30, waited  # it waited [database] lock_wait_s, then gave up
    before.assert_unchanged()  # (the holder, gone, took its -wal and -shm with it)


# ------------------------------------------------------------------------------ 9. a read-only state folder
def _read_only_runner(tmp_path: Path):
    """How to run a child with `.bmad-loop` read-only, or (None, why not).

    Not root: chmod 555 stops writes. Root ignores permissions, so there the folder is bind-mounted
    read-only onto itself inside a private mount namespace of the child (`unshare --mount`), which
    needs CAP_SYS_ADMIN; the mount dies with the child, and nothing leaks to other tests."""
    if os.geteuid() != 0:
        return "chmod", None
    probe = tmp_path / "ro-probe"
    probe.mkdir()
    script = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" "$1" && ! touch "$1/x" 2>/dev/null'
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                               "sh", str(probe)], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"running as root (chmod does not stop root) and unshare failed: {exc}"
    if proc.returncode != 0:
        return None, ("running as root (chmod does not stop root) and a read-only bind mount is "
                      f"not possible here: {proc.stderr.decode(errors='replace').strip()}")
    return "mount", None


def read_only_child(repo, argv: list[str], how: str) -> SimpleNamespace:
    state = repo.root / ".bmad-loop"
    if how == "chmod":
        state.chmod(0o555)
        try:
            return child(argv)
        finally:
            state.chmod(0o755)
    script = ('mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" "$1" && shift && exec "$@"')
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                           str(state), *cli_argv(*argv)], capture_output=True, text=True, timeout=120)
    return SimpleNamespace(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr,
                           output=proc.stdout + proc.stderr)


@pytest.mark.parametrize("command, existing", [
    ("enqueue", False), ("run", False), ("init", False),  # a fresh folder: only policy.toml
    ("enqueue", True), ("run", True), ("init", True), ("status", True), ("stop", True),
])
def test_a_read_only_state_folder_is_refused_in_one_line_naming_it(make_repo, tmp_path, command, existing):
    how, why_not = _read_only_runner(tmp_path)
    if how is None:
        pytest.skip(why_not)
    repo = make_repo(TWO)
    if existing:
        real_state(repo)
    before = Snapshot(repo.root)
    result = read_only_child(repo, on(repo, command), how)
    line = one_line(result, str(repo.root / ".bmad-loop"), "not writable")
    assert ("read-only file system" if how == "mount" else "permission denied") in line
    before.assert_unchanged()


# ------------------------------------------------------------------------------ 10. bare and empty repositories
@pytest.mark.parametrize("command", WITH_VALIDATE)
def test_a_bare_repository_is_refused_naming_it_as_bare(make_repo, tmp_path, command):
    repo = make_repo(TWO)
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo.root), str(bare))
    (bare / ".bmad-loop").mkdir()
    (repo.root / ".bmad-loop" / "policy.toml").rename(bare / ".bmad-loop" / "policy.toml")
    refs = git(bare, "for-each-ref")
    result = in_process(command, bare)
    if command == "validate":
        assert result.exit_code == 2, result.output
        assert any(line.startswith("FAIL git:") and "a bare repository" in line
                   for line in result.output.splitlines()), result.output
    else:
        one_line(result, str(bare), "a bare repository")
    assert sorted(p.name for p in (bare / ".bmad-loop").iterdir()) == ["policy.toml"]
    assert git(bare, "for-each-ref") == refs


@pytest.mark.parametrize("command", WITH_VALIDATE)
def test_an_empty_repository_is_refused_naming_it_as_empty(make_repo, tmp_path, command):
    repo = make_repo(TWO)
    empty = init_repo(tmp_path / "empty")
    for path in repo.root.rglob("*"):  # the same board, stories and policy, never committed
        rel = path.relative_to(repo.root)
        if rel.parts[0] == ".git" or path.is_dir():
            continue
        (empty / rel).parent.mkdir(parents=True, exist_ok=True)
        (empty / rel).write_bytes(path.read_bytes())
    before = listing(empty / ".bmad-loop")
    result = in_process(command, empty)
    if command == "validate":
        assert result.exit_code == 2, result.output
        assert any(line.startswith("FAIL git:") and "an empty repository" in line
                   for line in result.output.splitlines()), result.output
    else:
        one_line(result, str(empty), "an empty repository", "no commits")
    assert listing(empty / ".bmad-loop") == before
    assert git(empty, "for-each-ref") == ""


# ------------------------------------------------------------------------------ 11. a relative agent path
def _tool(repo, mode: int = 0o755) -> Path:
    tool = repo.root / "tools" / "agent.sh"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(mode)
    return tool


@pytest.mark.parametrize("command", WITH_VALIDATE)
def test_a_relative_agent_path_not_committed_is_refused_naming_it(make_repo, command):
    repo = make_repo(TWO)
    repo.write_policy('[adapter]\ncommand = ["./tools/agent.sh"]\n')
    _tool(repo)  # there in the checkout, absent from every worktree
    check(repo, command, "policy.toml", "./tools/agent.sh", "not committed")


def test_a_relative_agent_path_committed_without_its_executable_bit_is_refused(make_repo):
    repo = make_repo(TWO)
    repo.write_policy('[adapter]\ncommand = ["./tools/agent.sh"]\n')
    _tool(repo, 0o644)
    repo.commit_all("a tool, not executable")
    validate_fails(repo, "./tools/agent.sh", "executable bit")


def test_a_relative_agent_path_committed_or_seeded_is_accepted(make_repo):
    repo = make_repo(TWO)
    repo.write_policy('[scm]\nworktree_seed = ["tools"]\n[adapter]\ncommand = ["./tools/agent.sh"]\n')
    _tool(repo)
    result = repo.cli("validate")  # seeded: copied into each worktree
    assert result.exit_code == 0, result.output
    repo.write_policy('[adapter]\ncommand = ["./tools/agent.sh"]\n')
    repo.commit_all("the agent")
    result = repo.cli("validate")
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------------------ nothing created for reads
@pytest.mark.parametrize("args", [("status", "nosuchrun"), ("journal", "nosuchrun"),
                                  ("reconcile", "nosuchrun"), ("resume", "nosuchrun"),
                                  ("stop", "nosuchrun"), ("abandon", "nosuchrun"),
                                  ("approve", "nosuchrun", "1-1-alpha"), ("status",),
                                  ("sql", "SELECT 1"), ("attach", "nosuchrun")])
def test_a_read_or_an_unknown_run_id_creates_no_database_or_queue(make_repo, args):
    repo = make_repo(TWO)
    line = refused(repo, *args)
    # `attach X`: a lone argument naming no run may name a story of the newest run.
    named = "nosuchrun" in args and args[0] != "attach"
    assert ("nosuchrun" in line) if named else ("no runs yet" in line)
    assert not (repo.root / ".bmad-loop" / "state.db").exists()


def test_history_without_runs_creates_nothing(make_repo):
    repo = make_repo(TWO)
    before = Snapshot(repo.root)
    result = repo.cli("history")
    assert result.exit_code == 0 and "no runs yet" in result.output
    before.assert_unchanged()


def test_an_unknown_run_id_with_runs_on_record_creates_no_queue(make_repo):
    repo = make_repo(TWO)
    real_state(repo)
    (repo.root / ".bmad-loop" / "queue.db").unlink()
    for args in (("resume", "nosuchrun"), ("stop", "nosuchrun"), ("approve", "nosuchrun", "x")):
        result = repo.cli(*args)
        one_line(result, "nosuchrun")
        assert not (repo.root / ".bmad-loop" / "queue.db").exists(), args
