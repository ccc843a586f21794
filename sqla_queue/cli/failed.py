"""``sqla-queue failed``: the failed jobs, newest first, with their last errors."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from typing import Any

from rich.text import Text

from sqla_queue.admin import failed_jobs
from sqla_queue.checks import INT8_MAX
from sqla_queue.cli.render import (
    TASK_WIDTH,
    Cell,
    Column,
    escape,
    fit_line,
    format_attempts,
    format_time,
    make_console,
    table_lines,
    table_width,
)
from sqla_queue.cli.scaffold import (
    COMMON_EXITS,
    EXIT_OK,
    Subparsers,
    add_command,
    add_json,
    connected,
    iso,
    print_json,
)
from sqla_queue.cli.values import whole_number
from sqla_queue.listing import JobRow, list_jobs

__all__ = [
    "ERROR_LINES",
    "add_failed_parser",
    "error_summary",
    "rows_by_id",
    "run_failed",
    "short_type",
]

FAILED_HELP = f"""\
List failed jobs, the most recently failed first, at most --limit of them: id, task,
attempt (made of allowed), when it failed (UTC) and its last error (type: message).
`sqla-queue requeue` runs them again; --json gives each job's whole last error.

exit status:
  0  printed (also when no job failed)
{COMMON_EXITS}"""


def add_failed_parser(sub: Subparsers) -> None:
    """Add ``failed``."""
    failed = add_command(
        sub,
        "failed",
        run_failed,
        summary="list failed jobs, newest first",
        description=FAILED_HELP,
    )
    failed.add_argument(
        "--limit", type=whole_number(1, INT8_MAX, "--limit"), default=20, help="at most N"
    )
    add_json(failed)


def short_type(name: str) -> str:
    """An exception's recorded type, shorter for a narrow table: a built-in one by its
    name alone (``builtins.RuntimeError`` is ``RuntimeError``), any other one by its name
    and its module's last part (``sqlalchemy.exc.IntegrityError`` is
    ``exc.IntegrityError``). ``--json`` keeps the whole path."""
    module, _, qualname = name.rpartition(".")
    if not module or module == "builtins":
        return qualname
    return f"{module.rpartition('.')[2]}.{qualname}"


def error_summary(error: dict[str, Any] | None) -> str:
    """A last-error entry as one line of text: ``TYPE: MESSAGE`` (``-`` for none), the
    type shortened (:func:`short_type`) so that the message gets the room."""
    if not error:
        return "-"
    return f"{short_type(str(error.get('type', 'error')))}: {error.get('message', '')}"


def rows_by_id(connection: Any, queue: Any, ids: Sequence[int]) -> dict[int, JobRow]:
    """The listing rows of these jobs (ids that no job has are missing), by id."""
    if not ids:
        return {}
    rows = list_jobs(connection, queue.tables, ids=ids, limit=len(ids))
    return {row.id: row for row in rows}


# The error's message is what an operator reads the listing for: the attempt goes first,
# then the time, before the message is cut below its least width.
_FAILED_COLUMNS = (
    Column("id", right=True),
    Column("task", least=TASK_WIDTH),
    Column("attempt", drop=1),
    Column("failed at", drop=2),
    Column("last error", least=24, cut="end"),
)


def run_failed(args: argparse.Namespace) -> int:
    """Run ``sqla-queue failed APP``; returns the exit status."""
    with connected(args) as (queue, connection):
        rows = failed_jobs(connection, queue.tables, limit=args.limit)
        # The allowed attempts, which the failed listing does not carry.
        listed = rows_by_id(connection, queue, [row.id for row in rows])
    if args.json:
        print_json(
            [
                {
                    "id": row.id,
                    "task": row.task,
                    "attempts": row.attempts,
                    "finished_at": iso(row.finished_at),
                    "last_error": row.last_error,
                }
                for row in rows
            ]
        )
        return EXIT_OK
    table: list[Sequence[Cell]] = [
        (
            str(row.id),
            row.task,
            format_attempts(row.attempts, listed[row.id].max_attempts)
            if row.id in listed
            else str(row.attempts),
            format_time(row.finished_at),
            error_summary(row.last_error),
        )
        for row in rows
    ]
    _print_failed(table)
    return EXIT_OK


#: At most this many lines of a failed job's error under its row, in a narrow terminal.
ERROR_LINES = 3


def _print_failed(table: Sequence[Sequence[Cell]]) -> None:
    """The failed jobs as a table; in a terminal too narrow for their errors, each error
    goes under its row instead, indented and wrapped (up to :data:`ERROR_LINES` lines),
    so the message shows, not only the exception's type."""
    console = make_console()
    width = table_width(console)
    if not table:
        console.print("no failed jobs")
        return
    full = table_lines(_FAILED_COLUMNS, table, None)
    if width is None or max(line.cell_len for line in full) <= width:
        for line in full:
            console.print(line)
        return
    lines = table_lines(_FAILED_COLUMNS[:-1], [row[:-1] for row in table], width)
    for index, line in enumerate(lines):
        console.print(line)
        if 1 <= index <= len(table):
            error = escape(table[index - 1][-1])
            parts = textwrap.wrap(error, max(width - 4, 20)) or ["-"]
            if len(parts) > ERROR_LINES:
                parts = [*parts[: ERROR_LINES - 1], " ".join(parts[ERROR_LINES - 1 :])]
            for part in parts:
                console.print(Text("    " + fit_line(part, width - 4), no_wrap=True))
