"""``sqla-queue daemons``: list the daemon instances, the worker running each, their restarts."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from sqla_queue.cli.render import TASK_WIDTH, Cell, Column, format_time, print_table
from sqla_queue.cli.scaffold import EXIT_OK, Subparsers, add_command, connected, print_json

__all__ = ["DAEMONS_HELP", "add_daemons_parser", "run_daemons"]

DAEMONS_HELP = """\
List the daemon instances (@queue.daemon) that the database knows, one row per
(name, instance): the worker that holds it, until when (its lease), when it last
started, how often it crashed (restarts) and its latest error.

An instance is running while a worker holds it under an unexpired lease. One whose
worker died shows that worker until its lease runs out; another worker then takes it
within a quarter of its lost interval. A row appears once a worker has supervised the
daemon; a daemon that the code registers but no worker has run yet is listed as never
started. Rows of instances above a daemon's current count are listed as unregistered.

Times are UTC, to the second; --json gives them in ISO 8601 with their UTC offset. In a
narrow terminal the columns give way, started and lease until first.

exit status:
  0  printed (also when there are no daemons)
  1  the database could not be reached or refused the command
  2  a usage error (nothing was done)"""


def add_daemons_parser(sub: Subparsers) -> None:
    """Add the ``daemons`` sub-command to the ``sqla-queue`` parser's sub-parsers."""
    add_command(
        sub,
        "daemons",
        run_daemons,
        summary="list daemon instances with their worker, lease and restarts",
        description=DAEMONS_HELP,
        json=True,
    )


def run_daemons(args: argparse.Namespace) -> int:
    """Run ``sqla-queue daemons``: print the instances as a table, or as JSON with --json.

    Returns the exit status (0); a usage or database error is raised for ``main`` to
    report, as for every other command.
    """
    with connected(args) as (queue, connection):
        rows = queue.daemon_status(connection)
    declared = {name: spec.instances for name, spec in queue.daemons.items()}
    seen = {(row.name, row.instance) for row in rows}
    never = [
        (name, number)
        for name, count in sorted(declared.items())
        for number in range(count)
        if (name, number) not in seen
    ]
    if args.json:
        listed = [
            {**row.as_dict(), "registered": row.instance < declared.get(row.name, 0)}
            for row in rows
        ]
        listed += [
            {"name": name, "instance": number, "running": False, "registered": True}
            for name, number in never
        ]
        print_json(listed)
        return EXIT_OK
    table: list[Sequence[Cell]] = [
        (
            row.name if row.instance < declared.get(row.name, 0) else f"{row.name} (unregistered)",
            str(row.instance),
            "running" if row.running else "free" if row.worker_id is None else "lapsed",
            str(row.worker_id)[:8] if row.worker_id else "-",  # --json has it whole
            format_time(row.lease_until),
            format_time(row.started_at),
            str(row.restarts),
            row.last_error or "-",
        )
        for row in rows
    ]
    table += [
        (name, str(number), "never started", "-", "-", "-", "0", "-") for name, number in never
    ]
    print_table(_COLUMNS, table, empty="no daemons")
    return EXIT_OK


_COLUMNS = (
    Column("name", least=TASK_WIDTH),
    Column("instance", right=True, drop=4),
    Column("state"),
    Column("worker", drop=3),
    Column("lease until", drop=2),
    Column("started", drop=1),
    Column("restarts", right=True, drop=5),
    Column("last error", least=20, cut="end"),
)
