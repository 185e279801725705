"""What bmad-loop trusts around the box (issue 45): the folders above what it protects, its
own code and programs, the session folder, ledgers, temp folders, a merge rule's `cwd`.

The hostile agent's attempts (planting programs and code, moving protected folders, its own
log) are in tests/test_sandbox_escape.py, as root and as the ordinary user; these are the
rest, each with the real bubblewrap where a box is involved.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

from support import MERGE_NONE, STORY_DIR, StoryDef
from test_sandbox import linked_worktree
from test_sandbox_escape import needs_bwrap

import bmad_loop
from bmad_loop.git.runner import Git
from bmad_loop.git.trees.merge import committed_attributes
from bmad_loop.policy.checks import MAX_VERIFY_PARALLEL
from bmad_loop.sandbox import BoxRequest, plan_mounts
from bmad_loop.sandbox.plan import unpinned_ancestors, writable_in
from bmad_loop.sandbox.programs import outside_code

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
HONEST = "NAME = 'alpha'\n"
DOCS = Path(__file__).resolve().parent.parent / "docs"
BOXED_AND_NOT = [pytest.param("on", marks=needs_bwrap), "off"]


# ------------------------------------------------------------------ the mount plan
def hostile_workstation(tmp_path) -> BoxRequest:
    """A session's box on a workstation an agent would like: the project under the home, a
    folder on PATH that is a symlink, a venv under /tmp holding bmad-loop's code."""
    req = linked_worktree(tmp_path)
    home = Path(req.env["HOME"])
    (home / "realbin").mkdir()
    (home / "bin-link").symlink_to(home / "realbin")
    venv = Path(tempfile.mkdtemp(dir=tmp_path, prefix="venv-")) / "lib" / "site-packages"
    venv.mkdir(parents=True)
    env = {"HOME": str(home), "PATH": f"{home / 'bin-link'}{os.pathsep}/usr/bin"}
    code = tuple(outside_code(env)) + (venv,)
    return BoxRequest(**{**req.__dict__, "env": env, "outside_code": code})


def test_no_folder_above_a_protected_path_is_left_renameable_in_the_mount_plan(tmp_path):
    """The writable set minus every read-only path holds no folder above a protected one: each
    is pinned (a mount point nobody renames). Walks the plan of a linked worktree, in place, and
    with sandbox_writable folders."""
    req = hostile_workstation(tmp_path)
    in_place = BoxRequest(**{**req.__dict__, "tree": req.project_root, "checkout_tree": True})
    wider = BoxRequest(**{**req.__dict__, "extra_writable": ("~/.cache/tool", str(tmp_path))})
    (Path(req.env["HOME"]) / ".cache" / "tool").mkdir(parents=True)
    for request in (req, in_place, wider):
        mounts = plan_mounts(request)
        assert unpinned_ancestors(mounts) == []
        protected = [m.path for m in mounts if m.kind in ("ro", "hide")]
        assert Path(req.env["HOME"]) / ".config" / "git" in protected
    pins = [m.path for m in plan_mounts(req) if m.kind == "pin"]
    assert req.project_root.parent in pins and Path(req.env["HOME"]) / ".config" in pins
    # The check itself finds a folder left writable above a protected path.
    home = Path(req.env["HOME"])
    bare = [type(plan_mounts(req)[0])("rw", home), type(plan_mounts(req)[0])("ro", home / "a" / "b")]
    assert unpinned_ancestors(bare) == [(home / "a", home / "a" / "b")]


def test_bmad_loops_own_code_and_every_folder_on_path_are_read_only_in_the_box(tmp_path):
    req = hostile_workstation(tmp_path)
    mounts = plan_mounts(req)
    home = Path(req.env["HOME"])
    package = Path(bmad_loop.__file__).resolve().parent
    must_be_read_only = [package / "engine" / "lane" / "tick.py", Path(sys.prefix).resolve(),
                         home / "realbin", home / ".local" / "bin", home / "bin",
                         req.outside_code[-1]]  # the venv under /tmp
    must_be_read_only += [Path(os.path.realpath(p)) for p in sys.path if p and os.path.isabs(p)]
    assert [p for p in must_be_read_only if writable_in(mounts, p)] == []
    # What the box is for stays writable; its log is not among it.
    assert writable_in(mounts, req.tree / "src") and writable_in(mounts, home / ".claude")
    assert not writable_in(mounts, req.state_dir / "logs" / "r1" / "1-1-a" / "dev-1.log")


