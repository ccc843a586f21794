"""``sqla-queue daemons``: list the daemon instances, the worker running each, their restarts."""

from __future__ import annotations

import argparse
from typing import Any

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

Times are this machine's local time, to the second; --json gives them in ISO 8601 with
their UTC offset."""


def add_daemons_parser(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``daemons`` sub-command to the ``sqla-queue`` parser's sub-parsers."""
    from sqla_queue.cli.main import _add_json, _add_target

    daemons = sub.add_parser(
        "daemons",
        help="list daemon instances with their worker, lease and restarts",
        description=DAEMONS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_target(daemons)
    _add_json(daemons)


def run_daemons(args: argparse.Namespace) -> int:
    """Run ``sqla-queue daemons``: print the instances as a table, or as JSON with --json.

    Returns the exit status (0); a usage or database error is raised for ``main`` to
    report, as for every other command.
    """
    from rich.console import Console
    from rich.table import Table

    from sqla_queue.cli.main import EXIT_OK, _engine, _print_json, _shown_time, _target

    queue, url = _target(args)
    engine = _engine(url)
    try:
        with engine.connect() as connection:
            rows = queue.daemon_status(connection)
    finally:
        engine.dispose()
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
        _print_json(listed)
        return EXIT_OK
    table = Table("name", "instance", "state", "worker", "lease until", "started", "restarts")
    table.add_column("last error", overflow="fold")
    for row in rows:
        name = (
            row.name if row.instance < declared.get(row.name, 0) else f"{row.name} (unregistered)"
        )
        table.add_row(
            name,
            str(row.instance),
            "running" if row.running else "free" if row.worker_id is None else "lapsed",
            str(row.worker_id)[:8] if row.worker_id else "-",  # --json has it whole
            _shown_time(row.lease_until),
            _shown_time(row.started_at),
            str(row.restarts),
            row.last_error or "-",
        )
    for name, number in never:
        table.add_row(name, str(number), "never started", "-", "-", "-", "0", "-")
    Console().print(table if rows or never else "no daemons")
    return EXIT_OK
