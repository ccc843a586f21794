"""One benchmark process: a worker of one contender, or a producer of business transactions.

Started by the scenarios as ``python -m bench.worker ROLE SYSTEM ...``. It sets itself up
(imports, engine, first connection), prints ``READY``, waits for ``GO`` on stdin, works,
and prints one JSON line: its peak RSS and whatever the role measured.

Roles:

* ``drain``: process jobs until none is left (sqla_queue ``run(burst=True)``, PgQueuer
  ``mode=drain``, the bare loops until an empty claim);
* ``idle``: wait for jobs until SIGTERM (the latency scenario);
* ``produce``: run ``--count`` business transactions, each inserting an order and
  enqueueing one job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import sessionmaker

from bench import app, baseline

SYSTEMS = ("sqla-sync", "sqla-async", "pgqueuer", "bare", "bare-min", "bare-1tx")
PRODUCERS = (
    "host-only",
    "sqla",
    "sqla-quiet",
    "host-only-psycopg",
    "bare",
    "host-only-asyncpg",
    "pgqueuer",
)
PGQ_CHANNEL = "ch_pgqueuer"


#: CPU seconds (all threads, user + system) this process had used when released.
_CLOCK = {"cpu_at_go": 0.0}


def _handshake() -> None:
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        sys.exit(3)
    _CLOCK["cpu_at_go"] = time.process_time()


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB.

    ``VmHWM`` belongs to the process's own address space. ``ru_maxrss`` would not do: Linux
    carries it over from the parent across fork and exec, so every child would report at
    least the size of the benchmark runner.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _report(**values: Any) -> None:
    cpu = time.process_time() - _CLOCK["cpu_at_go"]
    print(json.dumps({"maxrss_mb": peak_rss_mb(), "cpu_s": cpu, **values}), flush=True)


def statement_kind(statement: str) -> str:
    """Which of the worker's statements ``statement`` is (for ``--trace-statements``)."""
    if "candidates AS" in statement or "seats AS" in statement:
        return "claim"
    if "jsonb_to_recordset" in statement and "finished AS" in statement:
        return "complete"
    if "stale AS" in statement:
        return "reclaim"
    if "unnest" in statement and "alive_at" in statement:
        return "heartbeat"
    return "other"


