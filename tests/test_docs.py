"""The README and docs/ pages: every relative link leads to a file that exists, every `#heading` to a heading of it,
and every `#L<n>` link to a line that holds the name the link shows, so that the pages stay true when code moves."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[([^\]]*)\]\(([^)#\s]+)(?:#([^)\s]+))?\)")


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown page."""
    headings = re.findall(r"(?m)^#+ (.+)$", page.read_text())
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_somewhere(page):
    for text, target, anchor in LINK.findall(page.read_text()):
        if "://" in target:
            continue
        path = (page.parent / target).resolve()
        assert path.exists(), f"{page.name}: [{text}]({target}) leads nowhere"
        if anchor and anchor.startswith("L") and anchor[1:].isdigit():
            lines = path.read_text().splitlines()
            line = lines[int(anchor[1:]) - 1] if int(anchor[1:]) <= len(lines) else ""
            assert text.strip("`") in line, f"{page.name}: [{text}]({target}#{anchor}) is not on that line"
        elif anchor:
            assert anchor in heading_anchors(path), f"{page.name}: {target}#{anchor} names no heading"


def test_the_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) < 150
