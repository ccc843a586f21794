"""``sqla-queue worker`` and ``sqla-queue verify``: run a worker, and check the database that
workers need (its schema and the privileges of the connected role)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from sqlalchemy.exc import ArgumentError, InvalidRequestError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from sqla_queue.cli.loading import CliError, load_queue, shown_url
from sqla_queue.cli.render import say
from sqla_queue.cli.scaffold import (
    COMMON_EXITS,
    EXIT_OK,
    Subparsers,
    add_command,
    connected,
    engine_of,
    make_engine,
    target,
)
from sqla_queue.cli.values import seconds, whole_number
from sqla_queue.metrics.serve import serve_worker_metrics
from sqla_queue.queue import Queue

__all__ = ["LISTEN_URL_ENV", "VERIFY_HELP", "WORKER_HELP", "add_worker_parsers", "require_tasks"]

#: Environment variable: the worker's ``--listen-url`` when the option is not given.
LISTEN_URL_ENV = "SQLA_QUEUE_LISTEN_URL"

#: The most handlers a worker may run at once from the command line (a thread each).
_CONCURRENCY = 10_000

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


def add_worker_parsers(sub: Subparsers) -> None:
    """Add the ``worker`` and ``verify`` sub-commands."""
    worker = add_command(
        sub,
        "worker",
        _run_worker,
        summary="run a worker until SIGINT/SIGTERM",
        description=WORKER_HELP,
    )
    worker.add_argument(
        "--concurrency",
        type=whole_number(1, _CONCURRENCY, "--concurrency"),
        default=10,
        help="handlers at once",
    )
    worker.add_argument(
        "--batch-size",
        type=whole_number(1, _CONCURRENCY, "--batch-size"),
        help="executions per claim",
    )
    worker.add_argument(
        "--prefetch",
        type=whole_number(0, _CONCURRENCY, "--prefetch"),
        default=0,
        help="jobs claimed ahead of need, beyond --concurrency (short jobs; default 0)",
    )
    worker.add_argument("--tasks", help="comma-separated task names (default: all registered)")
    worker.add_argument("--async", dest="use_async", action="store_true", help="asyncio worker")
    worker.add_argument("--burst", action="store_true", help="exit when nothing is eligible")
    worker.add_argument(
        "--poll-interval", type=seconds(allow_zero=False), default=1.0, help="max seconds idle"
    )
    worker.add_argument(
        "--shutdown-timeout", type=seconds(allow_zero=True), default=30.0, help="grace seconds"
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
        type=whole_number(1, 100, "--pool-size"),
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
        type=whole_number(1, 65535, "--metrics-port"),
        help="serve Prometheus metrics at http://HOST:PORT/metrics (needs sqla-queue[prometheus])",
    )
    worker.add_argument(
        "--metrics-host", default="127.0.0.1", help="address of --metrics-port (default: loopback)"
    )
    add_command(
        sub,
        "verify",
        _verify,
        summary="check that the database has the queue's schema and privileges",
        description=VERIFY_HELP,
    )


def _pool_size(args: argparse.Namespace) -> int:
    # One per handler (its ctx.session): a smaller pool would open and close a connection
    # for nearly every job. The worker's own statements have a pool of their own
    # (--pool-size, see sqla_queue/worker/pools.py).
    return int(args.concurrency)


def _settings(args: argparse.Namespace, queue: Queue, url: str) -> dict[str, Any]:
    """The worker's settings from the command line; starts the metrics server if asked."""
    settings: dict[str, Any] = {
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "prefetch": args.prefetch,
        "poll_interval": args.poll_interval,
        "shutdown_timeout": args.shutdown_timeout,
        "tasks": args.tasks.split(",") if args.tasks else None,
        "listen": args.listen,
        "listen_url": args.listen_url or os.environ.get(LISTEN_URL_ENV) or None,
        "pool_size": args.pool_size,
    }
    if args.metrics_port is not None:
        port, host = args.metrics_port, args.metrics_host
        settings["observers"] = serve_worker_metrics(queue, url, port=port, host=host)
    return settings


def require_tasks(queue: Queue, path: str) -> None:
    """Refuse to start a worker for ``path`` (``module:attribute``) whose queue has no task
    registered, naming the module the command imported and what to do instead.

    Tasks register when the module that defines them runs (``@queue.task``): a worker
    pointed at the module that creates the queue, when the tasks are in another module,
    imports only the first one.
    """
    if queue.tasks:
        return
    module_name = path.partition(":")[0]
    module = sys.modules.get(module_name)
    where = getattr(module, "__file__", None) or module_name
    raise CliError(
        f"this worker has no tasks: importing {module_name!r} ({where}) registered none on "
        f"{path}. Tasks register when the module that defines them (@queue.task) is "
        "imported: point the worker at that module (sqla-queue worker MODULE:queue, where "
        f"MODULE defines the tasks and imports the queue), or import it at the end of "
        f"{module_name!r}"
    )


def _run_worker(args: argparse.Namespace) -> int:
    if args.use_async:
        return _run_async_worker(args)
    require_tasks(load_queue(args.queue), args.queue)
    with engine_of(args, pool_size=_pool_size(args)) as (queue, engine):
        settings = _settings(args, queue, str(args.resolved_url))
        read_engine = (
            make_engine(args.read_url, pool_size=_pool_size(args)) if args.read_url else None
        )
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
            if read_engine is not None:
                read_engine.dispose()
    return EXIT_OK


def _run_async_worker(args: argparse.Namespace) -> int:
    # The asyncio worker needs async engines, which the sync scaffold does not build.
    queue, url = target(args)
    require_tasks(queue, args.queue)
    settings = _settings(args, queue, url)
    engines: list[AsyncEngine] = []
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


def _verify(args: argparse.Namespace) -> int:
    with connected(args) as (queue, connection):
        queue.verify(connection)
    say("schema OK")
    return EXIT_OK
