"""The documentation holds together: every link between README.md and the docs/ pages leads to a file and an anchor
that exist, and every page is listed on the front page, so moving a section cannot leave a reader at a dead end."""

from __future__ import annotations

import re
from pathlib import Path

from docs_text import DOCS, README, anchors, broken_links, documentation_files, heading_slug


def test_every_link_of_the_documentation_resolves():
    assert len(documentation_files()) > 5  # the front page and its pages, not the README alone
    assert not broken_links(documentation_files())


def test_every_docs_page_is_linked_from_the_readme():
    pages = {page.name for page in DOCS.glob("*.md")}
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)(?:#[^)]*)?\)", README.read_text()))
    assert pages and linked >= pages, sorted(pages - linked)


def test_a_missing_file_or_anchor_is_reported(tmp_path: Path):
    """The check is not vacuous: a link to a page that is not there, or to a heading it lacks, is named; a heading,
    a repeated heading's numbered slug and an `<a id>` resolve; links in code are no links."""
    (tmp_path / "other.md").write_text("# Other\n\n## Tolerances: `max_drop`\n\n## Notes\n\n## Notes\n\n"
                                       '<a id="too-few-rows"></a>**Too few rows.** text\n')  # fmt: skip
    page = tmp_path / "page.md"
    page.write_text("See [a](other.md#tolerances-max_drop), [b](other.md#notes-1), [c](other.md#too-few-rows),\n"
                    "[d](#here), [e](missing.md), [f](other.md#gone), [g](https://example.com/x#y).\n\n## Here\n\n"
                    "```\n[h](nowhere.md)\n```\n`[i](url)`\n")  # fmt: skip
    assert broken_links([page]) == ["page.md: missing.md (no file missing.md)",
                                    "page.md: other.md#gone (no anchor #gone in other.md)"]  # fmt: skip


def test_heading_slugs_follow_githubs_rule():
    assert heading_slug("A 4-GPU-kind × 50-variant sweep on Kubernetes (KubeRay)") == (
        "a-4-gpu-kind--50-variant-sweep-on-kubernetes-kuberay")
    assert heading_slug("On a GPU: what was checked, and how faithful the CPU figures are") == (
        "on-a-gpu-what-was-checked-and-how-faithful-the-cpu-figures-are")
    assert anchors("# T\n```\n# not a heading\n```\n## T\n") == {"t", "t-1"}
