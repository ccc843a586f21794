"""Candidate optimizations, measured before anyone builds them.

    python -m bench.levers                 # both parts
    python -m bench.levers --part path     # only the execution-path CPU comparison

Part ``drain``: the drain of the drain scenario (W workers, batch 10) for

* the bare loop as it is (claim and completion, each its own autocommitted statement);
* ``bare-1tx``: the completion of one batch and the claim of the next in one transaction,
  sent together in psycopg's pipeline mode (one round trip, one commit per batch);
* the bare loop and both sqla_queue workers with ``synchronous_commit=off`` on the
  worker's connections (``PGOPTIONS``), i.e. commits that do not wait for the WAL flush.

Part ``latency``: the latency scenario's NOTIFY runs (sqla_queue sync worker and the bare
loop) with and without ``synchronous_commit=off`` on the worker, whose claim commit is on
the path from the enqueue to the handler.

Part ``path``: client CPU per claim + completion cycle (batch 10) of sqla_queue's own
statements, executed four ways on one connection: SQLAlchemy ``Connection.execute`` with
the Core statement (what the sync worker does), ``exec_driver_sql`` with the statement
compiled once, a raw psycopg cursor with the statement compiled once, and the same three
for the asyncio face. Only the client's CPU is counted (``time.process_time``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine

from bench import app
from bench.backlog import REPLENISH_SQLA, top_up
from bench.common import (
    BenchDatabase,
    TextTable,
    fmt_rate,
    percentile,
    ratio,
    resolve_server_url,
    summarize,
)
from bench.drain import drain_once
from bench.latency import LatencyConfig, latency_once
from sqla_queue.logic.outcomes import Outcome, OutcomeKind
from sqla_queue.worker.decider import Decider
from sqla_queue.worker.settings import WorkerSettings

ASYNC_COMMIT = {"PGOPTIONS": "-c synchronous_commit=off"}
BATCH = 10


def drain_levers(db: BenchDatabase, workers: int, jobs: int, repeat: int) -> TextTable:
    """The drain with and without each lever, repeats interleaved."""
    cases: list[tuple[str, str, dict[str, str] | None]] = [
        ("bare SQL (as in the drain table)", "bare", None),
        ("bare SQL, ack+claim in 1 tx (pipeline)", "bare-1tx", None),
        ("bare SQL, synchronous_commit=off", "bare", ASYNC_COMMIT),
        ("sqla_queue sync", "sqla-sync", None),
        ("sqla_queue sync, synchronous_commit=off", "sqla-sync", ASYNC_COMMIT),
        ("sqla_queue async", "sqla-async", None),
        ("sqla_queue async, synchronous_commit=off", "sqla-async", ASYNC_COMMIT),
    ]
    rates: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    cpu: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    server: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    for rep in range(repeat):
        for label, system, env in cases:
            run = drain_once(db, system, workers, BATCH, jobs, env=env)
            rates[label].append(run.rate(jobs))
            cpu[label].append(run.cpu_us_per_job(jobs))
            server[label].append(run.server_us_per_job(jobs))
            print(f"  {label:<42} rep {rep + 1}: {run.rate(jobs):,.0f} jobs/s", flush=True)
    table = TextTable(
        f"Levers: drain of {jobs:,} no-op jobs, {workers} workers, batch {BATCH} "
        f"(jobs/s, median (min-max) of {repeat})",
        ["case", "jobs/s", "vs bare SQL", "worker CPU us/job", "server CPU us/job"],
    )
    bare = summarize(rates[cases[0][0]]).median
    for label, _, _ in cases:
        s = summarize(rates[label])
        table.add(
            label,
            fmt_rate(s),
            f"{ratio(s.median, bare):.2f}x",
            f"{summarize(cpu[label]).median:.0f}",
            f"{summarize(server[label]).median:.0f}",
        )
    return table


def latency_levers(db: BenchDatabase, jobs: int) -> TextTable:
    """NOTIFY latency with the worker's commits synchronous and asynchronous."""
    config = LatencyConfig(jobs=jobs)
    table = TextTable(
        f"Levers: latency, {jobs:,} jobs at {config.rate:.0f}/s, one idle worker (ms)",
        ["case", "p50", "p95", "p99"],
    )
    for variant, label in (("sqla-notify", "sqla_queue sync, NOTIFY"), ("bare", "bare SQL")):
        for env, how in ((None, ""), (ASYNC_COMMIT, ", synchronous_commit=off")):
            lat = latency_once(db, variant, config, env=env)
            table.add(
                label + how,
                f"{percentile(lat, 50):.1f}",
                f"{percentile(lat, 95):.1f}",
                f"{percentile(lat, 99):.1f}",
            )
            print(f"  {label + how:<45} p50 {percentile(lat, 50):.1f} ms", flush=True)
    return table


# -- execution path ------------------------------------------------------------------------


def _outcomes_params(core: Decider, rows: Sequence[Any]) -> dict[str, Any]:
    outcomes = [Outcome(r[1], r[2], OutcomeKind.SUCCEEDED) for r in rows if r[1] is not None]
    return {"outcomes": json.dumps([o.as_row() for o in outcomes]), "worker": core.worker_id}


