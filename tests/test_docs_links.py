"""Every link between the project's Markdown pages lands: the linked file exists, and a link's
#anchor is a heading of that page (GitHub's anchor rule, the one the config page uses). Pages
are renamed and headings reworded as the project grows; a link left behind fails here."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.config_page import heading_anchor
from tests.helpers import REPO

PAGES = sorted([REPO / "README.md", REPO / "scripts" / "README.md", *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s#]*)(?:#([^)\s]+))?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # a '#' in a code block is no heading
    return {heading_anchor(h) for h in HEADING.findall(text)}


def broken_links(pages: list[Path], root: Path = REPO) -> list[str]:
    """'page: target#anchor' for each relative link whose file or heading is missing."""
    broken = []
    for page in pages:
        for target, anchor in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            linked = (page.parent / target).resolve() if target else page
            if not linked.exists():
                broken.append(f"{page.relative_to(root)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(root)}: {target}#{anchor}")
    return broken


def test_every_link_between_the_pages_lands():
    assert PAGES and broken_links(PAGES) == []


def test_a_link_to_a_missing_heading_or_page_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## Its `part` (two)\n\n```\n# not a heading\n```\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#its-part-two) [ok](#b) [gone](a.md#not-a-heading) [none](c.md) [web](https://x.org/#y)\n# B\n"
    )
    assert broken_links([tmp_path / "b.md"], tmp_path) == ["b.md: a.md#not-a-heading", "b.md: c.md"]