# ------------------------------------------------------------------ bmad-loop's temp folders
def test_the_merge_attributes_folder_is_in_the_git_directory_where_no_box_writes(tmp_path):
    req = linked_worktree(tmp_path)
    git = Git(req.project_root)
    with committed_attributes(git, "HEAD") as at:
        folder = Path(at.cwd).resolve()
        assert not folder.is_relative_to(Path(tempfile.gettempdir()).resolve() / "bmad-loop-attrs")
        assert folder.is_relative_to(req.git_dir.resolve())
        assert not writable_in(plan_mounts(req), folder)
    assert not folder.exists()
    # Nothing of bmad-loop's own work folders is in the shared temp folder.
    # (The demo makes its project there: the project is what its agents work in.)
    source = Path(bmad_loop.__file__).resolve().parent
    shared = re.compile(r"(TemporaryDirectory|mkdtemp|mkstemp|NamedTemporaryFile)\((?![^)]*dir=)")
    uses = [str(p.relative_to(source)) for p in source.rglob("*.py")
            if shared.search(p.read_text()) and p.relative_to(source) != Path("cli/demo.py")]
    assert uses == []


# ------------------------------------------------------------------ the session folder
@needs_bwrap
def test_a_session_folder_made_a_symlink_is_replaced_not_written_through_and_never_lands(
        make_repo):
    """Boxed, the agent points `.bmad-loop-session` at the refs folder and fails; the next
    prompt goes into a real folder of bmad-loop's, not into `.git/refs/heads`, and nothing of
    the session folder reaches the target."""
    repo = make_repo([ALPHA], policy='[gates]\nmode = "none"\n[review]\nenabled = false\n')
    refs = repo.root / ".git" / "refs" / "heads"
    repo.write_script({ALPHA.key: {"dev": [
        {"symlink": {".bmad-loop-session": str(refs)}, "exit": 1},
        {"write": {"src/alpha.py": HONEST}}]}})
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert not (refs / "dev-2.md").exists()
    assert repo.git("show", "main:src/alpha.py") + "\n" == HONEST
    assert ".bmad-loop-session" not in repo.git("ls-tree", "-r", "--name-only", "main")
    second = repo.calls()[-1]  # it read its prompt where bmad-loop wrote it
    assert second["attempt"] == 2 and ALPHA.key in second["prompt"]


def test_a_story_that_stages_the_session_folder_in_any_form_is_refused(make_repo, unboxed):
    """`git add -f` of the session folder made a symlink: the story commit is refused and the
    story escalates naming the folder; the target never moves."""
    repo = make_repo([ALPHA], policy='[gates]\nmode = "none"\n[review]\nenabled = false\n')
    repo.write_script({ALPHA.key: {"dev": [{
        "write": {"src/alpha.py": HONEST},
        "symlink": {".bmad-loop-session": str(repo.root / ".git" / "refs" / "heads")},
        "git": [["add", "-f", ".bmad-loop-session"]]}]}})
    start = repo.git("rev-parse", "main")
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    story = repo.status()["stories"][0]
    assert story["state"] == "escalated" and ".bmad-loop-session" in story["reason"]
    assert repo.git("rev-parse", "main") == start


# ------------------------------------------------------------------ a git-ignored ledger
LEDGER = f"{STORY_DIR}/deferred-work.md"
SECRET = "# api-token = SECRET-7f3a"


@pytest.mark.parametrize("sandbox", BOXED_AND_NOT)
def test_a_git_ignored_ledger_made_a_symlink_to_the_policy_is_never_read(make_repo, sandbox,
                                                                         monkeypatch):
    monkeypatch.setenv("BMAD_LOOP_ADAPTER_SANDBOX", sandbox)
    monkeypatch.setenv("BMAD_LOOP_VERIFY_SANDBOX", sandbox)
    story = StoryDef("1-1-a", files=["src/a.py", LEDGER])
    repo = make_repo([story], files={"src/__init__.py": ""},
                     policy=MERGE_NONE.format(n=1, strategy="merge") + f"{SECRET}\n")
    with open(repo.root / ".gitignore", "a") as handle:
        handle.write("deferred-work.md\n")
    repo.commit_all("ignore the ledger")
    (repo.root / LEDGER).write_text("# Deferred\n")
    repo.write_script({story.key: {"dev": [{
        "write": {"src/a.py": "A = 1\n"},
        "symlink": {LEDGER: str(repo.root / ".bmad-loop" / "policy.toml")}}]}})
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert SECRET not in (repo.root / LEDGER).read_text()
    assert (repo.root / LEDGER).read_text() == "# Deferred\n"


