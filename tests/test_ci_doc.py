"""docs/ci.md's workflow installs bmad-loop the way a fresh runner can: from its repository.

No package named bmad-loop is published on an index, so `pip install bmad-loop` on a runner
fails (or, worse, installs somebody else's package of that name). Every `pip install` in the
doc must name bmad-loop by a direct reference (`bmad-loop @ git+https://…`) or a local path.
"""

import re
import shlex
import tomllib
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

ROOT = Path(__file__).resolve().parent.parent
CI_DOC = ROOT / "docs" / "ci.md"


def _project_name() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]


def _pip_installs(text: str) -> list[list[str]]:
    """The arguments of every `pip install` command in the doc's code blocks."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    found = []
    for block in blocks:
        for line in block.splitlines():
            command = line.split("#", 1)[0] if not line.strip().startswith("#") else ""
            if "pip install" not in command:
                continue
            args = shlex.split(command.split("pip install", 1)[1])
            found.append([a for a in args if not a.startswith("-")])
    return found


def _from_an_index(arg: str, name: str) -> bool:
    """Would pip look `arg` up on a package index as the project `name`?"""
    if arg.startswith((".", "/", "~")) or "://" in arg and " @ " not in arg:
        return False  # a path or a bare URL: pip builds it from there
    try:
        requirement = Requirement(arg)
    except InvalidRequirement:
        return False  # not a requirement at all (a path pip resolves itself)
    return requirement.name.lower() == name.lower() and requirement.url is None


def test_the_ci_workflow_installs_bmad_loop_from_its_repository_not_an_index():
    name = _project_name()
    installs = _pip_installs(CI_DOC.read_text())
    ours = [args for args in installs if any(name in a for a in args)]
    assert ours, "docs/ci.md no longer shows how to install bmad-loop"
    for args in ours:
        for arg in args:
            assert not _from_an_index(arg, name), f"docs/ci.md: `pip install {arg}` needs a package index"
    references = [Requirement(a) for args in ours for a in args if " @ " in a]
    assert references, "the workflow should install bmad-loop by a direct reference"
    for requirement in references:
        assert requirement.name == name
        assert requirement.url.startswith("git+https://") and "@" in requirement.url.split("://", 1)[1]


def test_the_check_itself_tells_an_index_install_from_a_repository_one():
    # What the doc said before: the test above must fail on it.
    assert _pip_installs("```yaml\n  run: |\n    pip install bmad-loop\n```") == [["bmad-loop"]]
    assert _from_an_index("bmad-loop", "bmad-loop")
    assert _from_an_index("bmad-loop[tui]>=0.1", "bmad-loop")
    assert not _from_an_index("bmad-loop @ git+https://github.com/o/bmad-loop.git@v1", "bmad-loop")
    assert not _from_an_index("./bmad-loop", "bmad-loop")
    assert not _from_an_index("textual", "bmad-loop")
