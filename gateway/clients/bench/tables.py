"""Text tables for the benchmark's reports: cells, terminal layout, GitHub-flavoured Markdown.

Owns the rules every report shares: a missing value is "-"; numbers keep three or four
significant digits; text that came from the server or a file (model names, error examples,
reasons, notes) is escaped so that no control character reaches the terminal (an ANSI escape
in a model name could rewrite the screen) and, in Markdown, no character changes the table's
structure. Columns are aligned by display width, so Chinese text (two columns per character)
lines up too.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.clients.bench.document import real
from gateway.clients.bench.stats import escape_error

MISSING = "-"
#: The longest a free-text cell (error example, reason) may be in a table.
TEXT_LIMIT = 200
#: Characters Markdown gives a meaning inside a table cell or inline text (`&` starts an entity:
#: `&#64;` would render as an `@`).
_MARKDOWN = frozenset("\\`*_[]<>|#&")
#: What GitHub turns into a link or a ping in text (GFM autolinks, @mentions): a backslash
#: does not stop a mention, a code span stops both.
_LINKISH = re.compile(r"@|://|www\.", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Column:
    """A table column: its title (with the unit, "TTFT p50 (ms)") and alignment."""

    title: str
    align: Literal["left", "right"] = "right"


def safe(text: object, limit: int = TEXT_LIMIT) -> str:
    """`text` as printable, one-line text: control characters escaped, cut to `limit` with `…`."""
    return escape_error(str(text), limit)


#: The largest count shown (a hand-edited 10**400 would make one cell 400 columns wide).
_COUNT_LIMIT = 10**18


def _real(value: object) -> float | None:
    # A run file is input: a value of the wrong type, NaN, an infinity or an integer beyond a
    # float is as good as missing.
    return real(value)


def number(value: object, scale: float = 1.0) -> str:
    """`value` x `scale` with 3-4 significant digits ("1234", "12.3", "1.23", "0.0123").

    Anything but a finite number (None, a string from a hand-edited file) is "-".
    """
    found = _real(value)
    if found is None:
        return MISSING
    scaled = found * scale
    if not math.isfinite(scaled):  # 1e308 ms in seconds is no number either
        return MISSING
    size = abs(scaled)
    if size >= 100:
        return f"{scaled:.0f}"
    if size >= 10:
        return f"{scaled:.1f}"
    if size == 0:
        return "0"
    if size >= 1:
        return f"{scaled:.2f}"
    return f"{scaled:.3g}"


def percent(fraction: object, digits: int = 1) -> str:
    """A fraction as a percentage ("12.5%"); "-" for anything but a finite number."""
    found = _real(fraction)
    if found is None or not math.isfinite(found * 100):
        return MISSING
    return f"{found * 100:.{digits}f}%"


def level(value: object) -> str:
    """A load level: a concurrency as an integer, a rate with its decimals; else "-"."""
    found = _real(value)
    return MISSING if found is None else f"{found:g}"


def count(value: object) -> str:
    """A whole count ("12"); "-" for anything else (and for an absurdly large one)."""
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= _COUNT_LIMIT:
        return MISSING
    return str(value)


def width(text: str) -> int:
    """Columns `text` takes in a terminal: East Asian wide and full-width characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, size: int, align: str) -> str:
    fill = " " * (size - width(text))
    return text + fill if align == "left" else fill + text


def text_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """An aligned terminal table: titles, a rule, one line per row (cells already escaped).

    Raises:
        ValueError: A row whose length is not the number of columns.
    """
    _check(columns, rows)
    sizes = [max([width(c.title), *(width(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    lines = ["  ".join(_pad(c.title, s, c.align) for c, s in zip(columns, sizes, strict=True))]
    lines.append("  ".join("-" * s for s in sizes))
    for row in rows:
        cells = zip(row, columns, sizes, strict=True)
        lines.append("  ".join(_pad(cell, s, c.align) for cell, c, s in cells).rstrip())
    return "\n".join(line.rstrip() for line in lines)


def markdown_text(text: str) -> str:
    """`text` rendered as itself in GFM, never as structure, a link or a mention.

    Structural characters get a backslash (as GFM allows). Text GitHub would turn into a link
    or a ping (`https://...`, `www.`, `@team`) becomes a code span instead, with a fence longer
    than any backtick run in it (a `|` stays escaped: tables split cells before code spans).
    """
    if _LINKISH.search(text):
        runs = re.findall(r"`+", text)
        fence = "`" * (max((len(run) for run in runs), default=0) + 1)
        pad = " " if text.startswith("`") or text.endswith("`") else ""
        return fence + pad + text.replace("|", "\\|") + pad + fence
    return "".join("\\" + c if c in _MARKDOWN else c for c in text)


def markdown_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """A GFM table (titles, an alignment row, one line per row); cells get `markdown_text`.

    Raises:
        ValueError: A row whose length is not the number of columns.
    """
    _check(columns, rows)
    lines = ["| " + " | ".join(markdown_text(c.title) for c in columns) + " |"]
    lines.append("|" + "|".join(":---" if c.align == "left" else "---:" for c in columns) + "|")
    lines.extend("| " + " | ".join(markdown_text(cell) for cell in row) + " |" for row in rows)
    return "\n".join(lines)


def _check(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> None:
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"a row of {len(row)} cells in a table of {len(columns)} columns")


def plural(count: int, noun: str) -> str:
    """`1 request`, `2 requests`: a count with its noun in the right number (English `s`)."""
    return f"{count} {noun}" + ("" if count == 1 else "s")
