"""Tables that fit the terminal: columns chosen by priority for a given width.

nsq_stat prints a fixed set of columns and lets a narrow terminal wrap them into noise; rich,
left alone, squeezes every column until numbers break over lines. Instead each table here lists
its columns with a priority, and ``fit`` keeps the most important ones whose rendered width fits,
in priority order, stopping at the first that does not (so what is hidden is always "everything
less important than X", never a hole in the middle). The width of a column is computed the way
rich's default box renders it: the widest cell or header, one space of padding on each side and
one border per column plus the closing one. The kept columns are shown in their natural order,
and the table's caption says how many were hidden.

Numbers are shown with thousands separators (``1,234,567``): the point of a table is reading it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
from rich.table import Table
from rich.text import Text

__all__ = ["Column", "fit", "human_count", "human_duration", "make_table"]

PADDING_AND_BORDER = 3
"""Per column in rich's default box table: one space either side and the border to its left."""


@attrs.define
class Column:
    """One column: header, its cells (plain text), justification and priority (0 = first kept)."""

    header: str
    cells: list[str]
    priority: int
    justify: str = "right"

    @property
    def width(self) -> int:
        widest = max((len(line) for c in self.cells for line in c.split("\n")), default=0)
        return max(widest, len(self.header)) + PADDING_AND_BORDER


def fit(columns: Sequence[Column], width: int) -> tuple[list[Column], int]:
    """The columns to show within ``width`` characters (natural order) and how many were hidden.

    The column of priority 0 is always shown, however narrow the terminal.
    """
    chosen: set[int] = set()
    used = 1  # the table's closing border
    for index in sorted(range(len(columns)), key=lambda i: columns[i].priority):
        need = columns[index].width
        if chosen and used + need > width:
            break
        chosen.add(index)
        used += need
    kept = [c for i, c in enumerate(columns) if i in chosen]
    return kept, len(columns) - len(kept)


def make_table(
    title: str, columns: Sequence[Column], width: int, *, bold_rows: Sequence[bool] = ()
) -> Table:
    """A rich table of the columns that fit ``width``; ``bold_rows[i]`` bolds row i's first cell."""
    kept, hidden = fit(columns, width)
    table = Table(title=title, title_justify="left", caption_justify="left")
    if hidden:
        table.caption = f"{hidden} column(s) hidden to fit {width} columns; --json has them all"
    for column in kept:
        table.add_column(column.header, justify=column.justify, no_wrap=True)  # type: ignore[arg-type]
    rows = len(kept[0].cells) if kept else 0
    for i in range(rows):
        cells: list[Text | str] = [Text(c.cells[i]) for c in kept]
        if i < len(bold_rows) and bold_rows[i]:
            cells[0] = Text(kept[0].cells[i], style="bold")
        table.add_row(*cells)
    return table


def human_count(n: int) -> str:
    """``1234567`` -> ``1,234,567``."""
    return f"{n:,}"


def human_bytes(n: int) -> str:
    """``532 B``, ``12.4 KiB``, ``3.1 GiB``: a size in a table cell."""
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def human_duration(seconds: float) -> str:
    """A duration as a person reads it: ``45s``, ``12m05s``, ``3h12m``, ``2d04h``."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
