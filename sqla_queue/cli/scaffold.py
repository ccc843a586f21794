"""What every ``sqla-queue`` command shares: exit statuses, the parser, the way to the database.

A command module adds its parser with :func:`add_command` (the queue argument, ``--url``
and, for a listing, ``--json``, in one call), and runs inside :func:`connected` (or
:func:`engine_of` when it needs the engine itself): the queue named on the command line is
loaded, an engine is built on the database URL, and it is disposed of on the way out,
whatever happens. Command modules import this module, never :mod:`sqla_queue.cli.main`,
which imports them.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeAlias

from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import ArgumentError, InvalidRequestError

from sqla_queue.cli.loading import CliError, database_url, load_queue, shown_url
from sqla_queue.cli.render import escape, json_text
from sqla_queue.queue import Queue

__all__ = [
    "COMMON_EXITS",
    "EXIT_CANCELLED",
    "EXIT_DATABASE",
    "EXIT_FAILED",
    "EXIT_FINISHED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "AddCommands",
    "Command",
    "Parser",
    "Subparsers",
    "add_command",
    "add_json",
    "connected",
    "engine_of",
    "iso",
    "make_engine",
    "print_json",
    "target",
]

#: The command did what was asked.
EXIT_OK = 0
#: The database could not be reached, or refused a statement.
EXIT_DATABASE = 1
#: A usage error, or a database the queue cannot run on (schema, privileges).
EXIT_USAGE = 2
#: ``result``: the job failed (its error is printed).
EXIT_FAILED = 3
#: ``result``: the job was cancelled.
EXIT_CANCELLED = 4
#: ``result``: the job was still queued or running when the timeout passed.
EXIT_TIMEOUT = 5
#: ``result``: no job has the id; ``cancel``, ``requeue``: no job has one of the ids.
EXIT_NOT_FOUND = 6
#: ``cancel``: one of the jobs had already finished, so there was nothing to cancel;
#: ``requeue``: one of the jobs was left alone (in another state, or its unique key is
#: held); and every id exists.
EXIT_FINISHED = 7
#: Interrupted (Ctrl-C) while waiting, as shells report SIGINT.
EXIT_INTERRUPTED = 130

#: The exit statuses that every command shares, for the help screens' epilogs.
COMMON_EXITS = """\
  1  the database could not be reached or refused the command
  2  a usage error (nothing was done)"""

#: What ``add_subparsers()`` returns: where each command adds its parser.
Subparsers: TypeAlias = "argparse._SubParsersAction[Any]"
#: How a command runs: the parsed arguments in, the exit status out.
Command: TypeAlias = Callable[[argparse.Namespace], int]
#: What a command module offers the top parser: a function adding its sub-commands.
AddCommands: TypeAlias = Callable[[Subparsers], None]

#: Where a command's help text turns to its exit statuses.
_EXIT_STATUS = "\n\nexit status"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, with exit status 2.

    A command's help text (its ``description``) ends with its exit statuses; the help
    screen shows them last, after the options, as its epilog. Texts are laid out as
    written.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        description = kwargs.get("description") or ""
        if _EXIT_STATUS in description and kwargs.get("epilog") is None:
            text, _, statuses = description.partition(_EXIT_STATUS)
            kwargs["description"], kwargs["epilog"] = text, _EXIT_STATUS.lstrip() + statuses
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print ``sqla-queue: <problem> (see <prog> --help)`` and exit with status 2."""
        # The message may repeat an argument as typed (unrecognized arguments: ...).
        self.exit(EXIT_USAGE, f"sqla-queue: {escape(message)} (see `{self.prog} --help`)\n")


def add_command(
    sub: Subparsers,
    name: str,
    run: Command,
    *,
    summary: str,
    description: str,
    usage: str | None = None,
    queue: bool = True,
    json: bool = False,
) -> argparse.ArgumentParser:
    """Add the sub-command ``name``, run by ``run``, and return its parser.

    ``summary`` is its line in the top help screen; ``description`` is its help screen,
    laid out as written, ending with its exit statuses. With ``queue`` (the default) it
    takes the queue as ``MODULE:ATTRIBUTE`` and ``--url``; with ``json``, ``--json`` for a
    listing.
    """
    options: dict[str, Any] = {"usage": usage} if usage is not None else {}
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=summary,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **options,
    )
    parser.set_defaults(run=run)
    if queue:
        parser.add_argument(
            "queue", help="the Queue to use, as MODULE:ATTRIBUTE (myapp.jobs:queue)"
        )
        parser.add_argument("--url", help="database URL (default: $DATABASE_URL)")
    if json:
        add_json(parser)
    return parser


def add_json(parser: argparse.ArgumentParser) -> None:
    """Add ``--json`` to a listing's parser (:func:`add_command` does it with ``json=True``;
    a command whose help lists ``--json`` after its own options calls this last)."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def target(args: argparse.Namespace) -> tuple[Queue, str]:
    """The queue named on the command line and the database URL, both checked.

    The URL is kept as ``args.resolved_url`` too, for the message of a database error.
    """
    queue = load_queue(args.queue)
    args.resolved_url = database_url(args.url)
    return queue, str(args.resolved_url)


def make_engine(url: str, **options: Any) -> Engine:
    """An engine on ``url``; a URL or option SQLAlchemy refuses is a usage error."""
    try:
        return create_engine(url, **options)
    except (ArgumentError, InvalidRequestError, ImportError) as exc:
        raise CliError(f"cannot use {shown_url(url)}: {exc}") from None


@contextmanager
def engine_of(
    args: argparse.Namespace,
    *,
    refusals: tuple[type[Exception], ...] = (),
    **options: Any,
) -> Iterator[tuple[Queue, Engine]]:
    """The queue named on the command line and an engine on its database (built with
    ``options``), disposed of on exit.

    An exception of one of the ``refusals`` types raised inside (the library refusing a
    value before it wrote anything) becomes a one-line usage error.
    """
    queue, url = target(args)
    engine = make_engine(url, **options)
    try:
        yield queue, engine
    except refusals as exc:
        raise CliError(str(exc)) from None
    finally:
        engine.dispose()


@contextmanager
def connected(
    args: argparse.Namespace,
    *,
    begin: bool = False,
    refusals: tuple[type[Exception], ...] = (),
    **options: Any,
) -> Iterator[tuple[Queue, Connection]]:
    """The queue named on the command line and a connection to its database.

    With ``begin``, the connection is in a transaction that commits on exit (and rolls back
    on an error); without, it only reads. The engine is disposed of on exit. ``refusals``
    and ``options`` are those of :func:`engine_of`.
    """
    with (
        engine_of(args, refusals=refusals, **options) as (queue, engine),
        engine.begin() if begin else engine.connect() as connection,
    ):
        yield queue, connection


def print_json(value: object) -> None:
    """Print ``value`` as indented JSON, escaped as every output is (see :mod:`.render`)."""
    print(json_text(value))


def iso(value: dt.datetime | None) -> str | None:
    """A time for ``--json``: ISO 8601 with its offset, or ``None``."""
    return value.isoformat() if value is not None else None
