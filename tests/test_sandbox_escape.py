"""A hostile agent and a hostile verify command, boxed and not (issue: agents in a box).

Each is `tests/agents/hostile_agent.py`: a real process that tries to write what governs the
run (state.db, queue.db, policy.toml, .git/config, a hook, the target ref), another story's
worktree, a candidate worktree and ~/.gitconfig; to remount / read-write, to reach the host
through /proc/<pid>/root, to start a nested bwrap, and a few more ways out (symlinks and
hardlinks out of the worktree, git alternates, the worktree's `.git` file, its admin entry,
`core.hooksPath` in the worktree config, `GIT_DIR`). Then it does its honest work.

Boxed (bubblewrap, as root and as an ordinary user): every attempt fails, the run completes as
an honest run would, and no file outside the boxes' own folders holds the hostile mark.
Unboxed: the same agent writes the run's own files; the test says which.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from pathlib import Path

import pytest

from support import CI, StoryDef, build_repo, cli_argv, settled_status

import bmad_loop
from bmad_loop.sandbox.probe import probe_bwrap

HOSTILE = Path(__file__).resolve().parent / "agents" / "hostile_agent.py"
ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
HONEST = "NAME = 'alpha'\n"
USER = "bmadbox"  # the ordinary user .ci/run creates

# Must fail in the box. (`git config --worktree` is refused by git itself, boxed or not; a direct
# write of the worktree's config.worktree is the box's own business, caught by the configuration
# fingerprint: test_boxed_the_worktrees_own_config_worktree_is_writable_and_a_change_escalates.)
MUST_FAIL = (
    "state.db", "queue.db", "policy.toml", ".git/config", ".git/hooks/pre-commit",
    "refs/heads/main (git update-ref)", "refs/heads (a new ref file)", "GIT_DIR=.git git update-ref",
    "another story's worktree", "a candidate worktree", "~/.gitconfig",
    "/proc/<bmad-loop pid>/root", "/proc/1/root", "signal bmad-loop", "nested bwrap",
    "symlink out of the worktree",
    "hardlink out of the worktree", "git alternates", "the worktree's .git file",
    "the admin entry's commondir", "remount / read-write",
    # issue 45: what would have bmad-loop run the agent's code unboxed, or move what it protects
    "~/.local/bin/bwrap (first on PATH)", "~/.local/bin/git", "~/bin/git", "a folder on PATH",
    "bmad-loop's site-packages (.pth)", "bmad-loop's own code",
    "rename ~/.config (moves ~/.config/git)", "rename the project's folder",
    "rename the folder above the project", "its own session log",
    "bmad-loop's private temp folder",
    # servers outside the box reached through their Unix sockets
    "socket: the runtime folder (D-Bus, systemd --user)", "socket: the SSH agent",
    "tmux: another of the user's servers",
)
PACKAGE_FILE = Path(bmad_loop.__file__).resolve().parent / "engine" / "lane" / "tick.py"

needs_bwrap = pytest.mark.skipif(not CI and not probe_bwrap().ok,
                                 reason=f"no usable bubblewrap here: {probe_bwrap().detail}")


def hostile_project(make_repo, tmp_path, sandbox: str, python: str = sys.executable,
                    extra: str = "", servers: "OutsideServers | None" = None, adapter: str = ""):
    """A project whose agent and verify command are the hostile script (run by `python`);
    returns (repo, cfg)."""
    reports = tmp_path / "reports"
    reports.mkdir()
    repo = make_repo([ALPHA])
    state = repo.root / ".bmad-loop"
    cfg = {"state_dir": str(state), "git_dir": str(repo.root / ".git"),
           "home": os.environ["HOME"], "report_dir": str(reports),
           "other_worktree": str(state / "worktrees" / "r-other" / "9-9-other"),
           "candidate_worktree": str(state / "candidates" / "r-other" / "9-9-other-1"),
           "honest_file": "src/alpha.py", "honest_text": HONEST,
           "project": str(repo.root), "path_folder": str(path_folder(tmp_path)),
           "site_packages": sysconfig.get_paths()["purelib"], "package_file": str(PACKAGE_FILE),
           "sockets": servers.sockets if servers else {}, "tmux": servers.tmux if servers else {}}
    for folder in (cfg["other_worktree"], cfg["candidate_worktree"]):
        Path(folder).mkdir(parents=True)
        (Path(folder) / "work.txt").write_text("another story's work\n")
    config = tmp_path / "hostile.json"
    config.write_text(json.dumps(cfg))
    agent = [python, str(HOSTILE), str(config), "agent"]
    verify = f"{python} {HOSTILE} {config} verify"
    repo.write_policy(
        f'{extra}[gates]\nmode = "none"\n[review]\nenabled = false\n'
        f"[verify]\ncommands = [{json.dumps(verify)}]\nsandbox = \"{sandbox}\"\n"
        f"[adapter]\ncommand = {json.dumps(agent)}\ntimeout_s = 120\nsandbox = \"{sandbox}\"\n"
        f"{adapter}")
    return repo, cfg


class OutsideServers:
    """Servers a user's machine runs outside any box, each able to run a command or sign for
    whoever connects: a listener in the runtime folder (as D-Bus and `systemd --user` are), an
    SSH agent's socket, and a tmux server of the user's. Each is reachable from outside (checked
    on start), so a refusal in the box is the box's doing."""

    def __init__(self, folder: Path, user: pwd.struct_passwd | None = None):
        import socket
        import threading

        self.folder, self.user, self.listeners = folder, user, []
        runtime, agent = folder / "runtime", folder / "ssh-agent"
        for sub in (runtime, agent):
            sub.mkdir(mode=0o755, parents=True)
        self.sockets = {"the runtime folder (D-Bus, systemd --user)": str(runtime / "bus"),
                        "the SSH agent": str(agent / "agent.1")}
        self.env = {"XDG_RUNTIME_DIR": str(runtime), "SSH_AUTH_SOCK": self.sockets["the SSH agent"]}
        for path in self.sockets.values():
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            os.chmod(path, 0o777)  # the ordinary user's box may connect, as to its own agent
            server.listen()
            self.listeners.append(server)
            threading.Thread(target=self._serve, args=(server,), daemon=True).start()
        # Its own name each time: a server of an earlier test in this process may still be
        # going away when the next one starts.
        self.name = f"bmad-loop-hostile-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._tmux("new-session", "-d", "-s", "user", "sleep", "600")
        uid = user.pw_uid if user else os.geteuid()
        self.tmux = {"another of the user's servers": f"/tmp/tmux-{uid}/{self.name}"}
        for path in self.sockets.values():  # reachable from outside
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(path)
        self._tmux("has-session", "-t", "user")

    def _tmux(self, *args: str) -> None:
        prefix = ["runuser", "-u", self.user.pw_name, "--"] if self.user else []
        proc = subprocess.run([*prefix, "tmux", "-L", self.name, *args], cwd="/",
                              env={**os.environ, "TMUX": ""}, capture_output=True, text=True)
        assert proc.returncode == 0, f"tmux {' '.join(args)}: {proc.stderr.strip()}"

    @staticmethod
    def _serve(server) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            client.close()

    def close(self) -> None:
        for server in self.listeners:
            server.close()
        subprocess.run(["tmux", "-L", self.name, "kill-server"], capture_output=True, cwd="/")
        if self.user:
            subprocess.run(["runuser", "-u", self.user.pw_name, "--", "tmux", "-L", self.name,
                            "kill-server"], capture_output=True, cwd="/")


