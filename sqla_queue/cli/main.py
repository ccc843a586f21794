"""``sqla-queue``: run workers, verify the schema, inspect and requeue failed jobs, demo."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import sys
from collections.abc import Sequence

from sqlalchemy import create_engine

from sqla_queue.cli.loading import CliError, database_url, load_queue
from sqla_queue.errors import SqlaQueueError

__all__ = ["main"]


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


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
    if value < 0:
        raise argparse.ArgumentTypeError("a duration cannot be negative")
    return dt.timedelta(seconds=value * _UNITS.get(unit, 1))


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", help="the Queue to use, as MODULE:ATTRIBUTE (myapp.jobs:queue)")
    parser.add_argument("--url", help="database URL (default: $DATABASE_URL)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(prog="sqla-queue", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    worker = sub.add_parser("worker", help="run a worker until SIGINT/SIGTERM")
    _add_target(worker)
    worker.add_argument("--concurrency", type=int, default=10, help="handlers at once")
    worker.add_argument("--batch-size", type=int, help="executions per claim")
    worker.add_argument("--tasks", help="comma-separated task names (default: all registered)")
    worker.add_argument("--async", dest="use_async", action="store_true", help="asyncio worker")
    worker.add_argument("--burst", action="store_true", help="exit when nothing is eligible")
    worker.add_argument("--poll-interval", type=float, default=1.0, help="max seconds idle")
    worker.add_argument("--shutdown-timeout", type=float, default=30.0, help="grace seconds")

    verify = sub.add_parser("verify", help="check that the database has the queue's schema")
    _add_target(verify)

    failed = sub.add_parser("failed", help="list failed jobs, newest first")
    _add_target(failed)
    failed.add_argument("--limit", type=int, default=20)

    requeue = sub.add_parser("requeue", help="run failed jobs again")
    _add_target(requeue)
    requeue.add_argument("ids", nargs="+", type=int, help="job ids")

    prune = sub.add_parser("prune", help="delete finished jobs older than a given age")
    _add_target(prune)
    prune.add_argument(
        "--older-than", type=parse_duration, required=True, help="age such as 7d, 12h, 30m, 90s"
    )
    prune.add_argument("--include-failed", action="store_true", help="failed jobs go too")

    limits = sub.add_parser(
        "limits",
        help="list, set or unset per-task concurrency limits (shared by all workers)",
        description="sqla-queue limits APP:QUEUE [list | set TASK N | unset TASK]",
    )
    _add_target(limits)
    limits.add_argument("words", nargs="*", help="list (default) | set TASK N | unset TASK")

    demo = sub.add_parser("demo", help="a real end-to-end demo: a shop, its orders, 2 workers")
    demo.add_argument("--url", help="database URL (default: $DATABASE_URL, else embedded)")
    demo.add_argument("--orders", type=int, default=3000, help="orders to place")
    demo.add_argument("--workers", type=int, default=2, help="worker processes")
    return parser


def _pool_size(args: argparse.Namespace) -> int:
    # The run loop, the heartbeater and one per handler (its ctx.session): a smaller pool
    # would open and close a connection for nearly every job.
    return int(args.concurrency) + 3


def _run_worker(args: argparse.Namespace) -> int:
    queue = load_queue(args.queue)
    url = database_url(args.url)
    settings = {
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "poll_interval": args.poll_interval,
        "shutdown_timeout": args.shutdown_timeout,
        "tasks": args.tasks.split(",") if args.tasks else None,
    }
    if args.use_async:
        from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

        async def run_async() -> None:
            engine = create_async_engine(url, pool_size=_pool_size(args))
            try:
                worker = queue.async_worker(async_sessionmaker(engine), **settings)
                await worker.run(burst=args.burst)
            finally:
                await engine.dispose()

        asyncio.run(run_async())
        return 0
    from sqlalchemy.orm import sessionmaker

    engine = create_engine(url, pool_size=_pool_size(args))
    try:
        queue.worker(sessionmaker(engine), **settings).run(burst=args.burst)
    finally:
        engine.dispose()
    return 0


def _verify(args: argparse.Namespace) -> int:
    queue = load_queue(args.queue)
    engine = create_engine(database_url(args.url))
    try:
        with engine.connect() as connection:
            queue.verify(connection)
    finally:
        engine.dispose()
    print("schema OK")
    return 0


def _failed(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sqla_queue.admin import failed_jobs

    queue = load_queue(args.queue)
    engine = create_engine(database_url(args.url))
    try:
        with engine.connect() as connection:
            rows = failed_jobs(connection, queue.tables, limit=args.limit)
    finally:
        engine.dispose()
    table = Table("id", "task", "attempts", "failed at", "last error")
    for row in rows:
        error = row.last_error or {}
        message = f"{error.get('type', '')}: {error.get('message', '')}".strip(": ")
        table.add_row(str(row.id), row.task, str(row.attempts), str(row.finished_at), message)
    Console().print(table if rows else "no failed jobs")
    return 0


def _requeue(args: argparse.Namespace) -> int:
    queue = load_queue(args.queue)
    engine = create_engine(database_url(args.url))
    try:
        with engine.begin() as connection:
            done = queue.requeue(connection, args.ids)
    finally:
        engine.dispose()
    skipped = sorted(set(args.ids) - set(done))
    print(f"requeued {len(done)} job(s): {done}")
    if skipped:
        print(f"not failed or cancelled, left alone: {skipped}")
    return 0


def _prune(args: argparse.Namespace) -> int:
    queue = load_queue(args.queue)
    engine = create_engine(database_url(args.url))
    try:
        with engine.begin() as connection:
            count = queue.prune(
                connection, older_than=args.older_than, include_failed=args.include_failed
            )
    finally:
        engine.dispose()
    print(f"pruned {count} finished job(s) older than {args.older_than}")
    return 0


def _limits_words(words: Sequence[str]) -> tuple[str, str, int | None]:
    usage = "use: sqla-queue limits APP:QUEUE [list | set TASK N | unset TASK]"
    if not words or list(words) == ["list"]:
        return "list", "", None
    if words[0] == "set" and len(words) == 3:
        try:
            return "set", words[1], int(words[2])
        except ValueError:
            raise CliError(f"the limit must be a whole number >= 1, got {words[2]!r}") from None
    if words[0] == "unset" and len(words) == 2:
        return "unset", words[1], None
    raise CliError(f"unexpected arguments {' '.join(words)!r}; {usage}")


def _limits(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    queue = load_queue(args.queue)
    action, task, limit = _limits_words(args.words)
    engine = create_engine(database_url(args.url))
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
        print(f"{task}: limit now {shown if shown is not None else 'none'}")
        return 0
    table = Table("task", "declared in code", "stored", "effective")
    for name, entry in current.items():
        table.add_row(
            name,
            str(entry.declared) if entry.declared is not None else "-",
            str(entry.stored) if entry.stored is not None else "-",
            str(entry.effective),
        )
    Console().print(table if current else "no concurrency limits")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from sqla_queue.demo.run import run_demo

    return run_demo(url=args.url, orders=args.orders, workers=args.workers)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sqla-queue`` command; returns the exit status."""
    parser = build_parser()
    # parse_known_args lets `limits APP --url X set TASK N` put its words after options.
    args, rest = parser.parse_known_args(argv)
    if rest:
        if args.command != "limits" or any(word.startswith("-") for word in rest):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        args.words = [*args.words, *rest]
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    commands = {
        "worker": _run_worker,
        "verify": _verify,
        "failed": _failed,
        "requeue": _requeue,
        "prune": _prune,
        "limits": _limits,
        "demo": _demo,
    }
    try:
        return commands[args.command](args)
    except (CliError, SqlaQueueError) as exc:
        print(f"sqla-queue: {exc}", file=sys.stderr)
        return 2
