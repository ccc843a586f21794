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
    BackendCpuMeter,
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
    "bare-1tx": "bare SQL, ack+claim in 1 tx",
}
#: The systems of the drain table (``bare-1tx`` is a lever, measured by bench/levers.py).
DRAIN_SYSTEMS = ("sqla-sync", "sqla-async", "pgqueuer", "bare", "bare-min")
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
    systems: Sequence[str] = DRAIN_SYSTEMS
    repeat: int = 3


@dataclass
class DrainRun:
    """One timed drain."""

    system: str
    workers: int
    batch: int
    seconds: float
    rss_mb: list[float] = field(default_factory=list)
    #: CPU seconds the workers used after the start barrier, summed over processes.
    cpu_s: float = 0.0
    #: CPU seconds of the database's server backends during the drain (NaN if unknown).
    server_cpu_s: float = math.nan
    reports: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def rate(self, jobs: int) -> float:
        """Jobs per second."""
        return jobs / self.seconds

    def cpu_us_per_job(self, jobs: int) -> float:
        """Worker CPU time per job, in microseconds (all worker processes together)."""
        return 1e6 * self.cpu_s / jobs

    def server_us_per_job(self, jobs: int) -> float:
        """Server backend CPU time per job, in microseconds."""
        return 1e6 * self.server_cpu_s / jobs


def truncate_all(db: BenchDatabase) -> None:
    """Empty every contender's tables (each run starts from empty tables)."""
    with db.connect() as conn:
        conn.execute(f"TRUNCATE {', '.join(ALL_TABLES)} RESTART IDENTITY")


def task_of(system: str) -> str:
    """The task a system's drain runs: the async worker gets the ``async def`` handler."""
    return app.ANOOP if system == "sqla-async" else app.NOOP


def enqueue_jobs(db: BenchDatabase, system: str, jobs: int, task_name: str) -> None:
    """Put ``jobs`` pending jobs of ``task_name`` in ``system``'s tables, as its users would."""
    if system in ("sqla-sync", "sqla-async", "bare", "bare-1tx"):
        task = app.queue.get_task(task_name)
        assert db.engine is not None
        with Session(db.engine) as session, session.begin():
            app.queue.enqueue_many(session, (task.call(n=i) for i in range(jobs)))
    elif system == "pgqueuer":
        asyncio.run(_pgqueuer_enqueue(db.dsn, jobs, task_name))
    else:
        with db.connect() as conn:
            conn.execute(
                "INSERT INTO bench_min_queue (task, payload) "
                "SELECT %s, jsonb_build_object('args', '[]'::jsonb, 'kwargs', "
                "jsonb_build_object('n', g)) FROM generate_series(1, %s) g",
                (task_name, jobs),
            )


async def _pgqueuer_enqueue(dsn: str, jobs: int, task: str) -> None:
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        for start in range(0, jobs, ENQUEUE_CHUNK):
            count = min(ENQUEUE_CHUNK, jobs - start)
            await queries.enqueue(
                [task] * count,
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


def drain_once(
    db: BenchDatabase,
    system: str,
    workers: int,
    batch: int,
    jobs: int,
    *,
    task: str | None = None,
    limit: int = 0,
    extra_args: Sequence[str] = (),
    prefixes: Sequence[Sequence[str]] = (),
    env: dict[str, str] | None = None,
) -> DrainRun:
    """One timed drain of ``jobs`` jobs by ``workers`` processes of ``system``.

    ``task`` defaults to the system's no-op task; ``limit`` is PgQueuer's entrypoint
    concurrency limit (sqla_queue's limit is part of the task's definition).
    ``extra_args`` go to every worker; ``prefixes`` wrap their commands and ``env`` adds
    to their environment (see :func:`~bench.common.worker_processes`).
    """
    task = task or task_of(system)
    truncate_all(db)
    enqueue_jobs(db, system, jobs, task)
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
        task,
        "--limit",
        str(limit),
        *extra_args,
    ]
    timeout = max(120.0, jobs / 200)
    with (
        worker_processes([args] * workers, prefixes, env) as procs,
        db.connect() as conn,
        BackendCpuMeter(db) as server,
    ):
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        t0: dt.datetime = row[0]
        m0 = time.monotonic()
        for p in procs:
            p.go()
        reports = [p.finish(timeout) for p in procs]
    seconds = _finish_time(db, system, jobs, t0, m0, reports)
    return DrainRun(
        system,
        workers,
        batch,
        seconds,
        [float(r["maxrss_mb"]) for r in reports],
        sum(float(r["cpu_s"]) for r in reports),
        server.seconds,
        reports,
    )


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
                        f"({run.seconds:.2f}s, worker CPU {run.cpu_us_per_job(config.jobs):.0f} "
                        f"us/job, server CPU {run.server_us_per_job(config.jobs):.0f} us/job, "
                        f"peak RSS {max(run.rss_mb):.0f} MB)"
                    )
    table = TextTable(
        f"Drain: {config.jobs:,} no-op jobs, jobs/s, median (min-max) of {config.repeat}",
        [
            "workers",
            "batch",
            "system",
            "jobs/s",
            "vs PgQueuer",
            "vs bare SQL",
            "spread",
            "worker CPU us/job",
            "server CPU us/job",
        ],
    )
    table.note(
        "worker CPU us/job: CPU time (user + system, all threads) the worker processes used "
        "after the start barrier, per job. server CPU us/job: the same for the PostgreSQL "
        "backends serving the benchmark database (background writers not included)."
    )
    summary: dict[str, Any] = {}
    for workers in config.workers:
        for batch in config.batches:
            rates: dict[str, Summary] = {}
            cpu: dict[str, Summary] = {}
            server: dict[str, Summary] = {}
            for system in config.systems:
                mine = [
                    r for r in runs if (r.system, r.workers, r.batch) == (system, workers, batch)
                ]
                rates[system] = summarize([r.rate(config.jobs) for r in mine])
                cpu[system] = summarize([r.cpu_us_per_job(config.jobs) for r in mine])
                server[system] = summarize([r.server_us_per_job(config.jobs) for r in mine])
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
                    f"{cpu[system].median:.0f}",
                    f"{server[system].median:.0f}",
                )
                summary[f"{system}/W{workers}/b{batch}"] = {
                    **s.as_json(),
                    "cpu_us_per_job": cpu[system].median,
                    "server_us_per_job": server[system].median,
                    "vs_pgqueuer": ratio(s.median, peer.median) if peer else math.nan,
                    "vs_bare": ratio(s.median, bare.median) if bare else math.nan,
                }
    memory = memory_table(runs, config)
    return {
        "tables": [table, memory],
        "runs": [
            {
                "system": r.system,
                "workers": r.workers,
                "batch": r.batch,
                "seconds": r.seconds,
                "rss_mb": r.rss_mb,
                "cpu_s": r.cpu_s,
                "server_cpu_s": r.server_cpu_s,
            }
            for r in runs
        ],
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
