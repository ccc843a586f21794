"""How the command line shows what it read: one place used by every printer.

Text from the database (task names, keys, error messages, payloads, worker host names) is
never printed raw. A control character in it would reach the operator's terminal as a
command: ``\\x1b[2J`` clears the screen, ``\\x9b`` is a one-byte CSI, a right-to-left
override reorders what follows. :func:`escape` shows each one as a visible escape
(``\\x1b``); the tables, the lines, the error messages and the JSON all go through it.

Times, attempts and durations each have one formatter (:func:`format_time`,
:func:`format_attempts`, :func:`format_duration`), so every command shows them alike.

Tables fit the terminal (:func:`table_lines`): when the columns do not fit, the least
useful ones go first, and long names lose their middle, never the whole. Printed to a pipe
or a file, a table assumes no width: every column, one row per line, nothing cut.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TextIO

from sqla_queue._durations import format_duration

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

__all__ = [
    "TASK_WIDTH",
    "Cell",
    "Column",
    "EscapingFormatter",
    "escape",
    "fit_line",
    "format_attempts",
    "format_duration",
    "format_time",
    "json_text",
    "make_console",
    "print_table",
    "say",
    "table_lines",
    "table_width",
    "wrap_items",
]

# DEL and the C1 controls, the line and paragraph separators, the bidirectional controls
# (they reorder what a reader sees), and lone surrogates (no terminal encoding writes them).
_NOT_C0 = r"\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
# Every control character, C0 included: for one line (a table cell).
_UNSAFE_CHAR = re.compile(rf"[\x00-\x1f{_NOT_C0}]")
# The same, but newlines and tabs stay: for multi-line text such as a traceback.
_UNSAFE_IN_LINES = re.compile(rf"[\x00-\x08\x0b-\x1f{_NOT_C0}]")
# What JSON output must still escape: json.dumps escapes the C0 controls, not the rest.
_UNSAFE_IN_JSON = re.compile(f"[{_NOT_C0}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape(text: object, *, multiline: bool = False) -> str:
    """``text`` (any object, as ``str``) with every control character shown as an escape.

    ``\\x1b`` for ESC, ``\\x9b`` for a C1 control, ``\\n`` for a newline (so that a table
    row stays one line), ``\\u202e`` for a bidirectional override. With ``multiline``,
    newlines and tabs stay as they are (a traceback); a carriage return is still escaped,
    since it would let a line overwrite the one shown before it.
    """
    pattern = _UNSAFE_IN_LINES if multiline else _UNSAFE_CHAR
    return pattern.sub(_visible, str(text))


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def json_text(value: object, *, indent: int | None = 2) -> str:
    """``value`` as JSON, non-ASCII text readable, control characters as ``\\uXXXX``.

    ``json.dumps(..., ensure_ascii=False)`` escapes only the C0 controls; DEL, the C1
    controls (``\\x9b`` starts a terminal command) and the other characters that
    :func:`escape` shows are escaped here too. They can only occur inside JSON strings, so
    the document stays valid JSON with the same values.
    """
    dumped = json.dumps(value, indent=indent, ensure_ascii=False)
    return _UNSAFE_IN_JSON.sub(_json_escape, dumped)


def say(text: object, *, file: TextIO | None = None) -> None:
    """Print ``text`` escaped (newlines kept) on ``file``, stdout by default."""
    print(escape(text, multiline=True), file=file if file is not None else sys.stdout)


def format_time(value: dt.datetime | None) -> str:
    """A time as every command shows it: UTC, to the second, ``2026-12-03 19:04:05Z``.

    ``-`` for ``None``. A naive value is taken as UTC (the database's timestamps carry
    their zone). ``--json`` gives the full ISO 8601 value instead.
    """
    if value is None:
        return "-"
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    return value.strftime("%Y-%m-%d %H:%M:%SZ")


def format_attempts(made: int, allowed: int) -> str:
    """Attempts as every command shows them: ``2 of 5`` (made, then allowed)."""
    return f"{made} of {allowed}"


# -- consoles -------------------------------------------------------------------------------


def make_console(file: TextIO | None = None) -> Console:
    """A rich console that prints text as given: no markup, emoji codes, highlighting or
    wrapping (a task named ``[red]`` or ``:fire:`` shows as such; a row is one line)."""
    from rich.console import Console

    return Console(file=file, markup=False, emoji=False, highlight=False, soft_wrap=True)


def _columns_from_environment() -> int | None:
    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isascii() and value.isdigit() and int(value) > 0 else None


def table_width(console: Console) -> int | None:
    """The width a table must fit on ``console``: the terminal's, or ``$COLUMNS`` when set.

    ``None`` for a pipe or a file without ``$COLUMNS``: no width is assumed there, so
    nothing is cut or left out, and each row stays on one line.
    """
    if console.is_terminal or _columns_from_environment() is not None:
        return console.width
    return None


# -- tables ---------------------------------------------------------------------------------

#: Task names up to this many characters are never cut; longer ones are cut to the room
#: left, at this width or wider, only when the terminal is too narrow for them.
TASK_WIDTH = 32

#: A table cell: its text, or its text and a rich style (``"bold red"``).
Cell = str | tuple[str, str]

_GAP = "  "
_ELLIPSIS = "…"


@dataclass(frozen=True)
class Column:
    """One column of a table: its header and how it gives way in a narrow terminal."""

    header: str
    #: Right-aligned (numbers).
    right: bool = False
    #: When the table is too wide, columns go in this order (1 first; the rightmost first
    #: on a tie). None: the column always shows.
    drop: int | None = None
    #: A column of long texts (names, errors) may be cut to this width, no narrower; the
    #: room left once every shown column has its width widens it first. None: never cut.
    least: int | None = None
    #: Where a cut text loses characters: names their middle (both ends tell them apart),
    #: messages their end.
    cut: Literal["middle", "end"] = "middle"
    #: The texts that say "nothing here" in this column. A droppable column whose every
    #: row holds one of them (``finished`` of jobs not finished, a count of zero) goes
    #: before any column that holds a value, whatever its ``drop``: a narrow terminal
    #: keeps what it can show, and cuts nothing to keep a column of dashes.
    blank: tuple[str, ...] = ("-",)
    #: A cut column (``least``) whose whole text matters more than the droppable columns:
    #: they go, in their order, before it is cut (a wait's ``signal:payment_received``
    #: before a column of versions). It is cut only once none is left to drop.
    whole: bool = False


def _cell_len(text: str) -> int:
    from rich.cells import cell_len

    return cell_len(text)


def _take(chars: Iterable[str], width: int) -> str:
    """The longest prefix of ``chars`` that fits ``width`` terminal cells."""
    taken: list[str] = []
    used = 0
    for char in chars:
        used += _cell_len(char)
        if used > width:
            break
        taken.append(char)
    return "".join(taken)


def fit_line(text: str, width: int | None, *, cut: Literal["middle", "end"] = "end") -> str:
    """``text`` cut to ``width`` terminal cells with an ellipsis (as is when it fits)."""
    if width is None or _cell_len(text) <= width:
        return text
    if width <= 1:
        return _ELLIPSIS[:width]
    if cut == "end":
        return _take(text, width - 1) + _ELLIPSIS
    tail = (width - 1) // 2
    head = width - 1 - tail
    return _take(text, head) + _ELLIPSIS + _take(reversed(text), tail)[::-1]


def _layout(
    columns: Sequence[Column],
    natural: list[int],
    width: int | None,
    blank: Sequence[bool] = (),
) -> dict[int, int]:
    """The columns to show (by index) and the width of each, for a table of ``width``.

    ``blank[i]`` says that column ``i`` holds no value in any row: such droppable columns
    go first, then the others in their ``drop`` order."""
    empty = list(blank) or [False] * len(columns)
    least = [
        max(min(size, column.least), _cell_len(column.header)) if column.least is not None else size
        for column, size in zip(columns, natural, strict=True)
    ]
    shown = list(range(len(columns)))
    if width is None:
        return {index: natural[index] for index in shown}

    whole = {index for index, column in enumerate(columns) if column.whole}

    def needed(*, whole_too: bool = False) -> int:
        sizes = (
            natural[index] if whole_too and index in whole else least[index] for index in shown
        )
        return sum(sizes) + len(_GAP) * (len(shown) - 1)

    droppable = sorted(
        (not empty[index], column.drop, -index)
        for index, column in enumerate(columns)
        if column.drop is not None
    )
    for _, _, negative_index in droppable:
        if needed(whole_too=True) <= width:
            break
        if -negative_index in whole and needed() <= width:
            continue  # a whole column is cut, not dropped, while the table fits
        shown.remove(-negative_index)
    widths = {index: least[index] for index in shown}
    spare = width - needed()
    # Room left widens the cut columns, leftmost (the name) first.
    for index in shown:
        grow = max(0, min(natural[index] - widths[index], spare))
        widths[index] += grow
        spare -= grow
    return widths


def _split(cell: Cell) -> tuple[str, str]:
    text, style = cell if isinstance(cell, tuple) else (cell, "")
    return escape(text), style


def table_lines(
    columns: Sequence[Column], rows: Iterable[Sequence[Cell]], width: int | None
) -> list[Text]:
    """A table as lines: a bold header, then one line per row, columns two spaces apart.

    Every cell is escaped (:func:`escape`). With a ``width`` (a terminal), no line is wider:
    columns go in their ``drop`` order, long texts are cut to their ``least`` width at the
    narrowest, and a last line names the columns left out. Without one (a pipe), every
    column shows in full.
    """
    from rich.text import Text

    header: list[tuple[str, str]] = [(column.header, "bold") for column in columns]
    body = [[_split(cell) for cell in row] for row in rows]
    natural = [
        max(_cell_len(text) for text, _ in (header[index], *(row[index] for row in body)))
        for index in range(len(columns))
    ]
    blank = [
        bool(body) and all(row[index][0] in column.blank for row in body)
        for index, column in enumerate(columns)
    ]
    widths = _layout(columns, natural, width, blank)
    lines = []
    for row in (header, *body):
        line = Text(no_wrap=True)
        for position, (index, size) in enumerate(widths.items()):
            text, style = row[index]
            shown = fit_line(text, size, cut=columns[index].cut)
            pad = " " * (size - _cell_len(shown))
            if position:
                line.append(_GAP)
            if columns[index].right:
                line.append(pad)
            line.append(shown, style=style)
            if not columns[index].right and position < len(widths) - 1:
                line.append(pad)
        lines.append(line)
    hidden = [column.header for index, column in enumerate(columns) if index not in widths]
    if hidden:
        note = f"(hidden, too narrow: {', '.join(hidden)}; --json shows all)"
        # Wrapped, never cut: the note names what is missing, and where to find it.
        for part in textwrap.wrap(note, width) if width and width > 20 else [note]:
            lines.append(Text(fit_line(part, width), style="dim", no_wrap=True))
    return lines


def print_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    *,
    empty: str,
    console: Console | None = None,
) -> None:
    """Print a table fitted to the terminal (see :func:`table_lines`), or ``empty`` when
    there are no rows."""
    console = console if console is not None else make_console()
    if not rows:
        console.print(escape(empty))
        return
    for line in table_lines(columns, rows, table_width(console)):
        console.print(line)


def wrap_items(items: Sequence[Cell], width: int | None) -> list[Text]:
    """Short items on lines two spaces apart, a new line when the next does not fit."""
    from rich.text import Text

    lines = [Text(no_wrap=True)]
    for item in items:
        text, style = _split(item)
        text = fit_line(text, width)
        current = lines[-1]
        if current.plain and width is not None and current.cell_len + 2 + _cell_len(text) > width:
            current = Text(no_wrap=True)
            lines.append(current)
        if current.plain:
            current.append(_GAP)
        current.append(text, style=style)
    return lines


class EscapingFormatter(logging.Formatter):
    """A log formatter whose lines are escaped (:func:`escape`, newlines kept): a log
    record carries handlers' error messages and task names to the operator's terminal."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as the base formatter writes it, control characters escaped."""
        return escape(super().format(record), multiline=True)
