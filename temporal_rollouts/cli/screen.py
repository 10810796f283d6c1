"""Tables that fit the terminal: `rollouts list`, `rollouts list ID`, `train list`, fork results.

Ids are what a person copies into the next command, so an id is never cut: when the screen is
too narrow, optional columns go first (the rightmost first), then a row whose id is too long
for the screen gives it a line of its own and its values the next. Output that goes to a pipe
or a file is not fitted to anything: whoever reads it wants each row on one line.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False
    """Right-aligned (numbers)."""
    optional: bool = False
    """Left out when the screen is too narrow for it."""


def screen_width() -> int | None:
    """The terminal's width when stdout is one (or COLUMNS when set); None for a pipe or a file."""
    if "COLUMNS" in os.environ or sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def table_lines(
    columns: list[Column],
    rows: list[tuple[str, ...]],
    width: int | None = None,
    notes: list[list[str]] | None = None,
) -> list[str]:
    """The header and one line per row (two for a row whose id does not fit), at most `width` wide
    wherever the ids allow; the first column holds the ids. `notes`: lines to print under each row."""
    keep = list(range(len(columns)))
    widths = [max([len(column.header), *(len(row[i]) for row in rows)]) for i, column in enumerate(columns)]

    def total(ids: int) -> int:
        return ids + sum(widths[i] for i in keep[1:]) + 2 * (len(keep) - 1)

    if width is not None:
        optional = [i for i in keep if columns[i].optional]
        while total(widths[0]) > width and optional:
            keep.remove(optional.pop())
    id_width = widths[0] if width is None else max(len(columns[0].header), min(widths[0], width - total(0)))

    def line(cells: tuple[str, ...]) -> str:
        parts = [cells[0].ljust(id_width)]
        for i in keep[1:]:
            parts.append(cells[i].rjust(widths[i]) if columns[i].right else cells[i].ljust(widths[i]))
        return "  ".join(parts).rstrip()

    lines = [line(tuple(column.header for column in columns))]
    for index, row in enumerate(rows):
        if len(row[0]) > id_width:
            lines += [row[0], line(("", *row[1:]))]
        else:
            lines.append(line(row))
        for note in notes[index] if notes else []:
            lines += wrapped(note, width)
    return lines


def wrapped(line: str, width: int | None) -> list[str]:
    """`line` wrapped at its words to `width`, the continuations indented under its text."""
    if width is None or len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()) + 2)
    return textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)


def labelled(fields: list[tuple[str, str]], width: int | None = None) -> list[str]:
    """`  label     value` lines, the labels in one column; a value longer than the screen wraps at its
    words under itself, never under the label."""
    indent = 2 + max((len(label) for label, _ in fields), default=0) + 2
    lines = []
    for label, value in fields:
        head = f"  {label.ljust(indent - 4)}  "
        if width is None or indent + len(value) <= width:
            lines.append(head + value)
            continue
        wrapped = textwrap.wrap(value, max(width - indent, 20), break_on_hyphens=False, break_long_words=False)
        lines += [head + wrapped[0], *(" " * indent + line for line in wrapped[1:])]
    return lines


def when(moment: datetime | None) -> str:
    """A start time in local time: the time alone today, the date and time before."""
    if moment is None:
        return "-"
    local = moment.astimezone()
    today = datetime.now().astimezone().date()
    return local.strftime("%H:%M:%S") if local.date() == today else local.strftime("%m-%d %H:%M")
