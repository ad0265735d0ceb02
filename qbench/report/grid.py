"""The neutral table every report view is built from, and its renderings (rich, Markdown, HTML).

A table is built once as a `Grid` (headers, cells, footnotes) and rendered as a rich Table for
the console, a Markdown table for report.md or an HTML table for report.html, so all show the
same figures.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field

from rich import box
from rich.table import Table
from rich.text import Text

Cell = str | tuple[str, str]  # text, or (text, rich style)
NONE = "—"


@dataclass
class Footnotes:
    """Long texts (variant notes, errors) shown as [n] markers in a table and listed below it."""

    texts: list[str] = field(default_factory=list)

    def mark(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"

    def lines(self) -> list[str]:
        return [f"[{i}] {text}" for i, text in enumerate(self.texts, start=1)]


@dataclass
class Grid:
    title: str
    headers: list[str]
    rows: list[list[Cell]]
    right_aligned: frozenset[int] = frozenset()  # column indexes holding numbers
    footer: list[str] = field(default_factory=list)  # lines shown under the table
    footer_style: str = "dim"


# -- formatting ---------------------------------------------------------------------------------


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def figure(value: float, digits: int = 4, sign: str = "") -> str:
    """`digits` decimals, or scientific notation when those would print a non-zero value as zero (a drop of 3e-6
    against a tolerance of 1e-6 must not read "0.0000 > 0.0000"); NaN and infinities spelled out."""
    if not math.isfinite(value):
        return str(value)
    if value != 0 and abs(value) < 0.5 * 10**-digits:
        return f"{value:{sign}.2e}"
    return f"{value:{sign}.{digits}f}"


COMPARED_MAX_DIGITS = 10


def compared(value: float, limit: float, digits: int = 4) -> tuple[str, str]:
    """`value` and the `limit` it is judged against, as `figure` writes them, with as many more decimals as it
    takes for the pair to read right: the limit as set (a tolerance of 5e-05 is not "0.0001") and two different
    numbers as two figures (a drop of 0.00012 against 5e-05 must not read "0.0001 > 0.0001")."""
    for places in range(digits, COMPARED_MAX_DIGITS + 1):
        shown = figure(value, places), figure(limit, places)
        as_set = not math.isfinite(limit) or math.isclose(float(shown[1]), limit, rel_tol=1e-9)
        if as_set and (value == limit or shown[0] != shown[1]):
            break
    return shown


def percent(share: float) -> str:
    """A share as a whole percentage, with two significant digits under 1 % (0.067 %, not "0%"), and with as
    many decimals as it takes near 100 % for a share that is not 100 % not to read as it (99.85 %, not "100%")."""
    if 0 < abs(share) < 0.01:
        return f"{share * 100:.2g}%"
    text = f"{share:.0%}"
    for places in range(1, COMPARED_MAX_DIGITS):
        if abs(share) == 1 or abs(float(text[:-1])) != 100:
            break
        text = f"{share * 100:.{places}f}%"
    return text


def num(value: float | None, digits: int = 4) -> str:
    return figure(value, digits) if finite(value) else NONE


def signed(value: float | None) -> str:
    return figure(value, sign="+") if finite(value) else NONE


def short(value: float | None) -> str:
    """About three significant digits: 0.027, 4.11, 45.0, 1,234."""
    if not finite(value):
        return NONE
    decimals = 3 if value < 1 else 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:,.{decimals}f}"


def rate(value: float | None) -> str:
    if not finite(value):
        return NONE
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def rate_within(value: float | None) -> str:
    """A rate claimed to meet a budget, as `rate` shows it but rounded down: the figure shown is never above the
    rate found (227,530.6 req/s: 227,530; 99.96: 99.9)."""
    if not finite(value):
        return NONE
    return rate(math.floor(value)) if value >= 100 else f"{math.floor(value * 10) / 10:.1f}"


def cell_text(cell: Cell) -> str:
    return cell if isinstance(cell, str) else cell[0]


# -- rendering ----------------------------------------------------------------------------------


def to_rich(grid: Grid) -> Table:
    table = Table(title=grid.title, title_justify="left", caption_justify="left", caption_style=grid.footer_style,
                  box=box.SIMPLE_HEAD)  # fmt: skip
    for index, header in enumerate(grid.headers):
        table.add_column(header, justify="right" if index in grid.right_aligned else "left", overflow="fold")
    for row in grid.rows:
        table.add_row(*(Text(c) if isinstance(c, str) else Text(c[0], style=c[1]) for c in row))
    if grid.footer:  # one line each, never folded at the table's width (a CI log keeps a message or path whole)
        table.caption = Text("\n".join(grid.footer), style=grid.footer_style, no_wrap=True, overflow="ignore")
    return table


_CODE_SPAN = re.compile(r"(`[^`\n]*`)")
# What CommonMark would read as an escape (a backslash before punctuation), HTML or an autolink, an entity, a link.
_MD_ACTIVE = re.compile(r"\\(?=[!-/:-@\[-`{-~])|[<&]|\](?=\()")


def md_cell(text: str) -> str:
    """`text` as one line of Markdown (a table cell or a list item) that renders as the text itself: names from the
    user's data and recipe reach the reports and GitHub's job summary, where `<b>` would render (and `<script>`
    vanish), `[x](url)` become a link, `&amp;` read as `&`, and a backslash before a `|` (`a\\|b`) be taken as the
    pipe's escape and lost. Outside the `code` spans qbench's own texts mark names with, each such character is
    backslash-escaped; a `|` is escaped everywhere (GFM splits table cells before it reads code spans, and takes
    the escape there too); newlines become spaces. Emphasis (`*`, `_`) is left as is: qbench's own cells use it,
    and the text still reads as written."""
    parts = _CODE_SPAN.split(text.replace("\r", " ").replace("\n", " "))
    plain = [part if index % 2 else _MD_ACTIVE.sub(r"\\\g<0>", part) for index, part in enumerate(parts)]
    return "".join(plain).replace("|", "\\|")


def markdown_table(grid: Grid) -> list[str]:
    lines = ["| " + " | ".join(md_cell(h) for h in grid.headers) + " |"]
    lines.append("|" + "|".join("---:" if i in grid.right_aligned else "---" for i in range(len(grid.headers))) + "|")
    lines.extend("| " + " | ".join(md_cell(cell_text(c)) for c in row) + " |" for row in grid.rows)
    if grid.footer:
        lines.append("")
        lines.extend(f"- {md_cell(line)}" for line in grid.footer)
    return lines


def to_markdown(grid: Grid) -> str:
    return "\n".join([f"## {grid.title}", "", *markdown_table(grid)]) + "\n"


def html_inline(text: str) -> str:
    """Escaped text with Markdown's `code` spans as <code> (the report texts mark names that way)."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text))


def to_html(grid: Grid, section_id: str, heading: str = "h2") -> str:
    """A <section> with the grid's title (as `heading`), an HTML table (numbers right-aligned) and its footer
    as a list."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in grid.headers)
    rows = []
    for row in grid.rows:
        cells = "".join(f'<td class="num">{html_inline(cell_text(c))}</td>' if i in grid.right_aligned
                        else f"<td>{html_inline(cell_text(c))}</td>" for i, c in enumerate(row))  # fmt: skip
        rows.append(f"<tr>{cells}</tr>")
    lines = [f'<section id="{section_id}">', f"<{heading}>{html.escape(grid.title)}</{heading}>",
             f"<table><thead><tr>{head}</tr></thead>", "<tbody>", *rows, "</tbody></table>"]  # fmt: skip
    if grid.footer:
        lines += ['<ul class="meta">', *(f"<li>{html_inline(line)}</li>" for line in grid.footer), "</ul>"]
    return "\n".join([*lines, "</section>"])
