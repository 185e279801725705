"""`[adapter] tmux = true`: the agent runs in a real tmux session that `attach` can reach."""

import shutil
import subprocess

import pytest

from support import StoryDef, wait_until
from bmad_loop.agents.tmux_session import TMUX

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def _sessions():
    out = subprocess.run([*TMUX, "list-sessions", "-F", "#{session_name}"], capture_output=True,
                         text=True)
    return out.stdout.split()


def test_an_agent_in_tmux_is_live_attachable_and_its_output_lands_in_the_log(make_repo, tmp_path):
    release = tmp_path / "release"
    started = tmp_path / "started"
    a = StoryDef("1-1-a", files=["src/a.py"])
    script = {a.key: {"dev": [{"write": {"src/a.py": "A"}, "say": "HELLO FROM TMUX",
                               "touch": [str(started)], "wait_for": str(release)}]}}
    repo = make_repo([a], script=script)
    policy = (repo.root / ".bmad-loop" / "policy.toml").read_text()
    (repo.root / ".bmad-loop" / "policy.toml").write_text(policy.replace("[adapter]\n", "[adapter]\ntmux = true\n"))
    proc = repo.spawn("run")
    wait_until(started.exists, what="agent started")
    session = repo.story(a.key)["session"]
    assert session in _sessions()
    # attach without a terminal names the live session instead of taking over the screen.
    result = repo.cli("attach", a.key)
    assert result.exit_code == 0, result.output
    assert f"tmux session {session}" in result.output
    release.write_text("go")
    assert proc.wait(timeout=60) == 0
    assert session not in _sessions()
    dev_log = next(p for p in (repo.root / ".bmad-loop" / "logs").rglob("dev-1.log"))
    assert "HELLO FROM TMUX" in dev_log.read_text()  # the pane was mirrored into the log


def test_a_hanging_agent_in_tmux_is_killed_with_its_session_at_the_timeout(make_repo):
    a = StoryDef("1-1-a", files=["src/a.py"])
    repo = make_repo([a], script={a.key: {"dev": [{"hang": True}]}})
    policy = (repo.root / ".bmad-loop" / "policy.toml").read_text()
    policy = policy.replace("[adapter]\n", "[adapter]\ntmux = true\n").replace("timeout_s = 60", "timeout_s = 2")
    (repo.root / ".bmad-loop" / "policy.toml").write_text(policy + "[limits]\nmax_dev_attempts = 1\n")
    result = repo.cli("run")
    assert result.exit_code == 3, result.output
    story = repo.story(a.key)
    assert "timed out" in story["reason"]
    assert story["session"] not in _sessions()