def trace_statements(engine: Engine, counts: Counter[str]) -> None:
    """Count the statements ``engine`` sends into ``counts``, by kind.

    Statements the worker runs on psycopg's raw cursor (``raw_statements``) pass no engine
    event; they are counted where they are rendered, BEGIN and COMMIT as "other".
    """
    from sqla_queue.worker.raw import RawStatements

    @event.listens_for(engine, "before_cursor_execute")
    def _count(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        counts[statement_kind(statement)] += 1

    render_steps = RawStatements.render_steps

    def counted(self: RawStatements, steps: Any, *, atomic: bool) -> Any:
        rendered = render_steps(self, steps, atomic=atomic)
        for statement, _ in rendered:
            counts[statement_kind(statement.sql)] += 1
        return rendered

    RawStatements.render_steps = counted  # type: ignore[method-assign]


def _stop_on_sigterm() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


# -- sqla_queue -------------------------------------------------------------------------------


def _through_options(args: argparse.Namespace) -> dict[str, Any]:
    """``create_engine`` options of an engine through a pooler (``--through``).

    PgBouncer before 1.21 in transaction mode keeps no prepared statement: psycopg's are
    turned off. The worker then LISTENs on ``--dsn``, a direct connection.
    """
    return {"connect_args": {"prepare_threshold": None}} if args.through else {}


def run_sqla_sync(args: argparse.Namespace) -> None:
    """The sync worker, built the way ``sqla-queue worker`` builds it."""
    target = app.quiet_queue if args.quiet else app.queue
    engine = create_engine(args.through or args.url, pool_size=2, **_through_options(args))
    counts: Counter[str] = Counter()
    if args.trace_statements:
        trace_statements(engine, counts)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    worker = target.worker(
        sessionmaker(engine),
        concurrency=args.concurrency,
        tasks=[args.task],
        poll_interval=args.poll_interval,
        listen=not args.quiet,
        listen_url=args.dsn if args.through else None,
    )
    _handshake()
    stats = worker.run(burst=args.role == "drain")
    engine.dispose()
    _report(claimed=stats.claimed, starts=app.STARTS, statements=counts)


def run_sqla_async(args: argparse.Namespace) -> None:
    """The asyncio worker, built the way ``sqla-queue worker --async`` builds it."""
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    target = app.quiet_queue if args.quiet else app.queue

    counts: Counter[str] = Counter()

    async def main() -> int:
        engine = create_async_engine(
            args.through or args.url, pool_size=2, **_through_options(args)
        )
        if args.trace_statements:
            trace_statements(engine.sync_engine, counts)
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        worker = target.async_worker(
            async_sessionmaker(engine),
            concurrency=args.concurrency,
            tasks=[args.task],
            poll_interval=args.poll_interval,
            listen=not args.quiet,
            listen_url=args.dsn if args.through else None,
        )
        _handshake()
        stats = await worker.run(burst=args.role == "drain")
        await engine.dispose()
        return stats.claimed

    claimed = asyncio.run(main())
    _report(claimed=claimed, starts=app.STARTS, statements=counts)


# -- PgQueuer ---------------------------------------------------------------------------------


def run_pgqueuer(args: argparse.Namespace) -> None:
    """PgQueuer's QueueManager on one asyncpg connection, as its docs set it up."""
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    async def main() -> None:
        conn = await asyncpg.connect(args.dsn)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        if args.task == app.STAMP:

            @qm.entrypoint(app.STAMP)
            async def stamp(job: Job) -> None:
                app.STARTS[int(job.payload or b"0")] = time.monotonic()

        else:

            @qm.entrypoint(args.task, concurrency_limit=args.limit)
            async def noop(job: Job) -> None:
                return None

        if args.hot_task:
            # PgQueuer has no per-key ordering; its nearest equivalent of one hot queue_id
            # is an entrypoint of its own that runs one job at a time.
            @qm.entrypoint(args.hot_task, concurrency_limit=1)
            async def hot(job: Job) -> None:
                return None

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
        _handshake()
        mode = QueueExecutionMode.drain if args.role == "drain" else QueueExecutionMode.continuous
        await qm.run(batch_size=args.concurrency, mode=mode)
        await conn.close()

    asyncio.run(main())
    _report(starts=app.STARTS)


# -- bare SQL ---------------------------------------------------------------------------------


def _bare_handler(task: str) -> Any:
    if task == app.STAMP:
        return lambda seq: app.STARTS.__setitem__(seq, time.monotonic())
    return lambda **_: None


def run_bare(args: argparse.Namespace) -> None:
    """The bare psycopg loops of :mod:`bench.baseline`."""
    handler = _bare_handler(args.task)
    if args.role == "drain":
        # A drain that counts only the first jobs is stopped with SIGTERM between batches.
        stopped = _stop_on_sigterm()
        _handshake()
        last = baseline.drain(
            args.dsn,
            flavour=args.system,
            task=args.task,
            batch=args.concurrency,
            handler=handler,
            stop=stopped.is_set,
        )
        _report(last_done=last)
        return
    stop = _stop_on_sigterm()
    _handshake()
    baseline.listen_and_run(
        args.dsn,
        channel=app.queue.tables.notify_channel,
        task=args.task,
        batch=args.concurrency,
        handler=handler,
        stop=stop.is_set,
    )
    _report(starts=app.STARTS)


# -- producers ----------------------------------------------------------------------------------


def run_producer(args: argparse.Namespace) -> None:
    """``--count`` business transactions: one order row and (but for host-only) one job."""
    kind = args.system
    if kind in ("pgqueuer", "host-only-asyncpg"):
        _produce_pgqueuer(args)
        return
    if kind in ("bare", "host-only-psycopg"):
        _produce_bare(args)
        return
    engine = create_engine(args.url, pool_size=1)
    SessionLocal = sessionmaker(engine)
    target = app.quiet_queue if kind == "sqla-quiet" else app.queue
    noop = target.get_task(app.NOOP)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    _handshake()
    start = time.monotonic()
    for i in range(args.count):
        with SessionLocal.begin() as session:
            session.add(app.Order(total=i))
            if kind != "host-only":
                noop.enqueue(session, n=i)
    end = time.monotonic()
    engine.dispose()
    _report(start=start, end=end)


def _produce_bare(args: argparse.Namespace) -> None:
    import psycopg

    with psycopg.connect(args.dsn) as conn:
        _handshake()
        start = time.monotonic()
        for i in range(args.count):
            with conn.transaction():
                conn.execute("INSERT INTO bench_orders (total) VALUES (%s)", (i,))
                if args.system == "host-only-psycopg":
                    continue
                conn.execute(
                    baseline.ENQUEUE_ONE_NOTIFY,
                    {
                        "task": app.NOOP,
                        "payload": baseline.payload(n=i),
                        "channel": app.queue.tables.notify_channel,
                    },
                )
        end = time.monotonic()
    _report(start=start, end=end)


def _produce_pgqueuer(args: argparse.Namespace) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def main() -> tuple[float, float]:
        conn = await asyncpg.connect(args.dsn)
        queries = Queries(AsyncpgDriver(conn))
        _handshake()
        start = time.monotonic()
        for i in range(args.count):
            async with conn.transaction():
                await conn.execute("INSERT INTO bench_orders (total) VALUES ($1)", i)
                if args.system == "pgqueuer":
                    await queries.enqueue(app.NOOP, str(i).encode())
        end = time.monotonic()
        await conn.close()
        return start, end

    start, end = asyncio.run(main())
    _report(start=start, end=end)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("drain", "idle", "produce"))
    parser.add_argument("system", choices=sorted(set(SYSTEMS) | set(PRODUCERS)))
    parser.add_argument("--url", required=True, help="SQLAlchemy URL of the scratch database")
    parser.add_argument("--dsn", required=True, help="the same database as a libpq URI")
    parser.add_argument("--concurrency", type=int, default=10, help="concurrency and batch")
    parser.add_argument("--task", default=app.NOOP)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--quiet", action="store_true", help="no NOTIFY, no LISTEN")
    parser.add_argument(
        "--through",
        default="",
        help="sqla_queue workers: the engine's URL through a pooler in transaction mode "
        "(PgBouncer) instead of --url; prepared statements off, LISTEN on --dsn",
    )
    parser.add_argument("--limit", type=int, default=0, help="PgQueuer concurrency_limit")
    parser.add_argument(
        "--hot-task", default="", help="PgQueuer: a second entrypoint, one job at a time"
    )
    parser.add_argument(
        "--trace-statements", action="store_true", help="count statements (sqla_queue only)"
    )
    parser.add_argument("--count", type=int, default=1000, help="transactions to produce")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run one process of a scenario."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = parse_args(argv)
    if args.role == "produce":
        run_producer(args)
    elif args.system == "sqla-sync":
        run_sqla_sync(args)
    elif args.system == "sqla-async":
        run_sqla_async(args)
    elif args.system == "pgqueuer":
        run_pgqueuer(args)
    else:
        run_bare(args)


if __name__ == "__main__":
    main()
