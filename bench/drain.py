"""Scenario 1 (drain) and 6 (memory): N no-op jobs pre-enqueued, W worker processes.

The clock starts when the parent releases the workers' start barrier (interpreter start-up
and imports are done by then) and stops at the last completion as the database recorded
it: ``max(finished_at)`` of sqla_queue's jobs, ``max(created)`` of PgQueuer's log, and for
the history-less ``bare-min`` loop the last completion the worker saw. Each run checks that
every job succeeded exactly once in the database.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from bench import app
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

__all__ = ["DrainConfig", "run_drain"]

LABELS = {
    "sqla-sync": "sqla_queue sync",
    "sqla-async": "sqla_queue async",
    "pgqueuer": "PgQueuer",
    "bare": "bare SQL",
    "bare-min": "bare SQL, no history",
}
ALL_TABLES = (
    "sqla_queue_jobs",
    "sqla_queue_job_executions",
    "pgqueuer",
    "pgqueuer_log",
    "pgqueuer_statistics",
    "bench_min_queue",
)
ENQUEUE_CHUNK = 10_000


@dataclass(frozen=True)
class DrainConfig:
    """Which drains to run."""

    jobs: int = 20_000
    workers: Sequence[int] = (1, 2, 4)
    batches: Sequence[int] = (10, 100)
    systems: Sequence[str] = tuple(LABELS)
    repeat: int = 3


@dataclass
class DrainRun:
    """One timed drain."""

    system: str
    workers: int
    batch: int
    seconds: float
    rss_mb: list[float] = field(default_factory=list)

    def rate(self, jobs: int) -> float:
        """Jobs per second."""
        return jobs / self.seconds


def truncate_all(db: BenchDatabase) -> None:
    """Empty every contender's tables (each run starts from empty tables)."""
    with db.connect() as conn:
        conn.execute(f"TRUNCATE {', '.join(ALL_TABLES)} RESTART IDENTITY")


def task_of(system: str) -> str:
    """The task a system's drain runs: the async worker gets the ``async def`` handler."""
    return app.ANOOP if system == "sqla-async" else app.NOOP


def enqueue_jobs(db: BenchDatabase, system: str, jobs: int) -> None:
    """Put ``jobs`` pending jobs in ``system``'s tables, the way its users would."""
    if system in ("sqla-sync", "sqla-async", "bare"):
        task = app.queue.get_task(task_of(system))
        assert db.engine is not None
        with Session(db.engine) as session, session.begin():
            app.queue.enqueue_many(session, (task.call(n=i) for i in range(jobs)))
    elif system == "pgqueuer":
        asyncio.run(_pgqueuer_enqueue(db.dsn, jobs))
    else:
        with db.connect() as conn:
            conn.execute(
                "INSERT INTO bench_min_queue (task, payload) "
                "SELECT %s, jsonb_build_object('args', '[]'::jsonb, 'kwargs', "
                "jsonb_build_object('n', g)) FROM generate_series(1, %s) g",
                (app.NOOP, jobs),
            )


async def _pgqueuer_enqueue(dsn: str, jobs: int) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        for start in range(0, jobs, ENQUEUE_CHUNK):
            count = min(ENQUEUE_CHUNK, jobs - start)
            await queries.enqueue(
                [app.NOOP] * count,
                [str(start + i).encode() for i in range(count)],
                [0] * count,
            )
    finally:
        await conn.close()


def _finish_time(
    db: BenchDatabase, system: str, jobs: int, t0: dt.datetime, m0: float, reports: list[Any]
) -> float:
    """Seconds from the start barrier to the last completion; checks that all jobs ran."""
    with db.connect() as conn:
        if system == "pgqueuer":
            row = conn.execute(
                "SELECT max(created), count(*) FILTER (WHERE status = 'successful'), "
                "(SELECT count(*) FROM pgqueuer) FROM pgqueuer_log"
            ).fetchone()
        elif system == "bare-min":
            row = conn.execute("SELECT NULL, %s, count(*) FROM bench_min_queue", (jobs,)).fetchone()
        else:
            row = conn.execute(
                "SELECT max(finished_at), count(*) FILTER (WHERE status = 'succeeded'), "
                "(SELECT count(*) FROM sqla_queue_job_executions) FROM sqla_queue_jobs"
            ).fetchone()
    assert row is not None
    last, done, remaining = row
    if done != jobs or remaining != 0:
        raise RuntimeError(f"{system}: {done} of {jobs} jobs done, {remaining} left over")
    if system == "bare-min":
        return float(max(r["last_done"] for r in reports) - m0)
    assert isinstance(last, dt.datetime)
    return (last - t0).total_seconds()


