"""``sqla-queue maintain``: create the partitions of a partitioned history ahead of time,
and list them (see :mod:`sqla_queue.history`)."""

from __future__ import annotations

import argparse

from sqla_queue.cli.render import Column, format_time, print_table, say
from sqla_queue.cli.scaffold import (
    EXIT_OK,
    Subparsers,
    add_command,
    add_json,
    connected,
    print_json,
)
from sqla_queue.cli.values import whole_number
from sqla_queue.history import history_partitions, maintain_history

__all__ = ["MAINTAIN_HELP", "add_maintain_parser", "run_maintain"]

MAINTAIN_HELP = """\
Create the partitions of finished jobs for the current interval and the next few, moving
into them any finished job that waits in a default partition, then list the partitions.
Workers do this in the background when their role owns the jobs table; with least-privilege
roles, run it as the migration role from cron or a deploy step, more often than the
interval (hourly for daily partitions). Only for Queue(history="partitioned").

exit status:
  0  the partitions exist
  1  the database could not be reached or refused the command
  2  a usage error, or a queue whose history is not partitioned (nothing was done)"""


def add_maintain_parser(sub: Subparsers) -> None:
    """Add the ``maintain`` sub-command to the ``sqla-queue`` parser's sub-parsers."""
    maintain = add_command(
        sub,
        "maintain",
        run_maintain,
        summary="create history partitions ahead of time (partitioned history)",
        description=MAINTAIN_HELP,
    )
    maintain.add_argument(
        "--ahead",
        type=whole_number(0, 1000, "a number of intervals"),
        default=3,
        help="intervals to prepare past the current one (default 3)",
    )
    maintain.add_argument(
        "--backfill",
        action="store_true",
        help="also create past partitions for the jobs of the default partitions (at most "
        "400 per run: run again until nothing is created)",
    )
    add_json(maintain)


def run_maintain(args: argparse.Namespace) -> int:
    """Run ``sqla-queue maintain``: create the partitions, print what was done and the list."""
    # A ValueError: a queue whose history is not partitioned, and nothing was done.
    with connected(args, begin=True, refusals=(ValueError,)) as (queue, connection):
        report = maintain_history(
            connection, queue.tables, ahead=args.ahead, backfill=args.backfill
        )
        partitions = history_partitions(connection, queue.tables)
    if args.json:
        print_json(
            {
                "created": list(report.created),
                "moved": report.moved,
                "partitions": [
                    {
                        "branch": p.branch,
                        "name": p.name,
                        "from": p.lower.isoformat() if p.lower else None,
                        "to": p.upper.isoformat() if p.upper else None,
                    }
                    for p in partitions
                ],
            }
        )
        return EXIT_OK
    say(f"created {len(report.created)} partition(s), moved {report.moved} job(s) into them")
    rows = [
        (
            p.branch,
            p.name,
            format_time(p.lower) if p.lower else "default",
            format_time(p.upper) if p.upper else "-",
        )
        for p in partitions
    ]
    print_table(_COLUMNS, rows, empty="no partitions")
    return EXIT_OK


_COLUMNS = (
    Column("branch"),
    Column("partition", least=24),
    Column("from"),
    Column("to"),
)
