"""The sandbox's parts: the writable set, the bubblewrap command line, the macOS profile, what
"auto"/"on"/"off" mean, the startup checks, and the environment agents never get.

The macOS profile is checked as text only: no Mac runs these tests (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from support import StoryDef, agent_command, git, init_repo

from bmad_loop.engine.verification.childenv import without_state_access
from bmad_loop.errors import ConfigError
from bmad_loop.policy import load_policy
from bmad_loop.agents.profiles import resolve_command
from bmad_loop.sandbox import BoxRequest, decide, plan_mounts
from bmad_loop.sandbox.bwrap import bwrap_argv
from bmad_loop.sandbox.probe import probe_bwrap
from bmad_loop.sandbox.seatbelt import seatbelt_profile

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])


def linked_worktree(tmp_path) -> BoxRequest:
    """A project with a real linked worktree under its state folder, and the box of a session
    working in it."""
    root = init_repo(tmp_path / "project")
    git(root, "commit", "-q", "--allow-empty", "-m", "base")
    tree = root / ".bmad-loop" / "worktrees" / "r1" / "1-1-a"
    git(root, "worktree", "add", "-q", "-b", "s", str(tree))
    home = tmp_path / "home"
    home.mkdir()
    scratch = root / ".bmad-loop" / "scratch" / "r1" / "1-1-a"
    scratch.mkdir(parents=True)
    return BoxRequest(project_root=root, state_dir=root / ".bmad-loop", git_dir=root / ".git",
                      tree=tree, scratch=scratch, env={"HOME": str(home)})


def test_the_writable_set_is_ordered_so_that_each_narrower_rule_wins(tmp_path):
    req = linked_worktree(tmp_path)
    mounts = [(m.kind, m.path) for m in plan_mounts(req)]
    root, home, admin = req.project_root, Path(req.env["HOME"]), req.git_dir / "worktrees" / "1-1-a"
    order = [("rw", home), ("ro", home / ".gitconfig"), ("ro", root), ("ro", req.git_dir),
             ("hide", req.state_dir), ("rw", req.tree), ("rw", admin), ("rw", req.scratch),
             ("ro", admin / "gitdir"), ("ro", admin / "commondir"),
             ("ro", req.tree / ".git")]
    positions = [mounts.index(step) for step in order]
    assert positions == sorted(positions), mounts
    assert ("rw", Path("/tmp")) in mounts
    # Nothing else in the git directory or the state folder is writable.
    writable = [p for kind, p in mounts if kind == "rw"]
    assert [p for p in writable if p.is_relative_to(req.git_dir)] == [admin]
    # (the session's log is not: its output reaches it through the pump's pipe only)
    assert {p for p in writable if p.is_relative_to(req.state_dir)} == {req.tree, req.scratch}


def test_in_place_the_checkout_is_writable_but_not_its_git_directory_nor_the_state(tmp_path):
    req = linked_worktree(tmp_path)
    in_place = BoxRequest(project_root=req.project_root, state_dir=req.state_dir,
                          git_dir=req.git_dir, tree=req.project_root, scratch=req.scratch,
                          checkout_tree=True, env=req.env)
    mounts = [(m.kind, m.path) for m in plan_mounts(in_place)]
    assert mounts.index(("rw", req.project_root)) < mounts.index(("ro", req.git_dir)) \
        < mounts.index(("hide", req.state_dir))
    assert not any(p.is_relative_to(req.git_dir) for kind, p in mounts if kind == "rw")


def test_sandbox_writable_widens_the_box_but_never_inside_the_project(tmp_path):
    req = linked_worktree(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    tool = Path(req.env["HOME"]) / ".cache" / "tool"
    tool.mkdir(parents=True)
    wider = BoxRequest(**{**req.__dict__, "extra_writable": (str(cache), "src", "~/.cache/tool")})
    (req.project_root / "src").mkdir()
    mounts = [(m.kind, m.path) for m in plan_mounts(wider)]
    assert ("rw", cache) in mounts and ("rw", tool) in mounts
    # A folder inside the project is mounted before the project goes read-only over it.
    assert mounts.index(("rw", req.project_root / "src")) < mounts.index(("ro", req.project_root))


def test_the_bwrap_command_line_always_isolates_and_keeps_the_plans_order(tmp_path):
    req = linked_worktree(tmp_path)
    argv = bwrap_argv("/usr/bin/bwrap", plan_mounts(req), ["agent", "--flag"], str(req.tree))
    text = " ".join(argv)
    for flag in ("--unshare-user", "--unshare-pid", "--new-session", "--die-with-parent",
                 "--disable-userns", "--cap-drop ALL"):
        assert flag in text
    assert argv[-3:] == ["--", "agent", "--flag"]
    assert f"--tmpfs {req.state_dir}" in text and f"--remount-ro {req.state_dir}" in text
    assert text.index(f"--tmpfs {req.state_dir}") < text.index(f"--bind-try {req.tree} ")
    assert "--share-net" not in text and "--unshare-net" not in text  # the network stays


def test_the_macos_profile_denies_writes_then_allows_the_plans_folders_in_order(tmp_path):
    req = linked_worktree(tmp_path)
    profile = seatbelt_profile(plan_mounts(req))
    lines = profile.splitlines()
    assert lines[:3] == ["(version 1)", "(allow default)", "(deny file-write*)"]
    hide = lines.index(f'(deny file-read* file-write* (subpath "{req.state_dir}"))')
    tree = lines.index(f'(allow file-read* file-write* (subpath "{req.tree}"))')
    git_ro = lines.index(f'(deny file-write* (subpath "{req.git_dir}"))')
    assert git_ro < hide < tree  # SBPL: the last matching rule wins
    assert profile.count("(") == profile.count(")")
    quoted = seatbelt_profile([type(plan_mounts(req)[0])("rw", Path('/tmp/a "b'))])
    assert '(subpath "/tmp/a \\"b")' in quoted


def test_auto_is_off_on_macos_with_a_note_and_on_uses_sandbox_exec(tmp_path, monkeypatch):
    auto = decide("auto", "[adapter] sandbox", platform="darwin")
    assert not auto.boxed and "off on macOS" in auto.note
    monkeypatch.setenv("PATH", str(tmp_path))  # no sandbox-exec here
    with pytest.raises(ConfigError, match=r'\[adapter\] sandbox = "on": sandbox-exec'):
        decide("on", "[adapter] sandbox", platform="darwin")
    assert decide("off", "[adapter] sandbox", platform="darwin").note == ""


def refused_bwrap(folder: Path) -> Path:
    """A `bwrap` that is installed but refused, as under AppArmor's user-namespace rule."""
    fake = folder / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


