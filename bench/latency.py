"""Scenario 3 (latency): from the enqueueing commit to the handler's first line.

One idle worker process waits; the parent enqueues jobs one per transaction at a steady
rate and records ``time.monotonic()`` right after each commit returns. The handler records
``time.monotonic()`` as it starts (CLOCK_MONOTONIC is one clock for every process of the
machine). Variants: sqla_queue with LISTEN/NOTIFY (sync and async worker), sqla_queue
poll-only (``Queue(notify=False)`` and a worker with ``listen=False``), PgQueuer (its
trigger NOTIFYs on every statement touching its table), and a bare psycopg loop that
LISTENs and claims on each notification.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from bench import app, baseline
from bench.common import BenchDatabase, TextTable, WorkerProcess, fmt_ratio, percentile, ratio
from bench.drain import ALL_TABLES

__all__ = ["LatencyConfig", "run_latency"]

#: variant -> (label, worker system, poll-only)
VARIANTS: dict[str, tuple[str, str, bool]] = {
    "sqla-notify": ("sqla_queue sync, NOTIFY", "sqla-sync", False),
    "sqla-async-notify": ("sqla_queue async, NOTIFY", "sqla-async", False),
    "sqla-poll": ("sqla_queue sync, poll only", "sqla-sync", True),
    "pgqueuer": ("PgQueuer", "pgqueuer", False),
    "bare": ("bare SQL, LISTEN + claim", "bare", False),
}
WARM_UP = 1.5


@dataclass(frozen=True)
class LatencyConfig:
    """How many jobs, how fast, and the poll-only worker's poll interval."""

    jobs: int = 2_000
    rate: float = 200.0
    poll_interval: float = 1.0
    variants: Sequence[str] = tuple(VARIANTS)


def _pace(start: float, i: int, rate: float) -> float:
    return max(0.0, start + i / rate - time.monotonic())


def produce_sqla(db: BenchDatabase, jobs: int, rate: float, quiet: bool) -> dict[int, float]:
    """Enqueue ``jobs`` stamp jobs through a Session, one transaction each."""
    target = app.quiet_queue if quiet else app.queue
    stamp = target.get_task(app.STAMP)
    engine = create_engine(db.url, pool_size=1)
    SessionLocal = sessionmaker(engine)
    commits: dict[int, float] = {}
    start = time.monotonic()
    for i in range(jobs):
        time.sleep(_pace(start, i, rate))
        with SessionLocal.begin() as session:
            stamp.enqueue(session, seq=i)
        commits[i] = time.monotonic()
    engine.dispose()
    return commits


def produce_bare(db: BenchDatabase, jobs: int, rate: float) -> dict[int, float]:
    """The bare enqueue statement with its NOTIFY, one transaction each."""
    commits: dict[int, float] = {}
    with psycopg.connect(db.dsn) as conn:
        start = time.monotonic()
        for i in range(jobs):
            time.sleep(_pace(start, i, rate))
            with conn.transaction():
                conn.execute(
                    baseline.ENQUEUE_ONE_NOTIFY,
                    {
                        "task": app.STAMP,
                        "payload": baseline.payload(seq=i),
                        "channel": app.queue.tables.notify_channel,
                    },
                )
            commits[i] = time.monotonic()
    return commits


def produce_pgqueuer(db: BenchDatabase, jobs: int, rate: float) -> dict[int, float]:
    """PgQueuer's ``enqueue``, one job per call (one autocommitted statement each)."""
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def main() -> dict[int, float]:
        conn = await asyncpg.connect(db.dsn)
        queries = Queries(AsyncpgDriver(conn))
        commits: dict[int, float] = {}
        start = time.monotonic()
        for i in range(jobs):
            await asyncio.sleep(_pace(start, i, rate))
            await queries.enqueue(app.STAMP, str(i).encode())
            commits[i] = time.monotonic()
        await conn.close()
        return commits

    return asyncio.run(main())


