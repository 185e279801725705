"""`max_parallel = 1` behaves exactly like the sequential loop, recorded as a golden file.

The golden file holds the target's first-parent sequence of tree SHAs (trees depend only on
content, so they are reproducible) and the journal's event kinds in order. Regenerate it on
purpose with UPDATE_GOLDEN=1 and review the diff.
"""

import json
import os
from pathlib import Path

import pytest

from support import StoryDef

GOLDEN = Path(__file__).parent / "golden" / "sequential.json"

SPRINT = [
    StoryDef("1-1-alpha", files=["src/alpha.py"]),
    StoryDef("1-2-beta", files=["src/beta.py", "src/alpha.py"]),
    StoryDef("1-3-gamma", files=["src/gamma.py"]),
    StoryDef("2-1-delta", files=["src/delta.py"]),
]
SCRIPT = {
    "1-1-alpha": {"dev": [{"write": {"src/alpha.py": "A = 1\n"}}]},
    "1-2-beta": {"dev": [{"write": {"src/beta.py": "B = 2\n", "src/alpha.py": "A = 11\n"}}]},
    "1-3-gamma": {"dev": [{"write": {"src/gamma.py": "G = 3\n"}}],
                  "review": [{"exit": 1, "say": "rename it"}, {"exit": 0}],
                  "fix": [{"write": {"src/gamma.py": "GAMMA = 3\n"}}]},
    "2-1-delta": {"dev": [{"write": {"src/delta.py": "D = 4\n"}}]},
}
POLICY = '[scm]\nmax_parallel = {n}\nmerge_strategy = "merge"\n[gates]\nmode = "none"\n'


def _record(make_repo, n: int, name: str) -> dict:
    repo = make_repo(SPRINT, script=SCRIPT, policy=POLICY.format(n=n), name=name)
    result = repo.cli("run")
    assert result.exit_code == 0, result.output
    return {"trees": [c["tree"] for c in repo.first_parent_trees()],
            "kinds": [e["kind"] for e in repo.journal()]}


def test_max_parallel_one_reproduces_the_recorded_sequential_loop(make_repo):
    observed = _record(make_repo, 1, "seq")
    if os.environ.get("UPDATE_GOLDEN") == "1" or not GOLDEN.exists():
        GOLDEN.write_text(json.dumps(observed, indent=1) + "\n")
        if not os.environ.get("UPDATE_GOLDEN"):
            pytest.fail("golden file was missing and has been written; review and commit it")
    golden = json.loads(GOLDEN.read_text())
    assert observed["trees"] == golden["trees"]
    assert observed["kinds"] == golden["kinds"]


def test_parallel_runs_end_with_the_same_target_trees_in_the_same_order(make_repo):
    golden = json.loads(GOLDEN.read_text())
    observed = _record(make_repo, 3, "par")
    assert observed["trees"] == golden["trees"]