def test_a_refused_bwrap_makes_auto_unboxed_with_the_reason_and_on_an_error(tmp_path, monkeypatch):
    refused_bwrap(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    probe = probe_bwrap()
    assert not probe.ok and "uid map: Permission denied" in probe.detail
    auto = decide("auto", "[verify] sandbox", platform="linux")
    assert not auto.boxed and "Permission denied" in auto.note
    with pytest.raises(ConfigError, match="uid map"):
        decide("on", "[verify] sandbox", platform="linux")


def test_run_with_sandbox_on_and_a_refused_bwrap_is_exit_2_and_changes_nothing(
        make_repo, tmp_path, monkeypatch):
    repo = make_repo([ALPHA])
    repo.write_policy(f'[adapter]\ncommand = {json.dumps(agent_command(repo.script_path))}\n'
                      'sandbox = "on"\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    refused_bwrap(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = repo.cli("run")
    assert result.exit_code == 2, result.output
    assert '[adapter] sandbox = "on"' in result.output and "Permission denied" in result.output
    assert not (repo.root / ".bmad-loop" / "state.db").exists()
    assert repo.bmad_branches() == [] and repo.calls() == []
    validate = repo.cli("validate")
    assert validate.exit_code == 2 and "FAIL sandbox" in validate.output


def test_auto_with_a_refused_bwrap_warns_at_validate_and_run_and_runs_unboxed(
        make_repo, tmp_path, monkeypatch):
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}})
    refused_bwrap(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    validate = repo.cli("validate")
    warning = '[adapter] sandbox and [verify] sandbox = "auto": running unboxed: bwrap is ' \
              "installed but refused: bwrap: setting up uid map: Permission denied"
    assert f"warn sandbox: {warning}" in validate.output
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert result.output.count("running unboxed") == 1 and warning in result.output
    story = repo.status()["stories"][0]
    assert story["boxed"] is False
    assert all(e["data"]["boxed"] is False for e in repo.journal() if e["kind"] == "attempt.started")
    assert repo.calls()[0]["env"]["BMAD_LOOP_SANDBOX"] == ""


def test_a_bad_sandbox_value_is_exit_2_naming_the_key(make_repo):
    repo = make_repo([ALPHA])
    repo.write_policy('[verify]\nsandbox = "yes"\n')
    result = repo.cli("run")
    assert result.exit_code == 2 and "sandbox" in result.output, result.output
    assert not (repo.root / ".bmad-loop" / "state.db").exists()


def test_agents_never_get_the_state_databases_or_queues_url_or_password(tmp_path):
    (tmp_path / ".bmad-loop").mkdir()
    (tmp_path / ".bmad-loop" / "policy.toml").write_text(
        '[adapter]\ncommand = ["true"]\n'
        '[database]\nurl = "postgresql+psycopg://bmad:s3cret-pw@127.0.0.1:5432/bmad"\n'
        '[queue]\nbackend = "redis"\nurl = "redis://:q-pass-9@127.0.0.1:6379/0"\n')
    policy = load_policy(tmp_path)
    env = {"BMAD_LOOP_DATABASE_URL": "x", "BMAD_LOOP_QUEUE_URL": "y", "PGPASSWORD": "s3cret-pw",
           "DATABASE_URL": policy.database.url, "REDIS": "redis://:q-pass-9@127.0.0.1:6379/0",
           "PATH": "/usr/bin", "APP_DB": "postgresql://app@127.0.0.1/app"}
    assert without_state_access(env, policy) == {"PATH": "/usr/bin",
                                                 "APP_DB": "postgresql://app@127.0.0.1/app"}


def test_boxed_a_profile_runs_its_boxed_command(monkeypatch):
    """The hook for a CLI whose own sandbox cannot start inside the box: the profile's
    `boxed_command` replaces its `command` when the session is boxed."""
    from bmad_loop.agents import profiles

    plain = profiles.load_profile("codex")
    boxed = plain.__class__(**{**plain.__dict__, "boxed_command": ("codex", "exec", "--inner-off")})
    monkeypatch.setattr(profiles, "load_profile", lambda name: boxed)
    args = dict(profile="codex", command=(), phase_command=None, model="", tier_args=())
    assert resolve_command(**args, boxed=True) == ["codex", "exec", "--inner-off"]
    assert resolve_command(**args, boxed=False) == list(plain.command)


def test_a_boxed_session_is_recorded_in_status_and_the_journal(make_repo):
    if not probe_bwrap().ok:
        pytest.skip(f"no usable bubblewrap here: {probe_bwrap().detail}")
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}})
    assert repo.cli("run").exit_code == 0
    assert repo.status()["stories"][0]["boxed"] is True
    with sqlite3.connect(repo.root / ".bmad-loop" / "state.db") as conn:
        assert {row[0] for row in conn.execute("SELECT boxed FROM attempts")} == {1}
    call = repo.calls()[0]
    assert call["env"]["BMAD_LOOP_SANDBOX"] == "bwrap"
    assert "BMAD_LOOP_DATABASE_URL" not in call["env"]