def path_cpu(db: BenchDatabase, cycles: int) -> TextTable:
    """Client CPU (microseconds) per claim + completion cycle, by execution path."""
    top_up(db, 50_000, 0, pgqueuer=False)
    core = Decider(
        app.queue.worker_plan([app.NOOP]), WorkerSettings(concurrency=BATCH, tasks=[app.NOOP])
    )
    engine = create_engine(db.url, pool_size=1)
    dialect = engine.dialect
    claim = core.claim_statement.compile(dialect=dialect)
    complete = core.complete_statement.compile(dialect=dialect)
    claim_params = dict(claim.construct_params(core.claim_params(BATCH)))
    # The completion carries literal-valued binds of its own: compute them once, the way a
    # fast path would, and add the per-batch values on each call.
    constants = dict(complete.construct_params({"outcomes": "[]", "worker": core.worker_id}))
    results: dict[str, float] = {}

    def measure(name: str, cycle: Callable[[], None], replenish: Callable[[int], None]) -> None:
        for _ in range(20):
            cycle()
        total = 0.0
        for _ in range(cycles):
            start = time.process_time()
            cycle()
            total += time.process_time() - start
        replenish(cycles * BATCH)
        results[name] = 1e6 * total / cycles

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        raw = conn.connection.driver_connection
        assert raw is not None

        def replenish(n: int) -> None:
            conn.exec_driver_sql(REPLENISH_SQLA, {"task": app.NOOP, "n": n + 20 * BATCH})

        def via_core() -> None:
            rows = conn.execute(core.claim_statement, core.claim_params(BATCH)).all()
            conn.execute(core.complete_statement, _outcomes_params(core, rows)).scalars().all()

        def via_driver_sql() -> None:
            rows = conn.exec_driver_sql(claim.string, claim_params).all()
            params = {**constants, **_outcomes_params(core, rows)}
            conn.exec_driver_sql(complete.string, params).scalars().all()

        def via_psycopg() -> None:
            rows = raw.execute(claim.string, claim_params).fetchall()
            raw.execute(complete.string, {**constants, **_outcomes_params(core, rows)}).fetchall()

        measure("sync: Connection.execute(Core statement)", via_core, replenish)
        measure("sync: exec_driver_sql(compiled once)", via_driver_sql, replenish)
        measure("sync: psycopg cursor (compiled once)", via_psycopg, replenish)
    engine.dispose()
    results.update(
        asyncio.run(
            _async_path_cpu(
                db, core, (claim.string, claim_params), complete.string, constants, cycles
            )
        )
    )
    table = TextTable(
        f"Execution path: client CPU per claim + completion of {BATCH} jobs (us), {cycles} cycles",
        ["path", "CPU us per cycle", "vs Connection.execute"],
    )
    base_sync = results["sync: Connection.execute(Core statement)"]
    base_async = results["async: AsyncConnection.execute(Core statement)"]
    for name, value in results.items():
        base = base_async if name.startswith("async") else base_sync
        table.add(name, f"{value:.0f}", f"{ratio(value, base):.2f}x")
    return table


async def _async_path_cpu(
    db: BenchDatabase,
    core: Decider,
    claim: tuple[str, dict[str, Any]],
    complete_sql: str,
    constants: dict[str, Any],
    cycles: int,
) -> dict[str, float]:
    engine = create_async_engine(db.url, pool_size=1)
    claim_sql, claim_params = claim
    results: dict[str, float] = {}
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")  # in place
        raw_conn = await conn.get_raw_connection()
        raw = raw_conn.driver_connection
        assert raw is not None

        async def via_core() -> None:
            result = await conn.execute(core.claim_statement, core.claim_params(BATCH))
            rows = result.all()
            done = await conn.execute(core.complete_statement, _outcomes_params(core, rows))
            done.scalars().all()

        async def via_driver_sql() -> None:
            result = await conn.exec_driver_sql(claim_sql, claim_params)
            rows = result.all()
            params = {**constants, **_outcomes_params(core, rows)}
            done = await conn.exec_driver_sql(complete_sql, params)
            done.scalars().all()

        async def via_psycopg() -> None:
            cur = await raw.execute(claim_sql, claim_params)
            rows = await cur.fetchall()
            cur = await raw.execute(complete_sql, {**constants, **_outcomes_params(core, rows)})
            await cur.fetchall()

        for name, cycle in (
            ("async: AsyncConnection.execute(Core statement)", via_core),
            ("async: exec_driver_sql(compiled once)", via_driver_sql),
            ("async: psycopg AsyncConnection (compiled once)", via_psycopg),
        ):
            for _ in range(20):
                await cycle()
            total = 0.0
            for _ in range(cycles):
                start = time.process_time()
                await cycle()
                total += time.process_time() - start
            await conn.exec_driver_sql(
                REPLENISH_SQLA, {"task": app.NOOP, "n": (cycles + 20) * BATCH}
            )
            results[name] = 1e6 * total / cycles
    await engine.dispose()
    return results


def main(argv: list[str] | None = None) -> int:
    """Measure the levers and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="PostgreSQL server to use")
    parser.add_argument("--part", choices=("all", "drain", "path", "latency"), default="all")
    parser.add_argument("--latency-jobs", type=int, default=1_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=500)
    args = parser.parse_args(argv)
    with BenchDatabase(resolve_server_url(args.url)) as db:
        if args.part in ("all", "path"):
            print(path_cpu(db, args.cycles).render(), flush=True)
        if args.part in ("all", "drain"):
            print(drain_levers(db, args.workers, args.jobs, args.repeat).render(), flush=True)
        if args.part in ("all", "latency"):
            print(latency_levers(db, args.latency_jobs).render(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
