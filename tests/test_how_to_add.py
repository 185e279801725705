"""docs/how-to-add.md stays true: every file its tables name exists and holds the names the table
says it holds, the profile keys it lists are exactly a profile's keys (and the shipped profiles
set the ones it calls required), and every policy key is in docs/configuration.md, as it says."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

from bmad_loop.agents.profiles import Profile
from bmad_loop.policy import SECTIONS, Policy

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "how-to-add.md"
PROFILES = ROOT / "src" / "bmad_loop" / "agents" / "profiles"
# A name a table says a file holds: CamelCase, ALL_CAPS or snake_case with an underscore (a
# plain lowercase word such as `kind` or `redis` is prose, not a name to look for).
CODE_NAME = re.compile(r"[A-Z][a-z0-9]+[A-Z]\w*|[A-Z][A-Z0-9_]{2,}|[a-z][a-z0-9]*_\w+")


def tables(header: str) -> list[list[list[str]]]:
    """Every markdown table of the page whose header row is `header`, as rows of cells."""
    found, rows = [], None
    for line in PAGE.read_text().splitlines():
        if line.strip() == header:
            rows = []
            found.append(rows)
        elif rows is not None and line.startswith("|"):
            if not set(line) <= set("|- "):
                rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        else:
            rows = None
    return found


def test_every_file_the_page_names_exists_and_holds_the_names_it_says():
    file_tables = tables("| file | what to change |")
    assert len(file_tables) == 5  # one per thing to add
    checked = 0
    for rows in file_tables:
        for cells in rows:
            path = re.fullmatch(r"`([^`]+)`", cells[0])
            if path is None:  # "the module that records it": named by its job, not a path
                continue
            files = sorted(ROOT.glob(path.group(1)))
            assert files, f"how-to-add.md names {path.group(1)}, which does not exist"
            text = " ".join(f.read_text() for f in files)
            for name in re.findall(r"`([A-Za-z_]\w*)`", cells[1]):
                if CODE_NAME.fullmatch(name):
                    assert re.search(rf"\b{name}\b", text), f"{path.group(1)} does not hold {name}"
                    checked += 1
    assert checked > 20  # the scan sees the names


def test_the_profile_keys_are_a_profiles_keys_and_the_shipped_profiles_set_the_required_ones():
    (rows,) = tables("| key | every shipped profile sets it | meaning |")
    listed = {re.fullmatch(r"`(\w+)`", cells[0]).group(1): cells[1] == "yes" for cells in rows}
    assert set(listed) == {f.name for f in dataclasses.fields(Profile)} - {"name"}
    shipped = sorted(PROFILES.glob("*.toml"))
    assert shipped
    for path in shipped:
        keys = set(tomllib.loads(path.read_text()))
        assert keys <= set(listed), f"{path.name} has keys the page does not list"
        assert {k for k, required in listed.items() if required} <= keys, path.name


def test_every_policy_key_is_in_its_section_of_configuration_md():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    policy = Policy()
    missing = []
    for section in SECTIONS:
        body = re.search(rf"^### `\[{section}\]`\n(.*?)(?=^### |^## |\Z)", doc, re.M | re.S)
        assert body, f"configuration.md has no section [{section}]"
        for f in dataclasses.fields(getattr(policy, section)):
            if f.metadata.get("rest"):  # the section's other keys: capacities, overrides
                continue
            row = re.search(rf"^\| `{f.name}` \|", body.group(1), re.M)
            table = f"`[{section}.{f.name}]`" in body.group(1) or f"`[{section}.{f.name}." in body.group(1)
            if not (row or table):
                missing.append(f"[{section}] {f.name}")
    assert missing == []