# ------------------------------------------------------------------ a merge rule's cwd
GENERATOR = ("import pathlib; pathlib.Path('app.lock').write_text("
             "pathlib.Path('deps.txt').read_text().upper())")


@pytest.mark.parametrize("sandbox", BOXED_AND_NOT)
def test_a_regenerate_command_runs_in_its_cwd_boxed_and_unboxed_and_gives_the_same_bytes(
        make_repo, sandbox):
    story = StoryDef("1-1-a", files=["src/a.py", "sub/deps.txt"], shared=["sub/app.lock"])
    rule = json.dumps([sys.executable, "-c", GENERATOR])
    policy = (MERGE_NONE.format(n=1, strategy="squash")
              + f'[integration.merge]\n"sub/app.lock" = {{ regenerate = {rule}, always = true }}\n'
              + f'[verify]\nsandbox = "{sandbox}"\n')
    repo = make_repo([story], files={"src/__init__.py": "", "sub/deps.txt": "alpha\n",
                                     "sub/app.lock": "ALPHA\n"}, policy=policy)
    repo.write_script({story.key: {"dev": [{"write": {
        "src/a.py": "A = 1\n", "sub/deps.txt": "alpha\nbravo\n", "sub/app.lock": "stale\n"}}]}})
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    assert repo.git("show", "main:sub/app.lock") + "\n" == "ALPHA\nBRAVO\n"
    assert repo.git("ls-tree", "--name-only", "main", "app.lock") == ""


@pytest.mark.parametrize("cwd, ok", [("..", True), ("../..", False), ("../../..", False),
                                     ("x/../../..", False), ("../sub/..", True)])
def test_a_regenerate_cwd_that_leaves_the_repository_is_refused_at_validate(make_repo, cwd, ok):
    repo = make_repo([ALPHA])
    repo.write_policy(f'[integration.merge]\n"sub/app.lock" = {{ regenerate = "true", '
                      f'cwd = "{cwd}" }}\n')
    result = repo.cli("validate")
    if ok:
        assert result.exit_code == 0 and "leads outside" not in result.output, result.output
        return
    assert result.exit_code == 2, result.output
    assert "cwd" in result.output and "leads outside the repository" in result.output
    assert not (repo.root / ".bmad-loop" / "state.db").exists()


# ------------------------------------------------------------------ [verify] parallel
@pytest.mark.parametrize("value, ok", [(1, True), (MAX_VERIFY_PARALLEL, True),
                                       (MAX_VERIFY_PARALLEL + 1, False), (1024, False)])
def test_verify_parallel_has_one_bound_the_docs_say(make_repo, value, ok):
    repo = make_repo([ALPHA])
    repo.write_policy(f"[verify]\nparallel = {value}\n")
    result = repo.cli("validate")
    if ok:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2 and "[verify] parallel" in result.output, result.output
    row = next(line for line in (DOCS / "configuration.md").read_text().splitlines()
               if line.startswith("| `parallel` |"))
    assert f"integer 1–{MAX_VERIFY_PARALLEL} " in row


def test_the_sockets_of_servers_outside_the_box_are_hidden_or_masked_in_the_plan(tmp_path):
    """A read-only mount still lets a process connect to a socket in it: the runtime folder and
    tmux's socket folder are hidden, the SSH agent's socket masked, and none of them can be
    moved aside (the folders above are pinned), in both box back ends' plans."""
    import socket

    from bmad_loop.sandbox.plan import tmux_socket_folder
    from bmad_loop.sandbox.seatbelt import seatbelt_profile

    req = linked_worktree(tmp_path)
    runtime, agent_dir = tmp_path / "run-user", tmp_path / "ssh-x"
    runtime.mkdir()
    agent_dir.mkdir()
    agent = agent_dir / "agent.1"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(agent))
        tmux_socket_folder().mkdir(mode=0o700, exist_ok=True)
        env = {**req.env, "XDG_RUNTIME_DIR": str(runtime), "SSH_AUTH_SOCK": str(agent)}
        mounts = plan_mounts(BoxRequest(**{**req.__dict__, "env": env}))
    kinds = {(m.kind, m.path) for m in mounts}
    assert ("hide", runtime) in kinds and ("mask", agent) in kinds
    assert ("hide", tmux_socket_folder()) in kinds
    assert unpinned_ancestors(mounts) == []
    assert ("pin", agent_dir) in kinds  # a mount point: the socket's folder is not renamed
    profile = seatbelt_profile(mounts)
    assert f'(deny network-outbound (subpath "{agent}"))' in profile
