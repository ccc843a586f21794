"""One benchmark process: a worker of one contender, or a producer of business transactions.

Started by the scenarios as ``python -m bench.worker ROLE SYSTEM ...``. It sets itself up
(imports, engine, first connection), prints ``READY``, waits for ``GO`` on stdin, works,
and prints one JSON line: its peak RSS and whatever the role measured.

Roles:

* ``drain``: process jobs until none is left (sqla_queue ``run(burst=True)``, PgQueuer
  ``mode=drain``, the bare loops until an empty claim);
* ``idle``: wait for jobs until SIGTERM (the latency scenario);
* ``produce``: run ``--count`` business transactions, each inserting an order and
  enqueueing one job;
* ``produce-paced``: business transactions at a fixed ``--rate`` for ``--seconds`` (the
  sustained-load scenario, :mod:`bench.sustained`), each enqueueing one stamp job keyed
  ``--offset + i``. The i-th transaction is due at ``start + --phase + i / rate`` (a
  schedule that does not drift: a late transaction is followed at once by the next);
  ``--lanes`` threads (asyncio tasks for PgQueuer), one connection each, run them, so
  that commits waiting on the disk do not hold the schedule back; ``--nice`` lowers the
  producer's CPU priority below the workers'. The window closes ``--seconds`` after the
  start; transactions still due then are not run. It reports ``commits`` (``[key,
  monotonic time right after the commit]`` pairs) and how late the transactions
  started. Systems: ``sqla`` (a Session: an order row and ``task.enqueue(session, ...)``
  of ``--task``, ``bench.stamp`` or, for the asyncio worker, ``bench.astamp``; with
  ``--quiet`` through the queue that sends no NOTIFY), ``pgqueuer`` (asyncpg: the order
  row and PgQueuer's ``Queries.enqueue`` in one transaction), ``graphile`` (psycopg: the
  order row and ``graphile_worker.add_job`` in one transaction).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
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
#: The producers of the ``produce-paced`` role.
PACED = ("sqla", "pgqueuer", "graphile")
#: graphile-worker's task of the sustained scenario (the Node worker's stamp handler).
GRAPHILE_TASK = "noop"
#: The ``async def`` twin of ``bench.app``'s stamp task, for the asyncio worker (which runs
#: plain functions in a thread pool).
ASTAMP = "bench.astamp"


async def _astamp(seq: int) -> None:
    """Record when the handler of job number ``seq`` started."""
    app.STARTS[seq] = time.monotonic()


app.queue.task(name=ASTAMP)(_astamp)


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


def _sqla_target(args: argparse.Namespace) -> Any:
    """The queue a sqla_queue worker serves: the app's, its quiet or its history-less view."""
    if args.no_history:
        return app.nohistory_queue
    return app.quiet_queue if args.quiet else app.queue


def run_sqla_sync(args: argparse.Namespace) -> None:
    """The sync worker, built the way ``sqla-queue worker`` builds it."""
    target = _sqla_target(args)
    engine = create_engine(args.through or args.url, pool_size=2, **_through_options(args))
    counts: Counter[str] = Counter()
    if args.trace_statements:
        trace_statements(engine, counts)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    worker = target.worker(
        sessionmaker(engine),
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        tasks=[args.task],
        poll_interval=args.poll_interval,
        listen=not args.quiet,
        listen_url=args.dsn if args.through else None,
    )
    _handshake()
    stats = worker.run(burst=args.role == "drain")
    last_done = time.monotonic()
    engine.dispose()
    _report(claimed=stats.claimed, starts=app.STARTS, statements=counts, last_done=last_done)


def run_sqla_async(args: argparse.Namespace) -> None:
    """The asyncio worker, built the way ``sqla-queue worker --async`` builds it."""
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    target = _sqla_target(args)

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
            prefetch=args.prefetch,
            tasks=[args.task],
            poll_interval=args.poll_interval,
            listen=not args.quiet,
            listen_url=args.dsn if args.through else None,
        )
        _handshake()
        stats = await worker.run(burst=args.role == "drain")
        done["last_done"] = time.monotonic()
        await engine.dispose()
        return stats.claimed

    done: dict[str, float] = {}
    claimed = asyncio.run(main())
    _report(claimed=claimed, starts=app.STARTS, statements=counts, **done)


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


# -- paced producers (the sustained-load scenario) ----------------------------------------------


