"""The documentation as the tests read it: README.md (the front page) and the pages under docs/, one after another.

A fact the tests look for may sit on any page: the README is a summary that links to the pages holding the detail.
`broken_links` checks that every Markdown link between them leads to a file that exists and, where it names one, to
an anchor that page has (a heading's GitHub slug, or an `<a id>`).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def documentation_files() -> list[Path]:
    """README.md first, then every page under docs/ by name."""
    return [README, *sorted(DOCS.glob("*.md"))]


def documentation_text() -> str:
    """Every page's text, each starting on a line of its own."""
    return "\n".join(path.read_text() for path in documentation_files())


def located(path: Path, text: str, offset: int) -> str:
    """`docs/ci.md:12`: where an offset into a page's text is, for a failure message."""
    return f"{path.relative_to(ROOT)}:{text[:offset].count(chr(10)) + 1}"


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans, which hold no links."""
    text = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"(`+).*?(?<!`)\1(?!`)", "", text)


def heading_slug(title: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces as hyphens."""
    title = re.sub(r"<[^>]+>", "", title).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors a Markdown page defines: its headings' slugs (a repeated one numbered -1, -2 as GitHub does)
    and its `<a id="...">` / `<a name="...">` tags."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    without_code = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.MULTILINE | re.DOTALL)
    for heading in re.finditer(r"^#{1,6} +(.+?) *#*$", without_code, re.MULTILINE):
        slug = heading_slug(heading.group(1))
        found.add(slug if slug not in counts else f"{slug}-{counts[slug]}")
        counts[slug] = counts.get(slug, 0) + 1
    found |= set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", without_code))
    return found


def broken_links(files: list[Path]) -> list[str]:
    """Each relative link of the files (`[text](target)`, outside code) whose file or anchor does not exist, as
    `page:line: target (why)`."""
    broken = []
    for page in files:
        text = page.read_text()
        prose = _prose(text)
        for link in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", prose):
            target = link.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked here
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.name}: {target}"
            if not file.exists():
                broken.append(f"{where} (no file {path})")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                broken.append(f"{where} (no anchor #{anchor} in {file.name})")
    return broken
