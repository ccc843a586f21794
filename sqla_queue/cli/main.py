"""``sqla-queue``: run workers, verify the schema, list, cancel, await and requeue jobs, demo.

Exit statuses: 0 success; 1 the database could not be reached or refused the command (one
or two lines naming the URL, password hidden, and the cause); 2 a usage error (one line),
or a database the queue cannot run on as it is (schema or privileges: the problems and
their fix). ``result``, ``cancel`` and ``requeue`` also say how the jobs ended: 3 the job
failed, 4 it was cancelled, 5 it did not finish in time, 6 no job has that id, 7 the job
had already finished (nothing to cancel) or was left alone (nothing to requeue). No error
prints a traceback. Text from the database is printed escaped (see :mod:`.render`).

Each command module adds its own sub-commands (``add_*_parser(sub)``) and runs them
(``run_*(args) -> int``); this module puts them together. Commands from above the library
(the shipped demo, in :mod:`sqla_queue.__main__`) come in through ``extra``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterable, Sequence

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from sqla_queue._sqlstate import INSUFFICIENT_PRIVILEGE, sqlstate_of
from sqla_queue.cli.controls import add_control_parsers, add_limits_parser
from sqla_queue.cli.daemons import add_daemons_parser
from sqla_queue.cli.dashboard import add_dashboard_parser
from sqla_queue.cli.durable import add_durable_parsers
from sqla_queue.cli.history import add_maintain_parser
from sqla_queue.cli.jobs import add_job_parsers
from sqla_queue.cli.loading import CliError, shown_url
from sqla_queue.cli.periodic import add_periodic_parser
from sqla_queue.cli.render import EscapingFormatter, say
from sqla_queue.cli.scaffold import EXIT_DATABASE, EXIT_USAGE, AddCommands, Command, Parser
from sqla_queue.cli.status import add_status_parsers
from sqla_queue.cli.values import log_level
from sqla_queue.cli.worker import add_worker_parsers
from sqla_queue.cli.workflows import add_workflows_parser
from sqla_queue.errors import SqlaQueueError

__all__ = ["COMMANDS", "build_parser", "database_error_message", "main"]

#: The library's sub-commands, in the order of the top help screen.
COMMANDS: tuple[AddCommands, ...] = (
    add_worker_parsers,
    add_job_parsers,
    add_workflows_parser,
    add_durable_parsers,
    add_limits_parser,
    add_status_parsers,
    add_maintain_parser,
    add_control_parsers,
    add_periodic_parser,
    add_daemons_parser,
    add_dashboard_parser,
)

# Commands whose words (`set TASK N`, a workflow's id) may come after their options.
_WORDED = ("limits", "rate-limit", "workflows")

# SQLSTATE classes of a failed connection: 08 connection exception, 28 invalid
# authorization, 3D invalid catalog name (no such database), 57P03 cannot connect now.
_CONNECT_CLASSES = ("08", "28", "3D")
_CANNOT_CONNECT_NOW = "57P03"

_TOP_EPILOG = """\
exit status (every command; `sqla-queue COMMAND --help` gives each one's own):
  0  success
  1  the database could not be reached or refused the command
  2  a usage error, or a database the queue cannot run on as it is
  3-7, 130  how the jobs of `result`, `cancel`, `requeue` and `signal` ended (6 for
            `workflows`: no workflow has the id)"""


def build_parser(extra: Iterable[AddCommands] = ()) -> argparse.ArgumentParser:
    """The argument parser of every sub-command, and of those that ``extra`` adds.

    Each entry of ``extra`` adds sub-commands as the library's own modules do (a parser
    with a ``run`` default, see :func:`sqla_queue.cli.scaffold.add_command`), after them.
    """
    parser = Parser(
        prog="sqla-queue",
        description=__doc__.split("\n\n")[0],
        epilog=_TOP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--log-level", default="INFO", type=log_level, help="logging level (default INFO)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (*COMMANDS, *extra):
        add(sub)
    return parser


def database_error_message(exc: DBAPIError, url: str | None) -> str:
    """One or two lines for a failed connection or a refused statement, without a traceback.

    Names the URL (password hidden) and the driver's own words for the cause.
    """
    where = shown_url(url) if url else "the database"
    original = exc.orig if exc.orig is not None else exc
    lines = [line.strip() for line in str(original).splitlines() if line.strip()]
    cause = " ".join(lines[:2]) or type(original).__name__
    password = make_url(url).password if url else None
    if password:
        cause = cause.replace(str(password), "***")
    state = sqlstate_of(exc)
    if state is None:
        # No SQLSTATE: the driver failed on its own side. Only its connection errors mean
        # the server could not be reached; a value it cannot convert (a DataError) does not.
        if isinstance(exc, OperationalError | InterfaceError):
            return f"sqla-queue: cannot connect to {where}\n  cause: {cause}"
        return f"sqla-queue: a command on {where} failed\n  cause: {cause}"
    if state.startswith(_CONNECT_CLASSES) or state == _CANNOT_CONNECT_NOW:
        return f"sqla-queue: cannot connect to {where}\n  cause: {cause}"
    hint = ""
    if state == INSUFFICIENT_PRIVILEGE:
        hint = " (see the grants in the deployment guide, section Least-privilege roles)"
    return f"sqla-queue: the database at {where} refused the command\n  cause: {cause}{hint}"


def main(argv: Sequence[str] | None = None, *, extra: Iterable[AddCommands] = ()) -> int:
    """Entry point of the ``sqla-queue`` command; returns the exit status.

    ``extra`` adds sub-commands (see :func:`build_parser`). Never raises for a usage or
    database error: it prints one line (two for a database error) on stderr and returns 2
    (usage, schema or privileges) or 1 (database).
    """
    parser = build_parser(extra)
    try:
        # parse_known_args lets `limits APP --url X set TASK N` put its words after options.
        args, rest = parser.parse_known_args(argv)
        if rest:
            if args.command not in _WORDED or any(word.startswith("-") for word in rest):
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
            args.words = [*args.words, *rest]
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    # Log lines carry handlers' errors and task names: escaped like everything printed.
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level, handlers=[handler])
    run: Command = args.run
    try:
        return run(args)
    except (CliError, SqlaQueueError) as exc:
        say(f"sqla-queue: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DBAPIError as exc:
        say(database_error_message(exc, getattr(args, "resolved_url", None)), file=sys.stderr)
        return EXIT_DATABASE
