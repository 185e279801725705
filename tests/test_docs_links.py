"""Every relative link in the docs reaches its page and its section.

docs/*.md and README.md link to each other by path and by GitHub's heading anchors
(`#the-life-of-a-story`); a section that moves to a page of its own breaks the links to it. This
test follows each one: the file must exist, and a `#fragment` into a markdown page must be the
anchor of one of its headings (code blocks are not headings)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"(`{3,}|~{3,})")


def pages() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen, fence = set(), {}, None
    for line in page.read_text().splitlines():
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif line.strip() == m.group(1) and m.group(1).startswith(fence):
                fence = None
            continue
        heading = None if fence else re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            slug = anchor(heading.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links() -> list[str]:
    broken = []
    for page in pages():
        for m in LINK.finditer(page.read_text()):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not linked.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                broken.append(f"{where} (no such section)")
    return broken


def test_every_relative_link_reaches_its_page_and_section():
    assert broken_links() == []


def test_anchors_follow_github_and_skip_code_blocks(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Why SQLite with `BEGIN IMMEDIATE`\n## A story's own verify\n## Twice\n"
                    "## Twice\n````markdown\n## Footprint\n```yaml\n```\n````\n")
    assert anchors(page) == {"why-sqlite-with-begin-immediate", "a-storys-own-verify", "twice",
                             "twice-1"}
