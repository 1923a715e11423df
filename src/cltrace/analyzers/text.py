"""Text tables for the terminal: one unit per time column (shared by columns compared side by side), names
never cut.

A table fits the terminal by leaving out its least important columns (each column says how
important it is), never by cutting a name: a cut name cannot be found in the timeline.
"""
from __future__ import annotations

import math
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Sequence

UNITS = (("s", 1e9), ("ms", 1e6), ("us", 1e3), ("ns", 1.0))


def fmt_ns(ns: float | None) -> str:
    """One duration with its unit, three significant digits: '2.30 ms'."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "-"
    for unit, scale in UNITS[:-1]:
        if abs(ns) >= scale:
            v = ns / scale
            return f"{v:.{max(0, 2 - int(math.floor(math.log10(abs(v)))))}f} {unit}"
    return f"{ns:.0f} ns"


def fmt_bytes(n: int | None) -> str:
    """A byte count with a binary unit, three significant digits: '1.50 MiB'; exact below 1 KiB."""
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.{max(0, 2 - int(math.floor(math.log10(abs(v)))))}f} {unit}"
    return f"{n} B"


def unit_for(values: Sequence[float | None]) -> tuple[str, float]:
    """The unit a time column is written in: the finest in which its largest value stays under
    100000, so small values keep their digits beside large ones."""
    vals = [abs(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    top = max(vals, default=0.0)
    for unit, scale in reversed(UNITS):
        if top < 1e5 * scale or unit == "s":
            return unit, scale
    return "s", 1e9


def fmt_in(ns: float | None, scale: float) -> str:
    """A duration in a column's unit, without the unit (the header carries it)."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "-"
    if scale == 1.0:
        return f"{ns:.0f}"
    return f"{ns / scale:.1f}" if scale < 1e9 else f"{ns / scale:.3f}"


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


@dataclass
class Column:
    """A table column. ``time`` columns hold ns and get one unit for the column, named in its header;
    time columns of the same ``unit`` group share it (``total A`` beside ``total B`` in one unit), taken
    from the largest value among them. ``keep`` ranks what stays when the terminal is narrow (higher
    stays longer; the first column always stays)."""

    title: str
    time: bool = False
    keep: int = 5
    left: bool = False
    unit: str | None = None


def terminal_width() -> int:
    """``COLUMNS``, else the terminal's width; output to a pipe or file is not narrowed."""
    try:
        cols = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        cols = 0
    if cols:
        return cols
    if not sys.stdout.isatty():
        return 1 << 16
    return shutil.get_terminal_size((120, 24)).columns


def table(columns: Sequence[Column], rows: Sequence[Sequence[Any]], width: int | None = None,
          indent: str = "") -> list[str]:
    """Lines of a table. The first column (names) is never cut; others are dropped, least
    important first, until the table fits ``width`` (the terminal's by default)."""
    width = width or terminal_width()
    cells: list[list[str]] = [[] for _ in rows]
    titles = []
    groups: dict[str, list[Any]] = {}
    for c, col in enumerate(columns):
        if col.time and col.unit is not None:
            groups.setdefault(col.unit, []).extend(r[c] for r in rows)
    for c, col in enumerate(columns):
        if col.time:
            unit, scale = unit_for(groups[col.unit] if col.unit is not None else [r[c] for r in rows])
            titles.append(f"{col.title} {unit}" if col.title else unit)
            for r, row in enumerate(rows):
                cells[r].append(fmt_in(row[c], scale))
        else:
            titles.append(col.title)
            for r, row in enumerate(rows):
                v = row[c]
                cells[r].append("-" if v is None else str(v))
    widths = [max([len(titles[c])] + [len(cells[r][c]) for r in range(len(rows))]) for c in range(len(columns))]
    shown = list(range(len(columns)))

    def total() -> int:
        return len(indent) + sum(widths[c] for c in shown) + 2 * (len(shown) - 1)

    while total() > width and len(shown) > 1:
        shown.remove(min(shown[1:], key=lambda c: (columns[c].keep, -c)))

    def line(vals: Sequence[str]) -> str:
        parts = [vals[c].ljust(widths[c]) if columns[c].left or c == 0 else vals[c].rjust(widths[c]) for c in shown]
        return (indent + "  ".join(parts)).rstrip()

    out = [line(titles)]
    out.extend(line(r) for r in cells)
    return out
