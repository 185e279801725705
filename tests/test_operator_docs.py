"""The operator's documents say what the code does: the run synopsis lists every option of
`run`, the command table every command, the placeholder table every agent phase, the generated
policy every placeholder, and `--ci` is described the same in --help and operations.md."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from bmad_loop.agents.adapter import PLACEHOLDERS
from bmad_loop.cli import cli
from bmad_loop.policy import default_policy_text
from bmad_loop.states import AGENT_PHASES

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end >= 0 else None]


def test_cli_md_synopses_list_every_option_of_run_and_resume_and_the_table_every_command():
    cli_md = (DOCS / "cli.md").read_text()
    for name in ("run", "resume"):
        synopsis = _section(cli_md, f"## bmad-loop {name}\n").split("```")[1]
        options = [o for p in cli.commands[name].params for o in p.opts if o.startswith("--")]
        missing = [o for o in options if o not in synopsis and o != "--help"]
        assert not missing, f"{name} synopsis lacks {missing}"
    table = cli_md[:cli_md.index("## Exit codes")]
    missing = [c for c in cli.commands if f"[`{c}`](#bmad-loop-{c})" not in table]
    assert not missing, f"the command table lacks {missing}"


def test_the_phase_placeholder_lists_every_agent_phase_and_the_template_every_placeholder():
    config = (DOCS / "configuration.md").read_text()
    row = next(line for line in config.splitlines() if line.startswith("| `{phase}` |"))
    assert all(f"`{phase}`" in row for phase in AGENT_PHASES), row
    comment = default_policy_text()
    assert all(f"{{{name}}}" in comment for name in PLACEHOLDERS)


def test_ci_flag_is_described_alike_in_help_and_operations_md():
    help_text = " ".join(CliRunner().invoke(cli, ["run", "--help"]).output.split())
    operations = " ".join((DOCS / "operations.md").read_text().split())
    assert "behaves the same without it" in help_text
    assert "`run` behaves the same without it" in operations
    assert "in this version it changes nothing" not in operations


def test_operations_md_says_how_a_shared_checkout_and_the_lane_behave():
    operations = " ".join((DOCS / "operations.md").read_text().split())
    assert re.search(r"each state database has an id", operations, re.I)
    assert "each advance of the lane moves that branch **and that working tree**" in operations


def test_the_readme_quick_start_warns_of_the_first_gate():
    readme = " ".join((DOCS.parent / "README.md").read_text().split())
    assert "per-epic" in readme and "stops at the end of each epic" in readme
