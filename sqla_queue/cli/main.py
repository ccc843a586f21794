"""``sqla-queue``: run workers, verify the schema, list, cancel, await and requeue jobs, demo.

Exit statuses: 0 success; 1 the database could not be reached or refused the command (one
or two lines naming the URL, password hidden, and the cause); 2 a usage error (one line),
or a database the queue cannot run on as it is (schema or privileges: the problems and
their fix). ``result``, ``cancel`` and ``requeue`` also say how the jobs ended: 3 the job
failed, 4 it was cancelled, 5 it did not finish in time, 6 no job has that id, 7 the job
had already finished (nothing to cancel) or was left alone (nothing to requeue). No error
prints a traceback. Text from the database is printed escaped (see :mod:`.render`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    InterfaceError,
    InvalidRequestError,
    OperationalError,
)

from sqla_queue._sqlstate import INSUFFICIENT_PRIVILEGE, sqlstate_of
from sqla_queue.admin import INTEGER_MAX
from sqla_queue.cli.loading import CliError, database_url, load_queue, shown_url
from sqla_queue.cli.render import (
    TASK_WIDTH,
    Column,
    EscapingFormatter,
    escape,
    json_text,
    print_table,
    say,
)
from sqla_queue.errors import (
    SqlaQueueError,
)
from sqla_queue.queue import Queue
from sqla_queue.statements.listing import JOB_STATES

#: Environment variable: the worker's ``--listen-url`` when the option is not given.
LISTEN_URL_ENV = "SQLA_QUEUE_LISTEN_URL"

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_DATABASE",
    "EXIT_FAILED",
    "EXIT_FINISHED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "build_parser",
    "main",
    "parse_duration",
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

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# SQLSTATE classes of a failed connection: 08 connection exception, 28 invalid
# authorization, 3D invalid catalog name (no such database), 57P03 cannot connect now.
_CONNECT_CLASSES = ("08", "28", "3D")
_CANNOT_CONNECT_NOW = "57P03"


def parse_duration(text: str) -> dt.timedelta:
    """``7d``, ``12h``, ``30m``, ``90s`` or plain seconds, as a timedelta."""
    unit = text[-1:].lower()
    number = text[:-1] if unit in _UNITS else text
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number with s, m, h or d (7d, 12h)"
        ) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: it must be finite")
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: it cannot be negative")
    try:
        return dt.timedelta(seconds=value * _UNITS.get(unit, 1))
    except OverflowError:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: at most {dt.timedelta.max.days} days"
        ) from None


def _whole_number(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{what} must be a whole number from {low} to {high}, got {text!r}"
            )
        return value

    return parse


def _seconds(*, allow_zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, positive (or, with ``allow_zero``, >= 0)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            rule = "zero or more" if allow_zero else "more than zero"
            raise argparse.ArgumentTypeError(
                f"expected a finite number of seconds, {rule}, got {text!r}"
            )
        return value

    return parse


def _timeout(text: str) -> float | None:
    """An argparse type: a duration (``30``, ``90s``, ``5m``, ``0``) or ``none`` (no limit)."""
    from sqla_queue.lifecycle import check_timeout

    if text.strip().lower() in ("none", "forever"):
        return None
    try:
        return check_timeout(parse_duration(text).total_seconds())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: {exc}") from None


def _states(text: str) -> list[str]:
    """An argparse type: job states, comma-separated (``failed,cancelled``)."""
    words = [word.strip().lower() for word in text.split(",") if word.strip()]
    if not words:
        raise argparse.ArgumentTypeError(f"expected a job state, got {text!r}")
    for word in words:
        if word not in JOB_STATES:
            raise argparse.ArgumentTypeError(
                f"unknown job state {word!r}; use one of {', '.join(JOB_STATES)}"
            )
    return words


def _about(text: str) -> tuple[str, str | None]:
    """An argparse type: ``TABLE`` or ``TABLE:KEY`` (``orders:42``, ``shop.orders:42``)."""
    table, sep, key = text.partition(":")
    if not table or (sep and not key):
        raise argparse.ArgumentTypeError(
            f"expected TABLE or TABLE:KEY such as orders:42, got {text!r}"
        )
    return table, key if sep else None


def _non_empty(what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"{what} must not be empty")
        return text

    return parse


def _log_level(text: str) -> str:
    """An argparse type: a logging level name (DEBUG, INFO, WARNING, ERROR, CRITICAL)."""
    names = [name for name in logging.getLevelNamesMapping() if name not in ("NOTSET", "WARN")]
    if text.upper() not in logging.getLevelNamesMapping():
        raise argparse.ArgumentTypeError(
            f"unknown log level {text!r}; use one of {', '.join(sorted(names))}"
        )
    return text.upper()


#: The most handlers a worker may run at once from the command line (a thread each).
_CONCURRENCY = 10_000


#: Where a command's help text turns to its exit statuses.
_EXIT_STATUS = "\n\nexit status"


class _Parser(argparse.ArgumentParser):
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


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", help="the Queue to use, as MODULE:ATTRIBUTE (myapp.jobs:queue)")
    parser.add_argument("--url", help="database URL (default: $DATABASE_URL)")


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


#: The exit statuses that every command shares, for the help screens' epilogs.
COMMON_EXITS = """\
  1  the database could not be reached or refused the command
  2  a usage error (nothing was done)"""

WORKER_HELP = f"""\
Run a worker: it claims the queue's due jobs and runs their handlers, --concurrency at
once, until SIGINT or SIGTERM (then it finishes or hands back what it runs within
--shutdown-timeout), or with --burst until nothing is due. Database errors once it runs
are logged and retried: a server restart does not stop it.

