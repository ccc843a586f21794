"""Scenario 2 (enqueue): what a job costs the business transaction, one at a time and in bulk.

* Statements and round trips that one ``task.enqueue(session, ...)`` adds to a host
  transaction that inserts an ORM row: statements counted with SQLAlchemy's
  ``before_cursor_execute`` event, round trips counted from libpq's protocol trace (every
  simple ``Query`` and every extended-protocol ``Sync`` the client sends is one).
* Business transactions per second from P producer processes, each transaction one order
  row plus one job, for sqla_queue with and without NOTIFY, PgQueuer and the bare SQL
  statement; the host's own transaction without a job is the ceiling.
* The same business transaction on one client stack: one process alternates, transaction
  by transaction, the ORM transaction alone, with ``task.enqueue``, and with the bare SQL
  statement sent through the same session. The producer table compares each system with
  a host on its own client library (psycopg for bare SQL, the ORM session for sqla_queue),
  whose round trips do not cost the same; this one holds the client stack fixed, so the
  difference left is the enqueue's own: its Python and its statement.
* Bulk: 100k jobs in one transaction with ``queue.enqueue_many`` (by COPY, its road for a
  large batch of plain jobs on psycopg, and by its statement, the road it takes when COPY
  is turned off or cannot apply), PgQueuer's batched ``enqueue`` (lists), and a raw
  ``COPY`` of the same rows into sqla_queue's two tables.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import create_engine, event
from sqlalchemy.orm import Session

from bench import app, baseline
from bench.common import (
    BenchDatabase,
    Summary,
    TextTable,
    fmt_rate,
    fmt_ratio,
    ratio,
    summarize,
    worker_processes,
)
from bench.drain import ALL_TABLES, truncate_all

__all__ = ["EnqueueConfig", "run_enqueue"]

PRODUCER_LABELS = {
    "host-only": "SQLAlchemy ORM, no job",
    "sqla": "sqla_queue (NOTIFY)",
    "sqla-quiet": "sqla_queue (notify=False)",
    "host-only-asyncpg": "asyncpg, no job",
    "pgqueuer": "PgQueuer",
    "host-only-psycopg": "psycopg, no job",
    "bare": "bare SQL (NOTIFY)",
}
#: The host transaction without a job, on the same client stack as each system.
SAME_CLIENT = {
    "sqla": "host-only",
    "sqla-quiet": "host-only",
    "pgqueuer": "host-only-asyncpg",
    "bare": "host-only-psycopg",
}


@dataclass(frozen=True)
class EnqueueConfig:
    """How much enqueueing to measure."""

    transactions: int = 2_000
    producers: Sequence[int] = (1, 4)
    bulk: int = 100_000
    repeat: int = 3
    #: Transactions of each kind in the one-client-stack comparison.
    same_client: int = 2_000


# -- statements and round trips ----------------------------------------------------------


def count_round_trips(db: BenchDatabase) -> TextTable:
    """Statements and round trips of one business transaction, with and without a job."""
    engine = create_engine(db.url, pool_size=1)
    statements: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _count(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    noop = app.queue.get_task(app.NOOP)

    def host_only(session: Session) -> None:
        session.add(app.Order(total=1))

    def with_job(session: Session) -> None:
        session.add(app.Order(total=1))
        noop.enqueue(session, n=1)

    def job_only(session: Session) -> None:
        noop.enqueue(session, n=1)

    results: dict[str, tuple[int, int]] = {}
    try:
        for name, body in (("host", host_only), ("host+job", with_job), ("job", job_only)):
            _measure(engine, body, statements)  # warm-up: first-use queries do not count
            results[name] = _measure(engine, body, statements)
    finally:
        engine.dispose()
    table = TextTable(
        "Enqueue inside a business transaction: statements and round trips (BEGIN/COMMIT included)",
        ["transaction", "statements", "round trips", "added by the enqueue"],
    )
    base_stmts, base_trips = results["host"]
    for name, label in (
        ("host", "INSERT an order, COMMIT"),
        ("host+job", "INSERT an order + task.enqueue(), COMMIT"),
        ("job", "task.enqueue() alone, COMMIT"),
    ):
        stmts, trips = results[name]
        added = (
            f"+{stmts - base_stmts} statement, +{trips - base_trips} round trip"
            if name == "host+job"
            else ""
        )
        table.add(label, stmts, trips, added)
    return table


def _measure(
    engine: Any, body: Callable[[Session], None], statements: list[str]
) -> tuple[int, int]:
    statements.clear()
    with engine.connect() as probe:
        raw = probe.connection.dbapi_connection
        assert raw is not None
        pgconn = raw.pgconn
    with tempfile.NamedTemporaryFile("w+", delete=False) as trace:
        path = trace.name
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        pgconn.trace(fd)
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        with Session(engine) as session, session.begin():
            body(session)
        pgconn.untrace()
    finally:
        os.close(fd)
    with open(path) as trace_file:
        lines = trace_file.read().splitlines()
    os.unlink(path)
    # A round trip ends where the client hands the server a complete request: a simple
    # Query message, or a Sync closing an extended-protocol exchange.
    trips = sum(1 for line in lines if line.startswith(("F", "\tF")) and _is_request_end(line))
    return len(statements), trips


def _is_request_end(line: str) -> bool:
    parts = line.split()
    return len(parts) >= 3 and parts[2] in ("Query", "Sync")


# -- one client stack ----------------------------------------------------------------------


SAME_STACK_KINDS = {
    "host": "INSERT an order, COMMIT",
    "sqla": "+ task.enqueue()",
    "bare": "+ bare SQL statement (same session)",
}


def same_client_cost(
    db: BenchDatabase, transactions: int, walls_out: dict[str, list[float]] | None = None
) -> dict[str, tuple[float, float]]:
    """Median wall and client CPU (seconds) per business transaction of each kind.

    One process, one pooled connection, the kinds alternating transaction by transaction,
    so the machine's noise falls on all of them alike. Every transaction is an ORM session
    that adds one order; "sqla" also enqueues one job, "bare" sends the bench's bare
    enqueue statement (the same one the bare producers send) through the same session.
    ``walls_out``, if given, receives every counted transaction's wall time per kind (for
    percentiles).
    """
    from psycopg.types.json import Jsonb

    truncate_all(db)
    db.settle(("bench_orders", *ALL_TABLES))
    engine = create_engine(db.url, pool_size=1)
    noop = app.queue.get_task(app.NOOP)
    channel = app.queue.tables.notify_channel

    def bare(session: Session, i: int) -> None:
        params = {"task": app.NOOP, "payload": Jsonb({"args": [], "kwargs": {"n": i}})}
        session.connection().exec_driver_sql(
            baseline.ENQUEUE_ONE_NOTIFY, {**params, "channel": channel}
        ).scalar_one()

    bodies: dict[str, Callable[[Session, int], object] | None] = {
        "host": None,
        "sqla": lambda session, i: noop.enqueue(session, n=i),
        "bare": bare,
    }
    walls: dict[str, list[float]] = {kind: [] for kind in bodies}
    cpus: dict[str, list[float]] = {kind: [] for kind in bodies}
    try:
        for i in range(-200, transactions):  # the first 200 of each warm up, uncounted
            for kind, body in bodies.items():
                w0, c0 = time.perf_counter(), time.thread_time()
                with Session(engine) as session, session.begin():
                    session.add(app.Order(total=i))
                    if body is not None:
                        body(session, i)
                if i >= 0:
                    walls[kind].append(time.perf_counter() - w0)
                    cpus[kind].append(time.thread_time() - c0)
    finally:
        engine.dispose()
    if walls_out is not None:
        walls_out.update(walls)
    return {k: (statistics.median(walls[k]), statistics.median(cpus[k])) for k in bodies}


def same_client_table(runs: list[dict[str, tuple[float, float]]], transactions: int) -> TextTable:
    """The one-client-stack comparison: added wall and CPU per job, and their ratio."""
    table = TextTable(
        "Enqueue in a business transaction on one client stack (SQLAlchemy ORM session, "
        f"psycopg): median per transaction of {transactions:,} per kind, alternating, "
        f"median of {len(runs)} runs",
        ["transaction", "wall ms", "client CPU ms", "added wall ms", "added CPU ms", "vs bare"],
    )

    def med(kind: str, index: int) -> float:
        return statistics.median(run[kind][index] for run in runs)

    def added(kind: str, index: int) -> float:
        return statistics.median(run[kind][index] - run["host"][index] for run in runs)

    for kind, label in SAME_STACK_KINDS.items():
        versus = "-"
        if kind != "host":
            ratios = [
                (run[kind][0] - run["host"][0]) / (run["bare"][0] - run["host"][0]) for run in runs
            ]
            versus = f"{statistics.median(ratios):.2f}x"
        table.add(
            label,
            f"{1000 * med(kind, 0):.3f}",
            f"{1000 * med(kind, 1):.3f}",
            f"{1000 * added(kind, 0):.3f}" if kind != "host" else "-",
            f"{1000 * added(kind, 1):.3f}" if kind != "host" else "-",
            versus,
        )
    table.note(
        "vs bare: the enqueue's added wall time over the bare statement's, paired within each "
        "run. Client CPU is the producer thread's own (time.thread_time)."
    )
    return table


# -- business transactions per second ---------------------------------------------------------


def producer_tps(db: BenchDatabase, kind: str, producers: int, count: int) -> float:
    """Business transactions per second of ``producers`` processes of ``kind``."""
    truncate_all(db)
    db.settle(("bench_orders", *ALL_TABLES))
    args = ["produce", kind, "--url", db.url, "--dsn", db.dsn, "--count", str(count)]
    with worker_processes([args] * producers) as procs:
        m0 = time.monotonic()
        for p in procs:
            p.go()
        reports = [p.finish(600) for p in procs]
    elapsed = max(float(r["end"]) for r in reports) - m0
    return producers * count / elapsed


# -- bulk --------------------------------------------------------------------------------------


def bulk_sqla(db: BenchDatabase, jobs: int, *, copy: bool = True) -> float:
    """Seconds for ``queue.enqueue_many`` of ``jobs`` calls in one transaction; by its
    statement instead of COPY when not ``copy`` (the ``sqla_queue_copy`` option off)."""
    noop = app.queue.get_task(app.NOOP)
    assert db.engine is not None
    engine = db.engine if copy else db.engine.execution_options(sqla_queue_copy=False)
    start = time.perf_counter()
    with Session(engine) as session, session.begin():
        app.queue.enqueue_many(session, (noop.call(n=i) for i in range(jobs)))
    return time.perf_counter() - start


def bulk_sqla_statement(db: BenchDatabase, jobs: int) -> float:
    """:func:`bulk_sqla` by the enqueue statement (COPY turned off)."""
    return bulk_sqla(db, jobs, copy=False)


def bulk_pgqueuer(db: BenchDatabase, jobs: int) -> float:
    """Seconds for one PgQueuer batched ``enqueue`` of ``jobs`` jobs in one transaction."""
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def main() -> float:
        conn = await asyncpg.connect(db.dsn)
        queries = Queries(AsyncpgDriver(conn))
        start = time.perf_counter()
        async with conn.transaction():
            await queries.enqueue(
                [app.NOOP] * jobs, [str(i).encode() for i in range(jobs)], [0] * jobs
            )
        elapsed = time.perf_counter() - start
        await conn.close()
        return elapsed

    return asyncio.run(main())


def bulk_copy(db: BenchDatabase, jobs: int) -> float:
    """Seconds for COPY of the same rows into sqla_queue's jobs and executions tables.

    The ids are reserved from the jobs sequence in one statement, so both COPYs can name
    them; payloads are serialized per row in Python, as any producer must.
    """
    with psycopg.connect(db.dsn) as conn:
        start = time.perf_counter()
        with conn.transaction():
            seq = "pg_get_serial_sequence('sqla_queue_jobs', 'id')"
            row = conn.execute(
                f"SELECT setval({seq}, nextval({seq}) + %(n)s - 1) - %(n)s + 1", {"n": jobs}
            ).fetchone()
            assert row is not None
            first = int(row[0])
            now = dt.datetime.now(dt.UTC)
            cur = conn.cursor()
            with cur.copy(
                "COPY sqla_queue_jobs (id, task, payload, priority, max_attempts, scheduled_at) "
                "FROM STDIN"
            ) as copy:
                for i in range(jobs):
                    payload = json.dumps({"args": [], "kwargs": {"n": i}})
                    copy.write_row((first + i, app.NOOP, payload, 0, 1, now))
            with cur.copy(
                "COPY sqla_queue_job_executions (id, task, priority, state, execute_at) FROM STDIN"
            ) as copy:
                for i in range(jobs):
                    copy.write_row((first + i, app.NOOP, 0, "pending", now))
        return time.perf_counter() - start


def _check_count(db: BenchDatabase, table: str, jobs: int) -> None:
    with db.connect() as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    if row[0] != jobs:
        raise RuntimeError(f"{table} holds {row[0]} rows after a bulk enqueue of {jobs}")


def run_enqueue(db: BenchDatabase, config: EnqueueConfig, log: Any = print) -> dict[str, Any]:
    """All of scenario 2; returns tables and raw figures."""
    trips = count_round_trips(db)

    tps: dict[tuple[str, int], list[float]] = {}
    for producers in config.producers:
        for rep in range(config.repeat):
            for kind, label in PRODUCER_LABELS.items():
                value = producer_tps(db, kind, producers, config.transactions)
                tps.setdefault((kind, producers), []).append(value)
                log(
                    f"  produce {label:<26} P={producers} "
                    f"rep {rep + 1}/{config.repeat}: {value:,.0f} tx/s"
                )
    single = TextTable(
        f"Enqueue one job per business transaction: transactions/s, {config.transactions:,} "
        f"per producer process, median (min-max) of {config.repeat}",
        [
            "producers",
            "transaction (one order row + one job)",
            "tx/s",
            "vs PgQueuer",
            "vs bare SQL",
            "ms added per job",
        ],
    )
    summary: dict[str, Any] = {}
    for producers in config.producers:
        s = {kind: summarize(tps[(kind, producers)]) for kind in PRODUCER_LABELS}
        for kind, label in PRODUCER_LABELS.items():
            host = SAME_CLIENT.get(kind)
            added = (
                f"{1000 * producers * (1 / s[kind].median - 1 / s[host].median):.2f}"
                if host
                else "-"
            )
            single.add(
                producers,
                label,
                fmt_rate(s[kind]),
                fmt_ratio(ratio(s[kind].median, s["pgqueuer"].median)),
                fmt_ratio(ratio(s[kind].median, s["bare"].median)),
                added,
            )
            summary[f"single/{kind}/P{producers}"] = s[kind].as_json()
    single.note(
        "ms added per job: the extra time one producer's transaction takes, from the "
        "throughput difference to the same transaction without a job on the same client "
        "(SQLAlchemy ORM session for sqla_queue, asyncpg for PgQueuer, psycopg for bare SQL)."
    )

    same_runs: list[dict[str, tuple[float, float]]] = []
    for rep in range(config.repeat):
        run = same_client_cost(db, config.same_client)
        same_runs.append(run)
        log(
            f"  same client rep {rep + 1}/{config.repeat}: "
            + ", ".join(f"{k} {1000 * w:.3f} ms" for k, (w, _) in run.items())
        )
    same = same_client_table(same_runs, config.same_client)
    for kind in SAME_STACK_KINDS:
        summary[f"same_client/{kind}"] = {
            "wall_ms": [1000 * run[kind][0] for run in same_runs],
            "cpu_ms": [1000 * run[kind][1] for run in same_runs],
        }

    bulk_runs, bulk = run_bulk(db, config, log)
    for name, r in bulk_runs.items():
        summary[f"bulk/{name}"] = r.as_json()
    return {"tables": [trips, single, same, bulk], "summary": summary}


#: The bulk contenders: how each is labelled, run, and counted (the table it fills).
BULK = {
    "sqla": ("sqla_queue enqueue_many (COPY)", bulk_sqla, "sqla_queue_jobs"),
    "sqla-stmt": ("sqla_queue enqueue_many (statement)", bulk_sqla_statement, "sqla_queue_jobs"),
    "pgqueuer": ("PgQueuer enqueue (lists)", bulk_pgqueuer, "pgqueuer"),
    "copy": ("raw COPY into both tables", bulk_copy, "sqla_queue_jobs"),
}


def run_bulk(
    db: BenchDatabase, config: EnqueueConfig, log: Any = print
) -> tuple[dict[str, Summary], TextTable]:
    """The bulk table: each contender ``config.repeat`` times, interleaved."""
    bulk_runs: dict[str, list[float]] = {name: [] for name in BULK}
    funcs: dict[str, Callable[[BenchDatabase, int], float]] = {
        name: func for name, (_, func, _) in BULK.items()
    }
    tables = {name: table for name, (_, _, table) in BULK.items()}
    for rep in range(config.repeat):
        for name, func in funcs.items():
            truncate_all(db)
            db.settle(ALL_TABLES)
            seconds = func(db, config.bulk)
            _check_count(db, tables[name], config.bulk)
            bulk_runs[name].append(config.bulk / seconds)
            rate = config.bulk / seconds
            log(f"  bulk {name:<9} rep {rep + 1}/{config.repeat}: {rate:,.0f} jobs/s")
    bulk = TextTable(
        f"Bulk enqueue: {config.bulk:,} jobs in one transaction, jobs/s, median (min-max) of "
        f"{config.repeat}",
        ["system", "jobs/s", "vs statement", "vs PgQueuer", "vs raw COPY", "spread"],
    )
    rates: dict[str, Summary] = {k: summarize(v) for k, v in bulk_runs.items()}
    for name, (label, _, _) in BULK.items():
        r = rates[name]
        bulk.add(
            label,
            fmt_rate(r),
            fmt_ratio(ratio(r.median, rates["sqla-stmt"].median)),
            fmt_ratio(ratio(r.median, rates["pgqueuer"].median)),
            fmt_ratio(ratio(r.median, rates["copy"].median)),
            f"{r.spread():.0%}",
        )
    bulk.note(
        "vs statement: against enqueue_many with COPY turned off (execution option "
        "sqla_queue_copy=False), the road of small batches, keyed jobs and asyncpg."
    )
    return rates, bulk
