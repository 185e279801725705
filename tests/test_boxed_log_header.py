"""A boxed session's and verify's log header shows what the user configured, first and whole,
then the box on a line of its own; the box's argv (kilobytes of mounts) is in the journal."""

import json
import shlex

import pytest

from bmad_loop.sandbox.probe import probe_bwrap
from support import CI, StoryDef, agent_command

ALPHA = StoryDef("1-1-alpha", files=["src/alpha.py"])
VERIFY = "test -f src/alpha.py"

needs_bwrap = pytest.mark.skipif(not CI and not probe_bwrap().ok,
                                 reason=f"no usable bubblewrap here: {probe_bwrap().detail}")


@needs_bwrap
def test_a_boxed_logs_header_is_the_configured_command_then_the_box(make_repo):
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}})
    repo.write_policy('[gates]\nmode = "none"\n[review]\nenabled = false\n'
                      f'[verify]\ncommands = ["{VERIFY}"]\nsandbox = "on"\n'
                      f"[adapter]\ncommand = {json.dumps(agent_command(repo.script_path))}\n"
                      'timeout_s = 60\nsandbox = "on"\n')
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    story = repo.story(ALPHA.key)
    assert story["boxed"] is True
    logs = repo.root / ".bmad-loop" / "logs" / repo.status()["run"]["id"] / ALPHA.key
    dev = (logs / "dev-1.log").read_text().splitlines()
    configured = shlex.join(agent_command(repo.script_path))
    assert dev[0].startswith(f"=== bmad-loop dev attempt 1 story {ALPHA.key} started ")
    assert dev[0].endswith(f": {configured} ===") and "bwrap" not in dev[0] and "…" not in dev[0]
    assert dev[1].startswith("=== boxed (bwrap): writable ") and story["worktree"] in dev[1]
    (verify_log,) = [p for p in logs.glob("verify-*.log") if "candidate" not in p.name]
    verify = verify_log.read_text().splitlines()
    assert verify[0].endswith(f": {VERIFY} ===") and "bwrap" not in verify[0]
    assert verify[1].startswith("=== boxed (bwrap): writable ")
    (started,) = [e for e in repo.journal() if e["kind"] == "attempt.started"]
    assert started["data"]["argv"] == agent_command(repo.script_path)
    box_argv = started["data"]["box_argv"]
    assert "bwrap" in box_argv[0] and box_argv[-len(started["data"]["argv"]):] == started["data"]["argv"]


def test_an_unboxed_logs_header_has_no_box_line(make_repo, unboxed):
    repo = make_repo([ALPHA], script={ALPHA.key: {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]}},
                     policy='[gates]\nmode = "none"\n[review]\nenabled = false\n')
    assert repo.cli("run").exit_code == 0
    logs = repo.root / ".bmad-loop" / "logs" / repo.status()["run"]["id"] / ALPHA.key
    dev = (logs / "dev-1.log").read_text().splitlines()
    assert dev[0].endswith(f": {shlex.join(agent_command(repo.script_path))} ===")
    assert not dev[1].startswith("=== boxed")
    (started,) = [e for e in repo.journal() if e["kind"] == "attempt.started"]
    assert "box_argv" not in started["data"]