@pytest.fixture
def outside_servers(tmp_path):
    servers = OutsideServers(tmp_path / "servers-root")
    yield servers
    servers.close()


def path_folder(tmp_path: Path) -> Path:
    """A folder of the test's own on PATH (made once per test)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    return folder


def hostile_path(cfg) -> str:
    """PATH as a user's shell has it: `~/.local/bin` first (absent until someone makes it), then
    the test's own folder, then the machine's."""
    return os.pathsep.join([str(Path(cfg["home"]) / ".local" / "bin"), cfg["path_folder"],
                            os.environ["PATH"]])


def reports(cfg) -> dict[str, list[dict]]:
    """role -> the reports its sessions wrote, in order."""
    out: dict[str, list[dict]] = {}
    for path in sorted(Path(cfg["report_dir"]).glob("*.json")):
        out.setdefault(path.name.split("-")[0], []).append(json.loads(path.read_text()))
    return out


def marked_files(root: Path, skip: tuple[Path, ...] = ()) -> list[str]:
    """Files under `root` holding the hostile mark (the boxes' own folders skipped)."""
    found = []
    for folder, _dirs, files in os.walk(root):
        if any(Path(folder).is_relative_to(s) for s in skip):
            continue
        for name in files:
            path = Path(folder) / name
            try:
                if b"HOSTILE" in path.read_bytes() or name == "HOSTILE":
                    found.append(str(path))
            except OSError:
                pass
    return found


def assert_nothing_escaped(repo, cfg, start: str) -> None:
    status = repo.status()
    assert status["run"]["state"] == "completed", status
    story = status["stories"][0]
    assert story["state"] == "integrated" and story["boxed"] is True
    # What landed is exactly the honest work, by the lane's one advance.
    assert repo.git("show", "main:src/alpha.py") + "\n" == HONEST
    assert repo.git("rev-parse", "main^") == start
    assert repo.git("for-each-ref", "--format=%(refname)", "refs/heads/hostile") == ""
    # The run's own files, the git directory, the other folders and the home: untouched.
    state = repo.root / ".bmad-loop"
    own = (state / "scratch", state / "logs")  # the boxes' scratch (quarantine) and output
    assert marked_files(repo.root, skip=own) == []
    assert marked_files(Path(cfg["home"])) == []
    assert not (repo.root / ".git" / "hooks" / "pre-commit").exists()
    home = Path(cfg["home"])
    planted = [home / ".local" / "bin" / "bwrap", home / ".local" / "bin" / "git",
               home / "bin" / "git", Path(cfg["path_folder"]) / "git",
               Path(cfg["site_packages"]) / "hostile.pth"]
    assert [str(p) for p in planted if p.exists()] == []
    assert (home / ".config" / "git").is_dir() and not (home / ".config-moved").exists()
    assert not (home / "tmux-HOSTILE").exists()  # no tmux server ran the agent's command
    assert "HOSTILE" not in PACKAGE_FILE.read_text()
    for role, runs in reports(cfg).items():
        for report in runs:
            assert report["boxed"] == "bwrap"
            leaked = {k: v for k, v in report["results"].items() if k in MUST_FAIL and v == "ok"}
            assert leaked == {}, f"{role} escaped: {leaked}"
    events = repo.journal()
    started = [e for e in events if e["kind"] == "attempt.started"]
    assert started and all(e["data"]["boxed"] is True for e in started)
    verified = [e for e in events if e["kind"] in ("verify.passed", "candidate.verified")]
    assert verified and all(e["data"].get("boxed") is True for e in verified)
    assert [e for e in events if e["kind"] == "guard.refused"] == []


@needs_bwrap
def test_a_hostile_agent_and_verify_command_in_the_box_change_nothing_outside_it_as_root(
        make_repo, tmp_path, monkeypatch, outside_servers):
    repo, cfg = hostile_project(make_repo, tmp_path, "on", servers=outside_servers)
    monkeypatch.setenv("PATH", hostile_path(cfg))
    for name, value in outside_servers.env.items():
        monkeypatch.setenv(name, value)
    start = repo.git("rev-parse", "main")
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert_nothing_escaped(repo, cfg, start)
    roles = reports(cfg)
    # The agent, the story's verify and the candidate's verify each tried everything once.
    assert len(roles["agent"]) == 1 and len(roles["verify"]) == 2
    assert set(MUST_FAIL) <= set(roles["agent"][0]["results"])


@needs_bwrap
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_with_tmux_the_boxed_agent_cannot_reach_the_tmux_server_its_pane_lives_in(
        make_repo, tmp_path, monkeypatch, outside_servers):
    """`[adapter] tmux = true`: the agent runs in a pane of bmad-loop's own tmux server, which
    runs unboxed; $TMUX names its socket. Connecting to it (or to any tmux server) fails."""
    repo, cfg = hostile_project(make_repo, tmp_path, "on", servers=outside_servers,
                                adapter="tmux = true\n")
    monkeypatch.setenv("PATH", hostile_path(cfg))
    for name, value in outside_servers.env.items():
        monkeypatch.setenv(name, value)
    start = repo.git("rev-parse", "main")
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert_nothing_escaped(repo, cfg, start)
    tried = reports(cfg)["agent"][0]["results"]
    # The key is there only when $TMUX was set: the agent did run in a tmux pane.
    assert tried["tmux: the tmux server it runs in"].startswith("refused"), tried


@needs_bwrap
def test_in_place_the_boxed_agent_writes_the_checkout_and_nothing_of_git_or_the_run(
        make_repo, tmp_path, monkeypatch):
    repo, cfg = hostile_project(make_repo, tmp_path, "on", extra='[scm]\nisolation = "none"\n')
    monkeypatch.setenv("PATH", hostile_path(cfg))
    start = repo.git("rev-parse", "main")
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert_nothing_escaped(repo, cfg, start)
    assert repo.git("status", "--porcelain") == ""  # the checkout followed the advance


def _ordinary_user() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        return None


def _user_case_or_skip():
    """The ordinary user and runuser, or a skip that names why (a failure in CI)."""
    why = None
    if os.geteuid() != 0:
        why = "needs root to become another user"
    elif shutil.which("runuser") is None:
        why = "runuser is not installed"
    elif _ordinary_user() is None:
        why = f"no user {USER!r} (.ci/run creates it: useradd -m {USER})"
    else:
        probe = subprocess.run(["runuser", "-u", USER, "--", sys.executable, "-c",
                                "import bmad_loop"], capture_output=True, text=True, cwd="/")
        if probe.returncode != 0:  # .ci/run makes the interpreter and the checkout reachable
            why = f"{USER} cannot run {sys.executable} with bmad_loop: {probe.stderr.strip()[-200:]}"
    if why is None:
        return _ordinary_user()
    if CI:
        pytest.fail(f"the ordinary-user sandbox test cannot run in CI: {why}")
    pytest.skip(why)


@pytest.fixture
def user_folder():
    """A folder the ordinary user owns, outside pytest's own (which only root may enter)."""
    folder = Path(tempfile.mkdtemp(prefix="bmad-box-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_bwrap
def test_a_hostile_agent_and_verify_command_in_the_box_change_nothing_as_an_ordinary_user(
        user_folder):
    user = _user_case_or_skip()
    built = []

    def make_repo(stories, **options):
        built.append(build_repo(user_folder, stories, **options))
        return built[-1]

    servers = OutsideServers(user_folder / "servers", user)
    repo, cfg = hostile_project(make_repo, user_folder, "on", servers=servers)
    home = user_folder / "home"
    home.mkdir()
    cfg["home"] = str(home)
    (user_folder / "hostile.json").write_text(json.dumps(cfg))
    start = repo.git("rev-parse", "main")
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(user_folder)], check=True)
    env = {"PATH": hostile_path(cfg), "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
           "LANG": "C.UTF-8", **servers.env}
    try:
        proc = subprocess.run(["runuser", "-u", USER, "--", "env", "-i",
                               *[f"{k}={v}" for k, v in env.items()],
                               *cli_argv("run", "--project", str(repo.root))],
                              # (`python -m` puts its cwd on sys.path: read-only in every box)
                              capture_output=True, text=True, timeout=300, cwd=str(repo.root))
    finally:
        servers.close()
        subprocess.run(["chown", "-R", "0:0", str(user_folder)], check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_nothing_escaped(repo, cfg, start)
    assert all(r["boxed"] == "bwrap" for runs in reports(cfg).values() for r in runs)


def test_unboxed_the_same_agent_writes_the_runs_own_files(make_repo, tmp_path):
    """What the box is for: with `sandbox = "off"` the hostile agent reaches the state database,
    the queue, the policy, the git configuration and hooks, another story's worktree, a
    candidate worktree, the user's git configuration and (a hardlink or a symlink away) the
    policy again. The verify command still passes, so the run may even complete: only the
    box tells these writes from honest work."""
    repo, cfg = hostile_project(make_repo, tmp_path, "off")
    repo.cli("run")
    agent = reports(cfg)["agent"][0]
    assert agent["boxed"] == ""
    wrote = {k for k, v in agent["results"].items() if v == "ok"}
    assert {"state.db", "queue.db", "policy.toml", ".git/config", ".git/hooks/pre-commit",
            "refs/heads (a new ref file)", "another story's worktree", "a candidate worktree",
            "~/.gitconfig", "symlink out of the worktree", "hardlink out of the worktree",
            "git alternates", "the worktree's .git file",
            "the admin entry's commondir", "signal bmad-loop"} <= wrote
    # The target guard still refuses git's own ref updates, unboxed (and escalates the story).
    assert agent["results"]["refs/heads/main (git update-ref)"] != "ok"
    assert "HOSTILE" in (repo.root / ".bmad-loop" / "policy.toml").read_text()
    assert "HOSTILE" in (repo.root / ".git" / "config").read_text()


# The contract change: boxed, an attempt to move the target fails in git, changes nothing,
# and the story goes on (unboxed, the guard refuses it and the story escalates: test_guard.py).
TARGET_WRITES = {
    "update-ref": [["update-ref", "refs/heads/main", "HEAD"]],
    "branch -f": [["branch", "-f", "main", "HEAD"]],
    # A commit on a detached HEAD works (HEAD is in the worktree's admin entry, its objects in
    # the quarantine); pushing it is what fails.
    "push to the target": [["checkout", "--detach"], ["commit", "--allow-empty", "-m", "sneaky"],
                           ["push", ".", "HEAD:main"]],
    "commit on the target": [["checkout", "--ignore-other-worktrees", "main"],
                             ["commit", "--allow-empty", "-m", "sneaky"]],
    "commit on its own branch": [["add", "-A"], ["commit", "-m", "its own"]],
}


@needs_bwrap
@pytest.mark.parametrize("write", sorted(TARGET_WRITES))
def test_boxed_a_write_of_the_target_fails_in_git_changes_nothing_and_the_story_goes_on(
        make_repo, write):
    repo = make_repo([ALPHA], policy='[gates]\nmode = "none"\n', script={ALPHA.key: {"dev": [
        {"write": {"src/alpha.py": HONEST}, "git": TARGET_WRITES[write]}]}})
    start = repo.git("rev-parse", "main")
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    story = repo.status()["stories"][0]
    assert story["state"] == "integrated" and story["boxed"] is True
    dev_log = next((repo.root / ".bmad-loop" / "logs").rglob("dev-1.log"))
    tried = [line for line in dev_log.read_text().splitlines() if line.startswith("git ")]
    assert tried and " -> 0" not in tried[-1], tried  # git itself refused the last step
    # main moved once, by the lane, to the story's honest work.
    assert repo.git("rev-parse", "main^") == start
    assert repo.git("show", "main:src/alpha.py") + "\n" == HONEST
    assert repo.git("log", "--format=%s", "main").count("sneaky") == 0
    assert [e for e in repo.journal() if e["kind"] in ("guard.refused", "story.escalated")] == []


@needs_bwrap
def test_boxed_the_worktrees_own_config_worktree_is_writable_and_a_change_escalates(make_repo):
    """The one git configuration file inside the box's writable admin entry: git reads it only
    under extensions.worktreeConfig, and the configuration fingerprint catches a change."""
    repo = make_repo([ALPHA], policy='[gates]\nmode = "none"\n')
    admin = repo.root / ".git" / "worktrees" / ALPHA.key
    repo.write_script({ALPHA.key: {"dev": [{"write": {
        "src/alpha.py": HONEST, str(admin / "config.worktree"): "[core]\n\thooksPath = /tmp\n"}}]}})
    start = repo.git("rev-parse", "main")
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    story = repo.status()["stories"][0]
    assert story["state"] == "escalated" and story["boxed"] is True
    assert "git configuration changed" in story["reason"]
    changed = [e for e in repo.journal() if e["kind"] == "git.config_changed"]
    assert changed and "config.worktree" in json.dumps(changed[0]["data"])
    assert repo.git("rev-parse", "main") == start


@needs_bwrap
def test_remote_mode_the_box_hides_the_projects_own_state_not_only_the_clones(
        make_repo, tmp_path, monkeypatch):
    """In remote mode the worker's repository is a clone; the policy and the state database
    stay in the project: read-only and hidden for the hostile agent all the same."""
    repo, cfg = hostile_project(make_repo, tmp_path, "on")
    monkeypatch.setenv("PATH", hostile_path(cfg))
    bare = tmp_path / "remote.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo.root), str(bare)], check=True)
    repo.git("remote", "add", "origin", str(bare))
    policy = repo.root / ".bmad-loop" / "policy.toml"
    policy.write_text('[scm]\nremote = "origin"\n' + policy.read_text())
    result = repo.cli("enqueue")
    assert result.exit_code == 0, result.output
    run_id = result.output.strip().splitlines()[-1]
    worker = repo.spawn("worker", "--clone", str(tmp_path / "clone"), log_name="worker")
    try:
        settled = settled_status(repo, run_id, timeout=120)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert settled["run"]["state"] == "completed", (settled, repo.spawned_logs())
    assert subprocess.run(["git", "--git-dir", str(bare), "show", "main:src/alpha.py"],
                          capture_output=True, text=True).stdout == HONEST
    state = repo.root / ".bmad-loop"
    assert marked_files(repo.root, skip=(state / "scratch", state / "logs")) == []
    agent = reports(cfg)["agent"][0]
    assert agent["boxed"] == "bwrap"
    assert {k: v for k, v in agent["results"].items() if k in MUST_FAIL and v == "ok"} == {}
