"""``sqla-queue``: run workers, verify the schema, list, cancel, await and requeue jobs, demo.

Exit statuses: 0 success; 1 the database could not be reached or refused the command (one
or two lines naming the URL, password hidden, and the cause); 2 a usage error (one line),
or a database the queue cannot run on as it is (schema or privileges: the problems and
their fix). ``result`` and ``cancel`` also say how the jobs ended: 3 the job failed, 4 it
was cancelled, 5 it did not finish in time, 6 no job has that id, 7 the job had already
finished (nothing to cancel). No error prints a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InvalidRequestError

from sqla_queue._sqlstate import INSUFFICIENT_PRIVILEGE, sqlstate_of
from sqla_queue.admin import BIGINT_MAX, INTEGER_MAX
from sqla_queue.cli.loading import CliError, database_url, load_queue, shown_url
from sqla_queue.errors import (
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    ResultTimeoutError,
    SqlaQueueError,
)
from sqla_queue.queue import Queue
from sqla_queue.statements.lifecycle import CancelOutcome
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
#: ``result``: no job has the id; ``cancel``: no job has one of the ids.
EXIT_NOT_FOUND = 6
#: ``cancel``: one of the jobs had already finished, so there was nothing to cancel (and
#: every id exists).
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


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, with exit status 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``sqla-queue: <problem> (see <prog> --help)`` and exit with status 2."""
        self.exit(EXIT_USAGE, f"sqla-queue: {message} (see `{self.prog} --help`)\n")


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", help="the Queue to use, as MODULE:ATTRIBUTE (myapp.jobs:queue)")
    parser.add_argument("--url", help="database URL (default: $DATABASE_URL)")


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


_COMMON_EXITS = """\
  1  the database could not be reached or refused the command
  2  a usage error (nothing was done)"""

_CANCEL_HELP = f"""\
Cancel jobs: a queued job becomes cancelled and never starts; a running one is asked
to stop (its handler sees ctx.cancel_requested within a heartbeat interval) and ends
cancelled when its handler returns, unless it succeeds. Prints each job's outcome:
cancelled, requested, finished (already over: nothing changed) or not_found.

exit status:
  0  every job was cancelled or asked to stop
{_COMMON_EXITS}
  6  no job has one of the ids (the others were cancelled)
  7  one of the jobs had already finished (the others were cancelled)"""

_RESULT_HELP = f"""\
Wait for a job to finish and print its handler's return value as JSON. A failed job's
error, with the traceback the worker recorded, goes to stderr. The wait LISTENs for the
job's completion (and reads it every few seconds besides).

exit status:
  0  the job succeeded: its result is printed
{_COMMON_EXITS}
  3  the job failed
  4  the job was cancelled
  5  the job was still queued or running when the timeout passed
  6  no job has this id (never enqueued, or pruned)
  130 interrupted (Ctrl-C)"""