class Pacer:
    """The due times of a paced producer: the i-th at ``start + phase + i / rate``.

    Its lanes (threads or tasks, one connection each) take the next transaction from it,
    so that up to ``lanes`` transactions are in flight when commits wait on the disk.
    ``late`` collects how far behind its due time each transaction started (seconds).
    """

    def __init__(self, rate: float, seconds: float, phase: float) -> None:
        self.rate = rate
        self.phase = phase
        self.count = max(0, math.ceil((seconds - phase) * rate))
        self.start = time.monotonic()
        self.end = self.start + seconds
        self.late: list[float] = []
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> tuple[int, float] | None:
        """The next transaction's index and the seconds to sleep before it; None at the end."""
        with self._lock:
            i = self._next
            now = time.monotonic()
            if now >= self.end or i >= self.count:
                return None
            self._next += 1
        pause = self.start + self.phase + i / self.rate - now
        self.late.append(max(0.0, -pause))
        return i, max(0.0, pause)

    def report(self, commits: list[tuple[int, float]]) -> dict[str, Any]:
        """What the parent needs: the commits and how far the producer lagged."""
        late = sorted(self.late)
        return {
            "start": self.start,
            "scheduled": self.count,
            "commits": commits,
            "late_p50_ms": 1000 * late[len(late) // 2] if late else 0.0,
            "late_max_ms": 1000 * late[-1] if late else 0.0,
        }


def run_paced(args: argparse.Namespace) -> None:
    """Business transactions at ``--rate`` for ``--seconds``, one stamp job each."""
    import os

    # A lower priority keeps many producer threads from starving the workers of CPU on a
    # small machine (in production they run on other hosts); a shorter switch interval
    # keeps a lane that has just committed from waiting long for the GIL to stamp it.
    os.nice(args.nice)
    sys.setswitchinterval(0.001)
    if args.system == "pgqueuer":
        _paced_pgqueuer(args)
    else:
        _paced_threads(args)


def _paced_threads(args: argparse.Namespace) -> None:
    """``--lanes`` threads, each with its own connection: sqla_queue or graphile-worker."""
    import psycopg

    commits: list[tuple[int, float]] = []
    errors: list[BaseException] = []
    engine = create_engine(args.url, pool_size=args.lanes)
    SessionLocal = sessionmaker(engine)
    # --quiet: the queue that sends no NOTIFY (its workers poll).
    target = app.quiet_queue if args.quiet else app.queue
    stamp = target.get_task(args.task if args.task in (app.STAMP, ASTAMP) else app.STAMP)

    def sqla_lane(pacer: Pacer) -> None:
        while (got := pacer.take()) is not None:
            i, pause = got
            time.sleep(pause)
            n = args.offset + i
            with SessionLocal.begin() as session:
                session.add(app.Order(total=n))
                stamp.enqueue(session, seq=n)
            commits.append((n, time.monotonic()))

    def graphile_lane(pacer: Pacer, conn: psycopg.Connection[Any]) -> None:
        while (got := pacer.take()) is not None:
            i, pause = got
            time.sleep(pause)
            n = args.offset + i
            with conn.transaction():
                conn.execute("INSERT INTO bench_orders (total) VALUES (%s)", (n,))
                conn.execute(
                    "SELECT graphile_worker.add_job(%s, json_build_object('n', %s::bigint))",
                    (GRAPHILE_TASK, n),
                )
            commits.append((n, time.monotonic()))

    def guarded(lane: Any, *lane_args: Any) -> None:
        try:
            lane(*lane_args)
        except BaseException as exc:
            errors.append(exc)
            raise

    conns: list[psycopg.Connection[Any]] = []
    if args.system == "graphile":
        conns = [psycopg.connect(args.dsn, autocommit=True) for _ in range(args.lanes)]
    else:
        # Open every lane's pooled connection before the clock.
        held = [engine.connect() for _ in range(args.lanes)]
        for pooled in held:
            pooled.execute(text("SELECT 1"))
        for pooled in held:
            pooled.close()
    _handshake()
    pacer = Pacer(args.rate, args.seconds, args.phase)
    threads = [
        threading.Thread(
            target=guarded,
            args=(graphile_lane, pacer, conns[k]) if conns else (sqla_lane, pacer),
        )
        for k in range(args.lanes)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for conn in conns:
        conn.close()
    engine.dispose()
    if errors:
        raise errors[0]
    _report(**pacer.report(sorted(commits)))


def _paced_pgqueuer(args: argparse.Namespace) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    commits: list[tuple[int, float]] = []

    async def lane(pacer: Pacer, conn: Any) -> None:
        queries = Queries(AsyncpgDriver(conn))
        while (got := pacer.take()) is not None:
            i, pause = got
            await asyncio.sleep(pause)
            n = args.offset + i
            async with conn.transaction():
                await conn.execute("INSERT INTO bench_orders (total) VALUES ($1)", n)
                await queries.enqueue(app.STAMP, str(n).encode())
            commits.append((n, time.monotonic()))

    async def main() -> dict[str, Any]:
        conns = [await asyncpg.connect(args.dsn) for _ in range(args.lanes)]
        _handshake()
        pacer = Pacer(args.rate, args.seconds, args.phase)
        await asyncio.gather(*(lane(pacer, conn) for conn in conns))
        for conn in conns:
            await conn.close()
        return pacer.report(sorted(commits))

    _report(**asyncio.run(main()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("drain", "idle", "produce", "produce-paced"))
    parser.add_argument("system", choices=sorted(set(SYSTEMS) | set(PRODUCERS) | set(PACED)))
    parser.add_argument("--url", required=True, help="SQLAlchemy URL of the scratch database")
    parser.add_argument("--dsn", required=True, help="the same database as a libpq URI")
    parser.add_argument("--concurrency", type=int, default=10, help="concurrency and batch")
    parser.add_argument("--task", default=app.NOOP)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--quiet", action="store_true", help="no NOTIFY, no LISTEN")
    parser.add_argument(
        "--prefetch", type=int, default=0, help="sqla_queue: jobs claimed beyond concurrency"
    )
    parser.add_argument(
        "--no-history", action="store_true", help='sqla_queue: the Queue(history="none") view'
    )
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
    parser.add_argument("--rate", type=float, default=100.0, help="produce-paced: tx/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="produce-paced: window")
    parser.add_argument("--offset", type=int, default=0, help="produce-paced: first key")
    parser.add_argument(
        "--phase", type=float, default=0.0, help="produce-paced: delay of the first due time"
    )
    parser.add_argument(
        "--lanes", type=int, default=1, help="produce-paced: transactions in flight at most"
    )
    parser.add_argument("--nice", type=int, default=0, help="produce-paced: niceness to add")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run one process of a scenario."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = parse_args(argv)
    if args.role == "produce":
        run_producer(args)
    elif args.role == "produce-paced":
        run_paced(args)
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