exit status:
  0  stopped by a signal, or --burst found nothing more to do
{COMMON_EXITS}, or the database lacks the queue's schema or privileges
     (the problems and their fix are printed)"""

VERIFY_HELP = f"""\
Check that the database has every object this version of the queue needs, in the expected
shape, and that the connected role has the privileges workers and producers need. Prints
"schema OK", or each problem and the command (or GRANT) that fixes it.

exit status:
  0  schema OK
{COMMON_EXITS}, or a missing or different object, or a missing privilege"""

LIMITS_HELP = f"""\
List, set or unset per-task concurrency limits, shared by every worker:
  sqla-queue limits APP:QUEUE [list | set TASK N | unset TASK]
The list shows each limit declared in code, stored, and the one in effect. `set` takes a
task the queue knows; `unset` removes a stored limit (the one in code applies again).

exit status:
  0  done (list: printed)
{COMMON_EXITS}, or a task the queue does not know"""

DEMO_HELP = """\
A real end-to-end demo: a small shop places orders, each enqueuing a confirmation job in
the order's transaction (some are rolled back on purpose), worker processes send them,
and a summary checks that every committed order's job ran, once. Without --url or
$DATABASE_URL it starts an embedded PostgreSQL (pip install 'sqla-queue[embedded]').

exit status:
  0  every check passed
  1  a check failed
  2  the demo cannot run (no database, a schema it did not create)"""

_TOP_EPILOG = """\
exit status (every command; `sqla-queue COMMAND --help` gives each one's own):
  0  success
  1  the database could not be reached or refused the command
  2  a usage error, or a database the queue cannot run on as it is
  3-7, 130  how the jobs of `result`, `cancel` and `requeue` ended"""

_RAW = argparse.RawDescriptionHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = _Parser(
        prog="sqla-queue",
        description=__doc__.split("\n\n")[0],
        epilog=_TOP_EPILOG,
        formatter_class=_RAW,
    )
    parser.add_argument(
        "--log-level", default="INFO", type=_log_level, help="logging level (default INFO)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    worker = sub.add_parser(
        "worker",
        help="run a worker until SIGINT/SIGTERM",
        description=WORKER_HELP,
        formatter_class=_RAW,
    )
    _add_target(worker)
    worker.add_argument(
        "--concurrency",
        type=_whole_number(1, _CONCURRENCY, "--concurrency"),
        default=10,
        help="handlers at once",
    )
    worker.add_argument(
        "--batch-size",
        type=_whole_number(1, _CONCURRENCY, "--batch-size"),
        help="executions per claim",
    )
    worker.add_argument("--tasks", help="comma-separated task names (default: all registered)")
    worker.add_argument("--async", dest="use_async", action="store_true", help="asyncio worker")
    worker.add_argument("--burst", action="store_true", help="exit when nothing is eligible")
    worker.add_argument(
        "--poll-interval", type=_seconds(allow_zero=False), default=1.0, help="max seconds idle"
    )
    worker.add_argument(
        "--shutdown-timeout", type=_seconds(allow_zero=True), default=30.0, help="grace seconds"
    )
    worker.add_argument(
        "--listen-url",
        help="LISTEN for enqueues on this direct connection URL, e.g. when the database URL "
        f"goes through PgBouncer in transaction mode (default: ${LISTEN_URL_ENV}, else the "
        "database URL)",
    )
    worker.add_argument(
        "--read-url",
        help="database URL of a read replica: handlers get ctx.read_session on it "
        "(default: none, and ctx.read_session raises)",
    )
    worker.add_argument(
        "--pool-size",
        type=_whole_number(1, 100, "--pool-size"),
        default=3,
        help="connections the worker keeps for its own statements, apart from the "
        "handlers' (default 3)",
    )
    worker.add_argument(
        "--no-listen",
        dest="listen",
        action="store_false",
        default=None,
        help="do not LISTEN for enqueues: poll every --poll-interval",
    )
    worker.add_argument(
        "--metrics-port",
        type=_whole_number(1, 65535, "--metrics-port"),
        help="serve Prometheus metrics at http://HOST:PORT/metrics (needs sqla-queue[prometheus])",
    )
    worker.add_argument(
        "--metrics-host", default="127.0.0.1", help="address of --metrics-port (default: loopback)"
    )

    verify = sub.add_parser(
        "verify",
        help="check that the database has the queue's schema and privileges",
        description=VERIFY_HELP,
        formatter_class=_RAW,
    )
    _add_target(verify)

    from sqla_queue.cli.jobs import add_job_parsers

    add_job_parsers(sub)

    limits = sub.add_parser(
        "limits",
        help="list, set or unset per-task concurrency limits (shared by all workers)",
        description=LIMITS_HELP,
        formatter_class=_RAW,
        usage="sqla-queue limits APP:QUEUE [--url URL] [--json] [list | set TASK N | unset TASK]",
    )
    _add_target(limits)
    limits.add_argument("words", nargs="*", help="list (default) | set TASK N | unset TASK")
    _add_json(limits)

    from sqla_queue.cli.controls import add_control_parsers
    from sqla_queue.cli.daemons import add_daemons_parser
    from sqla_queue.cli.dashboard import add_dashboard_parser
    from sqla_queue.cli.history import add_maintain_parser
    from sqla_queue.cli.periodic import add_periodic_parser
    from sqla_queue.cli.status import add_status_parsers

    add_status_parsers(sub)
    add_maintain_parser(sub)
    add_control_parsers(sub)
    add_periodic_parser(sub)
    add_daemons_parser(sub)
    add_dashboard_parser(sub)

    demo = sub.add_parser(
        "demo",
        help="a real end-to-end demo: a shop, its orders, 2 workers",
        description=DEMO_HELP,
        formatter_class=_RAW,
    )
    demo.add_argument("--url", help="database URL (default: $DATABASE_URL, else embedded)")
    demo.add_argument("--orders", type=int, default=3000, help="orders to place")
    demo.add_argument("--workers", type=int, default=2, help="worker processes")
    return parser


def _pool_size(args: argparse.Namespace) -> int:
    # One per handler (its ctx.session): a smaller pool would open and close a connection
    # for nearly every job. The worker's own statements have a pool of their own
    # (--pool-size, see sqla_queue/worker/pools.py).
    return int(args.concurrency)


def _target(args: argparse.Namespace) -> tuple[Queue, str]:
    """The queue named on the command line and the database URL, both checked."""
    queue = load_queue(args.queue)
    args.resolved_url = database_url(args.url)
    return queue, str(args.resolved_url)


def _engine(url: str, **options: Any) -> Engine:
    try:
        return create_engine(url, **options)
    except (ArgumentError, InvalidRequestError, ImportError) as exc:
        raise CliError(f"cannot use {shown_url(url)}: {exc}") from None


def _run_worker(args: argparse.Namespace) -> int:
    queue, url = _target(args)
    settings = {
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "poll_interval": args.poll_interval,
        "shutdown_timeout": args.shutdown_timeout,
        "tasks": args.tasks.split(",") if args.tasks else None,
        "listen": args.listen,
        "listen_url": args.listen_url or os.environ.get(LISTEN_URL_ENV) or None,
        "pool_size": args.pool_size,
    }
    if args.metrics_port is not None:
        from sqla_queue.metrics.serve import serve_worker_metrics

        port, host = args.metrics_port, args.metrics_host
        settings["observers"] = serve_worker_metrics(queue, url, port=port, host=host)
    if args.use_async:
        from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

        engines = []
        try:
            for engine_url in (url, args.read_url) if args.read_url else (url,):
                engines.append(create_async_engine(engine_url, pool_size=_pool_size(args)))
        except (ArgumentError, InvalidRequestError, ImportError) as exc:
            raise CliError(f"cannot use {shown_url(engine_url)} with --async: {exc}") from None
        read_factory = async_sessionmaker(engines[1]) if len(engines) > 1 else None
        try:
            async_worker = queue.async_worker(
                async_sessionmaker(engines[0]), read_session_factory=read_factory, **settings
            )
        except (TypeError, ValueError) as exc:
            raise CliError(str(exc)) from None

        async def run_async() -> None:
            try:
                await async_worker.run(burst=args.burst)
            finally:
                for async_engine in engines:
                    await async_engine.dispose()

        asyncio.run(run_async())
        return EXIT_OK
    from sqlalchemy.orm import sessionmaker

    engine = _engine(url, pool_size=_pool_size(args))
    read_engine = _engine(args.read_url, pool_size=_pool_size(args)) if args.read_url else None
    try:
        try:
            worker = queue.worker(
                sessionmaker(engine),
                read_session_factory=sessionmaker(read_engine) if read_engine else None,
                **settings,
            )
        except (TypeError, ValueError) as exc:
            raise CliError(str(exc)) from None
        worker.run(burst=args.burst)
    finally:
        engine.dispose()
        if read_engine is not None:
            read_engine.dispose()
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    queue, url = _target(args)
    engine = _engine(url)
    try:
        with engine.connect() as connection:
            queue.verify(connection)
    finally:
        engine.dispose()
    say("schema OK")
    return EXIT_OK


def _limits_words(words: Sequence[str]) -> tuple[str, str, int | None]:
    usage = "use: sqla-queue limits APP:QUEUE [list | set TASK N | unset TASK]"
    if not words or list(words) == ["list"]:
        return "list", "", None
    if words[0] == "set" and len(words) == 3:
        try:
            limit = int(words[2])
        except ValueError:
            limit = 0
        if not 1 <= limit <= INTEGER_MAX:
            raise CliError(
                f"the limit must be a whole number from 1 to {INTEGER_MAX}, got {words[2]!r}"
            )
        return "set", words[1], limit
    if words[0] == "unset" and len(words) == 2:
        return "unset", words[1], None
    raise CliError(f"unexpected arguments {' '.join(words)!r}; {usage}")


_LIMIT_COLUMNS = (
    Column("task", least=TASK_WIDTH),
    Column("declared in code", right=True),
    Column("stored", right=True),
    Column("effective", right=True),
)


def _limits(args: argparse.Namespace) -> int:
    action, task, limit = _limits_words(args.words)
    queue, url = _target(args)
    engine = _engine(url)
    try:
        with engine.begin() as connection:
            if action == "set":
                queue.set_limit(connection, task, limit)
            elif action == "unset":
                queue.set_limit(connection, task, None)
            current = queue.limits(connection)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    finally:
        engine.dispose()
    if action != "list":
        now = current.get(task)
        shown = now.effective if now is not None else None
        if args.json:
            _print_json({"task": task, "effective": shown})
        else:
            say(f"{task}: limit now {shown if shown is not None else 'none'}")
        return EXIT_OK
    if args.json:
        _print_json(
            [
                {
                    "task": name,
                    "declared": entry.declared,
                    "stored": entry.stored,
                    "effective": entry.effective,
                }
                for name, entry in current.items()
            ]
        )
        return EXIT_OK
    rows = [
        (
            name,
            str(entry.declared) if entry.declared is not None else "-",
            str(entry.stored) if entry.stored is not None else "-",
            str(entry.effective),
        )
        for name, entry in current.items()
    ]
    print_table(_LIMIT_COLUMNS, rows, empty="no concurrency limits")
    return EXIT_OK


def _print_json(value: object) -> None:
    print(json_text(value))


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _demo(args: argparse.Namespace) -> int:
    from sqla_queue.demo.run import run_demo

    return run_demo(url=args.url, orders=args.orders, workers=args.workers)


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sqla-queue`` command; returns the exit status.

    Never raises for a usage or database error: it prints one line (two for a database
    error) on stderr and returns 2 (usage, schema or privileges) or 1 (database).
    """
    parser = build_parser()
    try:
        # parse_known_args lets `limits APP --url X set TASK N` put its words after options.
        args, rest = parser.parse_known_args(argv)
        if rest:
            worded = args.command in ("limits", "rate-limit")
            if not worded or any(word.startswith("-") for word in rest):
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
            args.words = [*args.words, *rest]
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    # Log lines carry handlers' errors and task names: escaped like everything printed.
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level, handlers=[handler])
    from sqla_queue.cli.controls import run_pause, run_rate_limit, run_resume
    from sqla_queue.cli.daemons import run_daemons
    from sqla_queue.cli.dashboard import run_dashboard
    from sqla_queue.cli.history import run_maintain
    from sqla_queue.cli.jobs import (
        run_cancel,
        run_failed,
        run_jobs,
        run_prune,
        run_requeue,
        run_result,
    )
    from sqla_queue.cli.periodic import run_periodic
    from sqla_queue.cli.status import run_status, run_top

    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "worker": _run_worker,
        "verify": _verify,
        "failed": run_failed,
        "requeue": run_requeue,
        "jobs": run_jobs,
        "cancel": run_cancel,
        "result": run_result,
        "prune": run_prune,
        "limits": _limits,
        "pause": run_pause,
        "resume": run_resume,
        "rate-limit": run_rate_limit,
        "periodic": run_periodic,
        "maintain": run_maintain,
        "daemons": run_daemons,
        "dashboard": run_dashboard,
        "status": run_status,
        "top": run_top,
        "demo": _demo,
    }
    try:
        return commands[args.command](args)
    except (CliError, SqlaQueueError) as exc:
        say(f"sqla-queue: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DBAPIError as exc:
        say(database_error_message(exc, getattr(args, "resolved_url", None)), file=sys.stderr)
        return EXIT_DATABASE