def drain_once(db: BenchDatabase, system: str, workers: int, batch: int, jobs: int) -> DrainRun:
    """One timed drain of ``jobs`` jobs by ``workers`` processes of ``system``."""
    truncate_all(db)
    enqueue_jobs(db, system, jobs)
    db.settle(ALL_TABLES)
    args = [
        "drain",
        system,
        "--url",
        db.url,
        "--dsn",
        db.dsn,
        "--concurrency",
        str(batch),
        "--task",
        task_of(system),
    ]
    timeout = max(120.0, jobs / 200)
    with worker_processes([args] * workers) as procs, db.connect() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        t0: dt.datetime = row[0]
        m0 = time.monotonic()
        for p in procs:
            p.go()
        reports = [p.finish(timeout) for p in procs]
    seconds = _finish_time(db, system, jobs, t0, m0, reports)
    return DrainRun(system, workers, batch, seconds, [float(r["maxrss_mb"]) for r in reports])


def run_drain(db: BenchDatabase, config: DrainConfig, log: Any = print) -> dict[str, Any]:
    """Every (workers, batch) case for every system, repeats interleaved across systems.

    Returns ``{"tables": [...], "runs": [...], "memory": TextTable, "summary": {...}}``.
    """
    runs: list[DrainRun] = []
    for workers in config.workers:
        for batch in config.batches:
            for rep in range(config.repeat):
                for system in config.systems:
                    run = drain_once(db, system, workers, batch, config.jobs)
                    runs.append(run)
                    log(
                        f"  drain {LABELS[system]:<22} W={workers} batch={batch} "
                        f"rep {rep + 1}/{config.repeat}: {run.rate(config.jobs):,.0f} jobs/s "
                        f"({run.seconds:.2f}s, peak RSS {max(run.rss_mb):.0f} MB)"
                    )
    table = TextTable(
        f"Drain: {config.jobs:,} no-op jobs, jobs/s, median (min-max) of {config.repeat}",
        ["workers", "batch", "system", "jobs/s", "vs PgQueuer", "vs bare SQL", "spread"],
    )
    summary: dict[str, Any] = {}
    for workers in config.workers:
        for batch in config.batches:
            rates: dict[str, Summary] = {}
            for system in config.systems:
                rates[system] = summarize(
                    [
                        r.rate(config.jobs)
                        for r in runs
                        if (r.system, r.workers, r.batch) == (system, workers, batch)
                    ]
                )
            peer = rates.get("pgqueuer")
            bare = rates.get("bare")
            for system in config.systems:
                s = rates[system]
                table.add(
                    workers,
                    batch,
                    LABELS[system],
                    fmt_rate(s),
                    fmt_ratio(ratio(s.median, peer.median)) if peer else "-",
                    fmt_ratio(ratio(s.median, bare.median)) if bare else "-",
                    f"{s.spread():.0%}",
                )
                summary[f"{system}/W{workers}/b{batch}"] = {
                    **s.as_json(),
                    "vs_pgqueuer": ratio(s.median, peer.median) if peer else math.nan,
                    "vs_bare": ratio(s.median, bare.median) if bare else math.nan,
                }
    memory = memory_table(runs, config)
    return {
        "tables": [table, memory],
        "runs": [r.__dict__ for r in runs],
        "summary": summary,
    }


def memory_table(runs: Sequence[DrainRun], config: DrainConfig) -> TextTable:
    """Scenario 6: the peak RSS of one worker process during the drains, by batch."""
    table = TextTable(
        "Memory: peak RSS of one worker process during a drain (MB, max over processes and runs)",
        ["batch/concurrency", *(LABELS[s] for s in config.systems)],
    )
    for batch in config.batches:
        cells = []
        for system in config.systems:
            peaks = [max(r.rss_mb) for r in runs if r.system == system and r.batch == batch]
            cells.append(f"{max(peaks):.0f}" if peaks else "-")
        table.add(batch, *cells)
    return table
