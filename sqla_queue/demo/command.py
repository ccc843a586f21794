"""``sqla-queue demo``: the demo's sub-command, which :mod:`sqla_queue.__main__` adds to the
command line (the library's own CLI does not know the demo, which sits above it)."""

from __future__ import annotations

import argparse

from sqla_queue.cli.scaffold import Subparsers, add_command
from sqla_queue.demo.run import run_demo

__all__ = ["DEMO_HELP", "add_parser", "run"]

DEMO_HELP = """\
A real end-to-end demo: a small shop places orders, each enqueuing a confirmation job in
the order's transaction (some are rolled back on purpose), worker processes send them,
and a summary checks that every committed order's job ran, once. Without --url or
$DATABASE_URL it starts an embedded PostgreSQL (pip install 'sqla-queue[embedded]').

exit status:
  0  every check passed
  1  a check failed
  2  the demo cannot run (no database, a schema it did not create)"""


def add_parser(sub: Subparsers) -> None:
    """Add the ``demo`` sub-command to the ``sqla-queue`` parser's sub-parsers."""
    demo = add_command(
        sub,
        "demo",
        run,
        summary="a real end-to-end demo: a shop, its orders, 2 workers",
        description=DEMO_HELP,
        queue=False,
    )
    demo.add_argument("--url", help="database URL (default: $DATABASE_URL, else embedded)")
    demo.add_argument("--orders", type=int, default=3000, help="orders to place")
    demo.add_argument("--workers", type=int, default=2, help="worker processes")


def run(args: argparse.Namespace) -> int:
    """Run ``sqla-queue demo``; returns the exit status (see :data:`DEMO_HELP`)."""
    return run_demo(url=args.url, orders=args.orders, workers=args.workers)