def _done(db: BenchDatabase, system: str) -> int:
    with db.connect() as conn:
        if system == "pgqueuer":
            sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
        else:
            sql = "SELECT count(*) FROM sqla_queue_jobs WHERE status = 'succeeded'"
        row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def latency_once(
    db: BenchDatabase,
    variant: str,
    config: LatencyConfig,
    env: dict[str, str] | None = None,
) -> list[float]:
    """Latencies in milliseconds of one variant, in enqueue order.

    ``env`` adds to the worker's environment (``PGOPTIONS``, say).
    """
    _label, system, quiet = VARIANTS[variant]
    # The cold protocol: fresh tables analyzed while empty; nothing is enqueued before
    # the clock, so the warm protocol would analyze the same empty tables.
    db.fresh_tables()
    db.settle(ALL_TABLES, "cold")
    args = [
        "idle",
        system,
        "--url",
        db.url,
        "--dsn",
        db.dsn,
        "--concurrency",
        "10",
        "--task",
        app.STAMP,
        "--poll-interval",
        str(config.poll_interval),
    ]
    if quiet:
        args.append("--quiet")
    proc = WorkerProcess(args, env=env)
    try:
        proc.wait_ready()
        proc.go()
        # Let the worker connect its listener and settle into its idle wait.
        time.sleep(WARM_UP)
        if system == "pgqueuer":
            commits = produce_pgqueuer(db, config.jobs, config.rate)
        elif system == "bare":
            commits = produce_bare(db, config.jobs, config.rate)
        else:
            commits = produce_sqla(db, config.jobs, config.rate, quiet)
        deadline = time.monotonic() + 30 + 2 * config.poll_interval
        while _done(db, system) < config.jobs and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.terminate()
        report = proc.finish(60)
    finally:
        proc.kill()
    starts = {int(k): float(v) for k, v in report["starts"].items()}
    missing = [i for i in commits if i not in starts]
    if missing:
        raise RuntimeError(f"{variant}: {len(missing)} jobs never started, e.g. {missing[:5]}")
    return [1000 * (starts[i] - commits[i]) for i in sorted(commits)]


def run_latency(db: BenchDatabase, config: LatencyConfig, log: Any = print) -> dict[str, Any]:
    """Every variant once; returns the table and the percentiles."""
    results: dict[str, list[float]] = {}
    for variant in config.variants:
        results[variant] = latency_once(db, variant, config)
        lat = results[variant]
        log(
            f"  latency {VARIANTS[variant][0]:<28} p50 {percentile(lat, 50):.1f} ms, "
            f"p99 {percentile(lat, 99):.1f} ms"
        )
    table = TextTable(
        f"Latency: enqueueing commit to handler start, {config.jobs:,} jobs at "
        f"{config.rate:.0f}/s, one idle worker (ms)",
        ["system", "p50", "p95", "p99", "max", "p50 vs PgQueuer", "p50 vs bare SQL"],
    )
    peer = percentile(results.get("pgqueuer", []), 50)
    bare = percentile(results.get("bare", []), 50)
    summary: dict[str, Any] = {}
    for variant, lat in results.items():
        p50 = percentile(lat, 50)
        table.add(
            VARIANTS[variant][0],
            f"{p50:.1f}",
            f"{percentile(lat, 95):.1f}",
            f"{percentile(lat, 99):.1f}",
            f"{max(lat):.1f}",
            fmt_ratio(ratio(p50, peer)) if not math.isnan(peer) else "-",
            fmt_ratio(ratio(p50, bare)) if not math.isnan(bare) else "-",
        )
        summary[variant] = {
            "p50": p50,
            "p95": percentile(lat, 95),
            "p99": percentile(lat, 99),
            "max": max(lat),
            "n": len(lat),
        }
    table.note(
        f"Poll-only: poll_interval={config.poll_interval}s, so its latencies spread over "
        "[0, poll_interval]. Ratios below 1.00x are faster."
    )
    return {"tables": [table], "summary": summary}