_JOBS_HELP = """\
List jobs, newest first (by id), at most --limit of them: id, task, state, attempts,
created and finished times, unique key and linked row. Filters combine with AND; a
filter given several times (--task, --status) matches any of its values.

states: queued (every job not finished yet), succeeded, failed, cancelled, and the
states of a queued job: running, cancelling (running, asked to stop), waiting (behind
its queue_id), scheduled (due later), pending (due now)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = _Parser(prog="sqla-queue", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--log-level", default="INFO", type=_log_level, help="logging level (default INFO)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    worker = sub.add_parser("worker", help="run a worker until SIGINT/SIGTERM")
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
        "verify", help="check that the database has the queue's schema and privileges"
    )
    _add_target(verify)

    failed = sub.add_parser("failed", help="list failed jobs, newest first")
    _add_target(failed)
    failed.add_argument(
        "--limit", type=_whole_number(1, BIGINT_MAX, "--limit"), default=20, help="at most N"
    )
    _add_json(failed)

    jobs = sub.add_parser(
        "jobs",
        help="list jobs, newest first, by task, state, key or linked row",
        description=_JOBS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_target(jobs)
    jobs.add_argument(
        "--task", action="append", type=_non_empty("--task"), help="only this task (repeatable)"
    )
    jobs.add_argument(
        "--status",
        action="append",
        type=_states,
        metavar="STATE",
        help="only jobs in this state; repeatable, or comma-separated (failed,cancelled)",
    )
    jobs.add_argument(
        "--key", type=_non_empty("--key"), help="only jobs whose unique_key or queue_id is KEY"
    )
    jobs.add_argument(
        "--about",
        type=_about,
        metavar="TABLE[:KEY]",
        help="only jobs linked to this row (orders:42), or to any row of TABLE",
    )
    jobs.add_argument(
        "--limit",
        type=_whole_number(1, BIGINT_MAX, "--limit"),
        default=20,
        metavar="N",
        help="at most N jobs (default 20)",
    )
    _add_json(jobs)

    cancel = sub.add_parser(
        "cancel",
        help="cancel jobs: queued ones never start, running ones are asked to stop",
        description=_CANCEL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_target(cancel)
    cancel.add_argument(
        "ids", nargs="+", type=_whole_number(1, BIGINT_MAX, "a job id"), help="job ids"
    )
    cancel.add_argument("--json", action="store_true", help="print the outcomes as JSON")

    result = sub.add_parser(
        "result",
        help="wait for a job to finish and print its result as JSON",
        description=_RESULT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_target(result)
    result.add_argument("id", type=_whole_number(1, BIGINT_MAX, "a job id"), help="the job id")
    result.add_argument(
        "--timeout",
        type=_timeout,
        default=30.0,
        help="longest wait: 30s (default), 5m, 0 (look once) or none (no limit)",
    )
    result.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object, whatever the outcome: {id, outcome, result | error}",
    )

    requeue = sub.add_parser("requeue", help="run failed jobs again")
    _add_target(requeue)
    requeue.add_argument(
        "ids", nargs="+", type=_whole_number(1, BIGINT_MAX, "a job id"), help="job ids"
    )

    prune = sub.add_parser("prune", help="delete finished jobs older than a given age")
    _add_target(prune)
    prune.add_argument(
        "--older-than", type=parse_duration, required=True, help="age such as 7d, 12h, 30m, 90s"
    )
    prune.add_argument("--include-failed", action="store_true", help="failed jobs go too")
    prune.add_argument(
        "--detach",
        action="store_true",
        help="partitioned history: detach old partitions (kept as tables) instead of dropping",
    )

    limits = sub.add_parser(
        "limits",
        help="list, set or unset per-task concurrency limits (shared by all workers)",
        description="sqla-queue limits APP:QUEUE [list | set TASK N | unset TASK]",
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

    demo = sub.add_parser("demo", help="a real end-to-end demo: a shop, its orders, 2 workers")
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
    print("schema OK")
    return EXIT_OK


def _failed(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sqla_queue.admin import failed_jobs

    queue, url = _target(args)
    engine = _engine(url)
    try:
        with engine.connect() as connection:
            rows = failed_jobs(connection, queue.tables, limit=args.limit)
    finally:
        engine.dispose()
    if args.json:
        _print_json(
            [
                {
                    "id": row.id,
                    "task": row.task,
                    "attempts": row.attempts,
                    "finished_at": _iso(row.finished_at),
                    "last_error": row.last_error,
                }
                for row in rows
            ]
        )
        return EXIT_OK
    table = Table("id", "task", "attempts", "failed at", "last error")
    for row in rows:
        error = row.last_error or {}
        message = f"{error.get('type', '')}: {error.get('message', '')}".strip(": ")
        table.add_row(str(row.id), row.task, str(row.attempts), str(row.finished_at), message)
    Console().print(table if rows else "no failed jobs")
    return EXIT_OK


def _requeue(args: argparse.Namespace) -> int:
    queue, url = _target(args)
    engine = _engine(url)
    try:
        with engine.begin() as connection:
            done = queue.requeue(connection, args.ids)
    finally:
        engine.dispose()
    skipped = sorted(set(args.ids) - set(done))
    print(f"requeued {len(done)} job(s): {done}")
    if skipped:
        print(f"not failed or cancelled, left alone: {skipped}")
    return EXIT_OK


def _prune(args: argparse.Namespace) -> int:
    queue, url = _target(args)
    engine = _engine(url)
    try:
        with engine.begin() as connection:
            if args.detach:
                from sqla_queue.history import prune_history

                try:
                    report = prune_history(
                        connection,
                        queue.tables,
                        older_than=args.older_than,
                        include_failed=args.include_failed,
                        detach=True,
                    )
                except ValueError as exc:  # --detach on a plain history: nothing was done
                    raise CliError(str(exc)) from None
                count = report.jobs
                print(f"detached {len(report.partitions)} partition(s): {list(report.partitions)}")
            else:
                count = queue.prune(
                    connection, older_than=args.older_than, include_failed=args.include_failed
                )
    finally:
        engine.dispose()
    print(f"pruned {count} finished job(s) older than {args.older_than}")
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


def _limits(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

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
            print(f"{task}: limit now {shown if shown is not None else 'none'}")
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
    table = Table("task", "declared in code", "stored", "effective")
    for name, entry in current.items():
        table.add_row(
            name,
            str(entry.declared) if entry.declared is not None else "-",
            str(entry.stored) if entry.stored is not None else "-",
            str(entry.effective),
        )
    Console().print(table if current else "no concurrency limits")
    return EXIT_OK


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _shown_time(value: dt.datetime | None) -> str:
    """A time for a table: this machine's local time, to the second (``--json`` has it all)."""
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def _jobs(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sqla_queue.listing import list_jobs

    queue, url = _target(args)
    about_table, about_key = args.about if args.about else (None, None)
    states = [state for group in args.status or [] for state in group]
    engine = _engine(url)
    try:
        with engine.connect() as connection:
            rows = list_jobs(
                connection,
                queue.tables,
                limit=args.limit,
                tasks=args.task or [],
                states=states,
                key=args.key,
                about_table=about_table,
                about_key=about_key,
            )
    finally:
        engine.dispose()
    if args.json:
        _print_json([row.as_json() for row in rows])
        return EXIT_OK
    table = Table("id", "task", "state", "attempts", "created", "finished", "unique key", "about")
    for column in table.columns[:6]:
        column.no_wrap = True
    for row in rows:
        about = f"{row.about_table}:{row.about_key}" if row.about_table is not None else "-"
        table.add_row(
            str(row.id),
            row.task,
            row.state,
            f"{row.attempts}/{row.max_attempts}",
            _shown_time(row.created_at),
            _shown_time(row.finished_at),
            row.unique_key if row.unique_key is not None else "-",
            about,
        )
    Console().print(table if rows else "no jobs")
    return EXIT_OK


#: How ``cancel`` shows each outcome: its word, then what it means.
_CANCEL_WORDS = {
    CancelOutcome.CANCELLED: "cancelled",
    CancelOutcome.REQUESTED: "requested (it is running: asked to stop, it ends cancelled "
    "unless it succeeds)",
    CancelOutcome.FINISHED: "finished (already {status}: nothing to cancel)",
    CancelOutcome.NOT_FOUND: "not_found (no job has this id)",
}


def _cancel(args: argparse.Namespace) -> int:
    from sqla_queue.listing import list_jobs

    queue, url = _target(args)
    ids = list(dict.fromkeys(args.ids))
    engine = _engine(url)
    try:
        # The cancel commits on a connection of its own; the statuses are read after it.
        outcomes = queue.cancel(engine, ids)
        finished = [job_id for job_id in ids if outcomes[job_id] == CancelOutcome.FINISHED]
        statuses: dict[int, str] = {}
        if finished:
            with engine.connect() as connection:
                statuses = {
                    row.id: row.status
                    for row in list_jobs(
                        connection, queue.tables, ids=finished, limit=len(finished)
                    )
                }
    finally:
        engine.dispose()
    if args.json:
        _print_json(
            [
                {"id": job_id, "outcome": outcomes[job_id]}
                | ({"status": statuses[job_id]} if job_id in statuses else {})
                for job_id in ids
            ]
        )
    else:
        for job_id in ids:
            words = _CANCEL_WORDS[outcomes[job_id]].format(status=statuses.get(job_id, "?"))
            print(f"job {job_id}: {words}")
    found = set(outcomes.values())
    if CancelOutcome.NOT_FOUND in found:
        return EXIT_NOT_FOUND
    if CancelOutcome.FINISHED in found:
        return EXIT_FINISHED
    return EXIT_OK


def _result(args: argparse.Namespace) -> int:
    queue, url = _target(args)
    job_id = args.id
    engine = _engine(url)
    report: dict[str, Any] = {"id": job_id}
    try:
        value = queue.result(engine, job_id, timeout=args.timeout)
    except JobFailedError as exc:
        status, report["outcome"], report["error"] = EXIT_FAILED, "failed", exc.error
        traceback = str((exc.error or {}).get("traceback") or "").rstrip()
        detail = f"{exc}\n{traceback}" if traceback else str(exc)
    except JobCancelledError as exc:
        status, report["outcome"], detail = EXIT_CANCELLED, "cancelled", str(exc)
    except ResultTimeoutError as exc:
        status, report["outcome"], detail = EXIT_TIMEOUT, "timeout", str(exc)
    except JobNotFoundError as exc:
        status, report["outcome"], detail = EXIT_NOT_FOUND, "not_found", str(exc)
    except KeyboardInterrupt:
        print(f"sqla-queue: interrupted while waiting for job {job_id}", file=sys.stderr)
        return EXIT_INTERRUPTED
    else:
        if args.json:
            _print_json({"id": job_id, "outcome": "succeeded", "result": value})
        else:
            print(json.dumps(value, ensure_ascii=False))
        return EXIT_OK
    finally:
        engine.dispose()
    if args.json:
        report["message"] = str(detail).splitlines()[0]
        _print_json(report)
    else:
        print(f"sqla-queue: {detail}", file=sys.stderr)
    return status


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
    # No SQLSTATE: the driver failed before the server answered (refused, unreachable).
    if state is None or state.startswith(_CONNECT_CLASSES) or state == _CANNOT_CONNECT_NOW:
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
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from sqla_queue.cli.controls import run_pause, run_rate_limit, run_resume
    from sqla_queue.cli.daemons import run_daemons
    from sqla_queue.cli.dashboard import run_dashboard
    from sqla_queue.cli.history import run_maintain
    from sqla_queue.cli.periodic import run_periodic
    from sqla_queue.cli.status import run_status, run_top

    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "worker": _run_worker,
        "verify": _verify,
        "failed": _failed,
        "requeue": _requeue,
        "jobs": _jobs,
        "cancel": _cancel,
        "result": _result,
        "prune": _prune,
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
        print(f"sqla-queue: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DBAPIError as exc:
        print(database_error_message(exc, getattr(args, "resolved_url", None)), file=sys.stderr)
        return EXIT_DATABASE
