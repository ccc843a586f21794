"""``sqla-queue periodic``: list the queue's periodic schedules, their last and next tick."""

from __future__ import annotations

import argparse

from sqla_queue.cli.render import Column, format_time, print_table
from sqla_queue.cli.scaffold import EXIT_OK, Subparsers, add_command, connected, print_json

__all__ = ["PERIODIC_HELP", "add_periodic_parser", "run_periodic"]

PERIODIC_HELP = """\
List the periodic schedules that the queue registers (@queue.periodic, queue.schedule),
by name: the task each one enqueues, its cron expression and time zone (or its interval),
its catch-up policy, the last tick enqueued and the next tick to enqueue. Workers enqueue
each tick ahead of time (up to two maintenance intervals before it), as a job due at the
tick, so the last tick may lie a few seconds in the future.

A schedule that no worker has run yet shows no last tick; its next tick is the first one
after now. A next tick in the past means no worker has run the schedule since then: the
first worker to start applies the catch-up policy (skip, one or all). A row stored by a
schedule that the code no longer registers is listed last, marked unregistered.

Times are UTC, to the second; --json gives them in ISO 8601 with their UTC offset. In a
narrow terminal the columns give way, catch-up and last tick first.

exit status:
  0  printed (also when there are no schedules)
  1  the database could not be reached or refused the command
  2  a usage error (nothing was done)"""


def add_periodic_parser(sub: Subparsers) -> None:
    """Add the ``periodic`` sub-command to the ``sqla-queue`` parser's sub-parsers.

    ``sub`` is what ``add_subparsers()`` returned, whatever its parser class.
    """
    add_command(
        sub,
        "periodic",
        run_periodic,
        summary="list periodic schedules with their last and next tick",
        description=PERIODIC_HELP,
        json=True,
    )


def run_periodic(args: argparse.Namespace) -> int:
    """Run ``sqla-queue periodic``: print the schedules as a table, or as JSON with --json.

    Returns the exit status (0); a usage or database error is raised for ``main`` to
    report, as for every other command.
    """
    with connected(args) as (queue, connection):
        states = queue.schedules(connection)
    if args.json:
        print_json([state.as_json() for state in states])
        return EXIT_OK
    table = [
        (
            state.name if state.registered else f"{state.name} (unregistered)",
            state.task,
            state.schedule,
            state.catch_up,
            format_time(state.last_tick),
            format_time(state.next_tick),
        )
        for state in states
    ]
    print_table(_COLUMNS, table, empty="no periodic schedules")
    return EXIT_OK


_COLUMNS = (
    Column("name", least=24),
    Column("task", least=24, drop=3),
    Column("schedule", least=20, cut="end"),
    Column("catch-up", drop=1),
    Column("last tick", drop=2),
    Column("next tick"),
)
