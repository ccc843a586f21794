"""Scenario 1 (drain) and 6 (memory): jobs pre-enqueued, W worker processes, timed.

Three cases, each under the cold protocol (the default) and the warm one (see
:meth:`~bench.common.BenchDatabase.fresh_tables` and :meth:`~bench.common.BenchDatabase.settle`):

* ``plain``: N no-op jobs, drained to the end;
* ``burst``: the first N of a 10N burst: 10N jobs enqueued before the clock, the clock
  stops at the N-th completion and the workers are then stopped (SIGTERM);
* ``hot``: N ordinary jobs queued behind 2.5N jobs of one hot ``queue_id`` (enqueued
  first, same task), the clock stops at the N-th ordinary completion. PgQueuer has no
  keys: its hot jobs go to an entrypoint of their own limited to one job at a time;
  graphile-worker's go to one ``queue_name`` (a queue runs one job at a time). The
  bare-SQL loop ignores keys altogether, so it has no hot case.

graphile-worker (Node, see :mod:`bench.node_peers`) runs twice: with its defaults
(``graphile``) and with its batching on (``graphile-batched``: a local queue of ``batch``
jobs and batched completions). pg-boss (``pgboss``, Node too) fetches ``batch`` jobs at a
time; its hot jobs go to a second queue with the ``singleton`` policy (one active job).

The clock starts when the parent releases the workers' start barrier (interpreter start-up
and imports are done by then) and stops at a completion as the database recorded it:
``finished_at`` of sqla_queue's jobs, ``created`` of PgQueuer's log, and for the
history-less ``bare-min`` loop and graphile-worker (which deletes completed jobs) the last
completion the workers saw. Each run checks that every job it counts succeeded exactly
once: in the database, or for graphile-worker in the workers' reports (and that its table
is empty).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from bench import app, node_peers
from bench.common import (
    PROTOCOLS,
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

__all__ = ["CASES", "DrainConfig", "run_drain"]

LABELS = {
    "sqla-sync": "sqla_queue sync",
    "sqla-async": "sqla_queue async",
    "pgqueuer": "PgQueuer",
    "bare": "bare SQL",
    "bare-min": "bare SQL, no history",
    "bare-1tx": "bare SQL, ack+claim in 1 tx",
    "sqla-sync-prefetch": "sqla_queue sync, prefetch",
    "sqla-async-prefetch": "sqla_queue async, prefetch",
    "sqla-sync-nohistory": "sqla_queue sync, prefetch, no history",
    "graphile": "graphile-worker",
    "graphile-batched": "graphile-worker, batched",
    "pgboss": "pg-boss",
}
#: The systems of the drain table (``bare-1tx`` is a lever, measured by bench/levers.py).
#: The Node ones (:data:`NODE_SYSTEMS`) need npm: bench.run leaves them out without it.
DRAIN_SYSTEMS = (
    "sqla-sync",
    "sqla-async",
    "sqla-sync-prefetch",
    "sqla-async-prefetch",
    "sqla-sync-nohistory",
    "pgqueuer",
    "bare",
    "bare-min",
    "graphile",
    "graphile-batched",
    "pgboss",
)
#: The systems of the burst and hot cases (``bare-min`` has no history to count from).
CASE_SYSTEMS = (
    "sqla-sync",
    "sqla-async",
    "sqla-sync-prefetch",
    "sqla-async-prefetch",
    "pgqueuer",
    "bare",
    "graphile",
    "graphile-batched",
    "pgboss",
)
#: completeJobBatchDelay of graphile-batched (set in bench/node/worker.mjs), in ms.
GRAPHILE_BATCH_DELAY_MS = 2
#: graphile-worker's two configurations (no job history: timed from the workers' reports).
GRAPHILE_SYSTEMS = ("graphile", "graphile-batched")
#: Jobs a prefetching sqla_queue worker claims beyond its concurrency in the drains: as many
#: as graphile-worker's local queue holds beside its running jobs in ``graphile-batched``.
PREFETCH = 10
#: sqla_queue's variants: (the worker they run, its extra arguments). ``nohistory`` runs a
#: ``Queue(history="none")`` over the same tables: it has only the plain case, timed from
#: the workers' reports (its succeeded jobs leave no row to time).
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sqla-sync-prefetch": ("sqla-sync", ("--prefetch", str(PREFETCH))),
    "sqla-async-prefetch": ("sqla-async", ("--prefetch", str(PREFETCH))),
    "sqla-sync-nohistory": ("sqla-sync", ("--prefetch", str(PREFETCH), "--no-history")),
}


def base_system(system: str) -> str:
    """The system whose worker and tables ``system`` uses (itself, or a variant's base)."""
    return VARIANTS.get(system, (system, ()))[0]


#: The systems whose workers are Node processes.
NODE_SYSTEMS = (*GRAPHILE_SYSTEMS, "pgboss")
ALL_TABLES = (
    "sqla_queue_jobs",
    "sqla_queue_job_executions",
    "pgqueuer",
    "pgqueuer_log",
    "pgqueuer_statistics",
    "bench_min_queue",
)
ENQUEUE_CHUNK = 10_000
CASES = ("plain", "burst", "hot")
#: PgQueuer's entrypoint for the hot key's jobs.
HOT_ENTRYPOINT = "bench.hot"
HOT_KEY = "hot"
#: The tables whose planner row count is recorded at each clock start.
PLANNER_TABLES = (
    "sqla_queue_job_executions",
    "pgqueuer",
    "bench_min_queue",
    "_private_jobs",
    "job_common",
)


@dataclass(frozen=True)
class DrainConfig:
    """Which drains to run.

    The ``plain`` case runs every (workers, batch) pair; ``burst`` and ``hot`` run at
    ``case_workers`` and ``case_batch`` only. The first protocol runs everywhere, the
    others only at (``case_workers``, ``case_batch``), beside it.
    """

    jobs: int = 20_000
    workers: Sequence[int] = (1, 2, 4)
    batches: Sequence[int] = (10, 100)
    systems: Sequence[str] = DRAIN_SYSTEMS
    repeat: int = 3
    protocols: Sequence[str] = PROTOCOLS
    cases: Sequence[str] = CASES
    case_workers: int = 2
    case_batch: int = 10
    #: The burst is ``burst_factor`` times ``jobs``; the hot key holds ``hot_factor`` times.
    burst_factor: int = 10
    hot_factor: float = 2.5
    #: Seconds after which a burst or hot run is stopped and reported at its rate so far.
    cap_s: float = 120.0

    def backlog(self, case: str) -> int:
        """Jobs enqueued before the clock in ``case`` (the hot key's included)."""
        if case == "burst":
            return self.jobs * self.burst_factor
        if case == "hot":
            return self.jobs + self.hot_jobs
        return self.jobs

    @property
    def hot_jobs(self) -> int:
        """Jobs of the hot key in the ``hot`` case."""
        return int(self.jobs * self.hot_factor)

    def systems_of(self, case: str) -> list[str]:
        """The systems that run ``case``."""
        if case == "plain":
            return list(self.systems)
        usable = [s for s in self.systems if s in CASE_SYSTEMS]
        return [s for s in usable if s != "bare"] if case == "hot" else usable


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
    protocol: str = "cold"
    case: str = "plain"
    #: ``pg_class.reltuples`` of the system's queue table when the clock started.
    planner_rows: float = math.nan
    #: Counted jobs done when a capped run was stopped (0: the run reached its count).
    capped: int = 0

    def rate(self, jobs: int) -> float:
        """Jobs per second."""
        return jobs / self.seconds

    def cpu_us_per_job(self, jobs: int) -> float:
        """Worker CPU time per job, in microseconds (all worker processes together).

        In the burst and hot cases the workers run on a little after the counted jobs
        until they are stopped; that work is included.
        """
        return 1e6 * self.cpu_s / jobs

    def server_us_per_job(self, jobs: int) -> float:
        """Server backend CPU time per job, in microseconds."""
        return 1e6 * self.server_cpu_s / jobs


def truncate_all(db: BenchDatabase) -> None:
    """Empty every contender's tables (their statistics stay: see ``fresh_tables``)."""
    with db.connect() as conn:
        conn.execute(f"TRUNCATE {', '.join(ALL_TABLES)} RESTART IDENTITY")


def task_of(system: str) -> str:
    """The task a system's drain runs: the async worker gets the ``async def`` handler."""
    return app.ANOOP if base_system(system) == "sqla-async" else app.NOOP


def enqueue_jobs(
    db: BenchDatabase, system: str, jobs: int, task_name: str, *, queue_id: str | None = None
) -> None:
    """Put ``jobs`` pending jobs of ``task_name`` in ``system``'s tables, as its users would.

    With ``queue_id`` all of them share that key (for PgQueuer, which has no keys, they go
    to :data:`HOT_ENTRYPOINT` instead; for graphile-worker to the queue of that name).
    """
    if system in GRAPHILE_SYSTEMS:
        with db.connect() as conn:
            node_peers.enqueue(conn, jobs, task_name, queue_name=queue_id)
    elif system == "pgboss":
        node_peers.pgboss_enqueue(db.dsn, HOT_ENTRYPOINT if queue_id else task_name, jobs)
    elif system in ("sqla-sync", "sqla-async", "bare", "bare-1tx"):
        task = app.queue.get_task(task_name)
        if queue_id is not None:
            task = task.options(queue_id=queue_id)
        assert db.engine is not None
        with Session(db.engine) as session, session.begin():
            app.queue.enqueue_many(session, (task.call(n=i) for i in range(jobs)))
    elif system == "pgqueuer":
        entrypoint = HOT_ENTRYPOINT if queue_id is not None else task_name
        asyncio.run(_pgqueuer_enqueue(db.dsn, jobs, entrypoint))
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
    if system in GRAPHILE_SYSTEMS:
        with db.connect() as conn:
            node_peers.check_reports(conn, system, reports, jobs)
        return float(max(r["last_done"] for r in reports) - m0)
    with db.connect() as conn:
        if system == "pgqueuer":
            row = conn.execute(
                "SELECT max(created), count(*) FILTER (WHERE status = 'successful'), "
                "(SELECT count(*) FROM pgqueuer), "
                "count(DISTINCT job_id) FILTER (WHERE status = 'successful') FROM pgqueuer_log"
            ).fetchone()
        elif system == "bare-min":
            row = conn.execute(
                "SELECT NULL, %s, count(*), %s FROM bench_min_queue", (jobs, jobs)
            ).fetchone()
        elif system == "pgboss":
            row = conn.execute(
                "SELECT max(completed_on), count(*) FILTER (WHERE state = 'completed'), "
                "count(*) FILTER (WHERE state <> 'completed'), "
                "count(*) FILTER (WHERE state = 'completed' AND retry_count = 0) "
                f"FROM {node_peers.PGBOSS_JOBS}"
            ).fetchone()
        else:
            row = conn.execute(
                "SELECT max(finished_at), count(*) FILTER (WHERE status = 'succeeded'), "
                "(SELECT count(*) FROM sqla_queue_job_executions), "
                "count(*) FILTER (WHERE status = 'succeeded' AND attempts = 1) "
                "FROM sqla_queue_jobs"
            ).fetchone()
    assert row is not None
    last, done, remaining, once = row
    if done != jobs or remaining != 0 or once != jobs:
        raise RuntimeError(
            f"{system}: {done} of {jobs} jobs done ({once} exactly once), {remaining} left over"
        )
    if system == "bare-min":
        return float(max(r["last_done"] for r in reports) - m0)
    assert isinstance(last, dt.datetime)
    return (last - t0).total_seconds()


def _finish_time_no_history(db: BenchDatabase, jobs: int, m0: float, reports: list[Any]) -> float:
    """Seconds from the start barrier to the last completion a worker saw, on a queue
    without history; checks that every job ran once and left no row behind."""
    with db.connect() as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM sqla_queue_jobs), "
            "(SELECT count(*) FROM sqla_queue_job_executions)"
        ).fetchone()
    assert row is not None
    claimed = sum(int(r["claimed"]) for r in reports)
    if row != (0, 0) or claimed != jobs:
        raise RuntimeError(
            f"no history: {claimed} claims for {jobs} jobs, {row[0]} job rows and {row[1]} "
            "executions left over"
        )
    return float(max(r["last_done"] for r in reports) - m0)


def _counted_sql(system: str, case: str) -> tuple[str, str]:
    """SQL of (how many counted jobs are done, when the ``%(n)s``-th counted one finished).

    graphile-worker keeps no history: its count is the counted jobs (``%(total)s``, all
    queue-less) less those still in its table, and its time comes from the workers.
    """
    if system in GRAPHILE_SYSTEMS:
        return (
            f"SELECT %(total)s - count(*) FROM {node_peers.GRAPHILE_JOBS} "
            "WHERE job_queue_id IS NULL",
            "",
        )
    if system == "pgboss":
        where = "state = 'completed' AND name = %(task)s"
        return (
            f"SELECT count(*) FROM {node_peers.PGBOSS_JOBS} WHERE {where}",
            f"SELECT completed_on FROM {node_peers.PGBOSS_JOBS} WHERE {where} "
            "ORDER BY completed_on OFFSET %(n)s - 1 LIMIT 1",
        )
    if system == "pgqueuer":
        where = "status = 'successful' AND entrypoint = %(task)s"
        return (
            f"SELECT count(*) FROM pgqueuer_log WHERE {where}",
            f"SELECT created FROM pgqueuer_log WHERE {where} "
            "ORDER BY created OFFSET %(n)s - 1 LIMIT 1",
        )
    where = "status = 'succeeded'" + (" AND queue_id IS NULL" if case == "hot" else "")
    return (
        f"SELECT count(*) FROM sqla_queue_jobs WHERE {where}",
        f"SELECT finished_at FROM sqla_queue_jobs WHERE {where} "
        "ORDER BY finished_at OFFSET %(n)s - 1 LIMIT 1",
    )


def _wait_for_counted(
    db: BenchDatabase,
    system: str,
    case: str,
    jobs: int,
    task: str,
    procs: Sequence[Any],
    cap_s: float,
    total: int = 0,
) -> int:
    """Poll the database until ``jobs`` counted jobs are done, then stop the workers.

    After ``cap_s`` seconds the workers are stopped anyway; returns how many counted jobs
    were done by then (``jobs`` when the run finished). ``total``: how many counted jobs
    were enqueued (graphile-worker's count needs it).
    """
    count_sql, _ = _counted_sql(system, case)
    deadline = time.monotonic() + cap_s
    with db.connect() as conn:
        while True:
            row = conn.execute(count_sql, {"task": task, "total": total}).fetchone()
            assert row is not None
            done = int(row[0])
            if done >= jobs:
                done = jobs
                break
            if all(p.proc.poll() is not None for p in procs):
                raise RuntimeError(f"{system}: workers exited after {done} of {jobs} jobs")
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    for p in procs:
        if p.proc.poll() is None:
            p.terminate()
    return done


def _counted_time(
    db: BenchDatabase, system: str, case: str, jobs: int, task: str, t0: dt.datetime
) -> float:
    """Seconds to the ``jobs``-th counted completion; checks every job ran at most once."""
    _, nth_sql = _counted_sql(system, case)
    with db.connect() as conn:
        row = conn.execute(nth_sql, {"task": task, "n": jobs}).fetchone()
        if system == "pgqueuer":
            check = conn.execute(
                "SELECT count(*), count(DISTINCT job_id) FROM pgqueuer_log "
                "WHERE status = 'successful'"
            ).fetchone()
        elif system == "pgboss":
            check = conn.execute(
                "SELECT count(*) FILTER (WHERE state = 'completed'), "
                "count(*) FILTER (WHERE state = 'completed' AND retry_count = 0) "
                f"FROM {node_peers.PGBOSS_JOBS}"
            ).fetchone()
        else:
            check = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
                "count(*) FILTER (WHERE status = 'succeeded' AND attempts = 1) "
                "FROM sqla_queue_jobs"
            ).fetchone()
    assert check is not None
    if row is None or check[0] != check[1]:
        raise RuntimeError(
            f"{system} {case}: {check[0]} completions but {check[1]} jobs done exactly once"
        )
    last = row[0]
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
    protocol: str = "cold",
    case: str = "plain",
    backlog: int | None = None,
    cap_s: float = 120.0,
) -> DrainRun:
    """One timed drain of ``jobs`` jobs by ``workers`` processes of ``system``.

    ``task`` defaults to the system's no-op task; ``limit`` is PgQueuer's entrypoint
    concurrency limit (sqla_queue's limit is part of the task's definition).
    ``extra_args`` go to every worker; ``prefixes`` wrap their commands and ``env`` adds
    to their environment (see :func:`~bench.common.worker_processes`).

    ``protocol``: ``cold`` (no ANALYZE between the enqueue and the clock) or ``warm``.
    ``case`` and ``backlog``: ``plain`` drains ``jobs`` to the end; ``burst`` enqueues
    ``backlog`` jobs and counts the first ``jobs``; ``hot`` enqueues ``backlog - jobs``
    jobs of one hot key first and counts the ``jobs`` ordinary ones after them.
    """
    task = task or task_of(system)
    variant, system = system, base_system(system)
    no_history = variant == "sqla-sync-nohistory"
    node = system in NODE_SYSTEMS
    graphile = system in GRAPHILE_SYSTEMS
    db.fresh_tables()
    if graphile:
        node_peers.fresh_schema(db.dsn)
    elif system == "pgboss":
        node_peers.fresh_pgboss(db.dsn, task, HOT_ENTRYPOINT)
    extra = [*VARIANTS.get(variant, ("", ()))[1], *extra_args]
    if case == "burst":
        enqueue_jobs(db, system, backlog or jobs, task)
    elif case == "hot":
        enqueue_jobs(db, system, (backlog or jobs) - jobs, task, queue_id=HOT_KEY)
        enqueue_jobs(db, system, jobs, task)
        if system in ("pgqueuer", "pgboss"):
            extra += ["--hot-task", HOT_ENTRYPOINT]
    else:
        enqueue_jobs(db, system, jobs, task)
    own = {"pgboss": node_peers.PGBOSS_TABLES}.get(
        system, node_peers.GRAPHILE_TABLES if graphile else ()
    )
    db.settle([*ALL_TABLES, *own], protocol)
    planner = db.planner_rows(PLANNER_TABLES)
    queue_table = {
        "pgqueuer": "pgqueuer",
        "bare-min": "bench_min_queue",
        "graphile": "_private_jobs",
        "graphile-batched": "_private_jobs",
        "pgboss": "job_common",
    }.get(system, "sqla_queue_job_executions")
    command: list[str] | None = None
    if node:
        # In the drain role graphile-worker's local queue stops at its first fetch that
        # finds less than it asked for (as the hot queue's jobs make it do); the counted
        # cases stop their workers with SIGTERM anyway.
        role = "drain" if case == "plain" else "idle"
        command = node_peers.worker_command(role, system, db.dsn, batch, task, extra)
        args: list[str] = []
    else:
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
            *extra,
        ]
    timeout = max(120.0, (backlog or jobs) / 200)
    with (
        worker_processes([args] * workers, prefixes, env, command) as procs,
        db.connect() as conn,
        BackendCpuMeter(db) as server,
    ):
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        t0: dt.datetime = row[0]
        m0 = time.monotonic()
        for p in procs:
            p.go()
        done = jobs
        if case != "plain":
            total = (backlog or jobs) if case == "burst" else jobs
            done = _wait_for_counted(db, system, case, jobs, task, procs, cap_s, total)
        reports = [p.finish(timeout) for p in procs]
    # A capped run is reported at the rate it reached: its time scaled to ``jobs``.
    if case == "plain" and no_history:
        seconds = _finish_time_no_history(db, jobs, m0, reports)
    elif case == "plain":
        seconds = _finish_time(db, system, jobs, t0, m0, reports)
    elif done == 0:
        raise RuntimeError(f"{system} {case}: no counted job done in {cap_s:.0f}s")
    elif graphile:
        seconds = node_peers.counted_seconds(reports, done, m0) * jobs / done
    else:
        seconds = _counted_time(db, system, case, done, task, t0) * jobs / done
    return DrainRun(
        variant,
        workers,
        batch,
        seconds,
        [float(r["maxrss_mb"]) for r in reports],
        sum(float(r["cpu_s"]) for r in reports),
        server.seconds,
        reports,
        protocol,
        case,
        planner.get(queue_table, math.nan),
        done if done < jobs else 0,
    )


def _plan(config: DrainConfig) -> list[tuple[int, int, str, str]]:
    """The (workers, batch, case, protocol) cells of this configuration, in run order."""
    cells = []
    for workers in config.workers:
        for batch in config.batches:
            headline = (workers, batch) == (config.case_workers, config.case_batch)
            for case in config.cases:
                if case != "plain" and not headline:
                    continue
                for protocol in config.protocols if headline else config.protocols[:1]:
                    cells.append((workers, batch, case, protocol))
    if not any(w == config.case_workers and b == config.case_batch for w, b, _, _ in cells):
        for case in config.cases:
            if case != "plain":
                for protocol in config.protocols:
                    cells.append((config.case_workers, config.case_batch, case, protocol))
    return cells


def run_drain(db: BenchDatabase, config: DrainConfig, log: Any = print) -> dict[str, Any]:
    """Every case for every system under every protocol, repeats interleaved.

    Returns ``{"tables": [...], "runs": [...], "summary": {...}}``; summary keys are
    ``{protocol}/{case}/{system}/W{workers}/b{batch}``, and for the plain case also the
    older ``{system}/W{workers}/b{batch}`` of the first protocol.
    """
    cells = _plan(config)
    runs: list[DrainRun] = []
    for rep in range(config.repeat):
        for workers, batch, case, protocol in cells:
            for system in config.systems_of(case):
                run = drain_once(
                    db,
                    system,
                    workers,
                    batch,
                    config.jobs,
                    protocol=protocol,
                    case=case,
                    backlog=config.backlog(case),
                    cap_s=config.cap_s,
                )
                runs.append(run)
                log(
                    f"  drain {protocol} {case:<5} {LABELS[system]:<24} W={workers} "
                    f"batch={batch} rep {rep + 1}/{config.repeat}: "
                    f"{run.rate(config.jobs):,.0f} jobs/s ({run.seconds:.2f}s, worker CPU "
                    f"{run.cpu_us_per_job(config.jobs):.0f} us/job, server CPU "
                    f"{run.server_us_per_job(config.jobs):.0f} us/job, peak RSS "
                    f"{max(run.rss_mb):.0f} MB, planner rows at start {run.planner_rows:,.0f})"
                    + (
                        f" CAPPED: {run.capped:,} of {config.jobs:,} done in {config.cap_s:.0f}s"
                        if run.capped
                        else ""
                    )
                )
                if protocol == "cold" and run.planner_rows > 0:
                    log("  WARNING: this cold run did not start from the empty tables' statistics")
    summary: dict[str, Any] = {}
    stats: dict[tuple[str, str, int, int, str], dict[str, Summary]] = {}
    #: The rates of each cell's repeats, in run order (repeat i of every system ran in
    #: round i, interleaved): per-round ratios compare runs made side by side.
    rounds: dict[tuple[str, str, int, int, str], list[float]] = {}
    for workers, batch, case, protocol in cells:
        for system in config.systems_of(case):
            mine = [
                r
                for r in runs
                if (r.system, r.workers, r.batch, r.case, r.protocol)
                == (system, workers, batch, case, protocol)
            ]
            rounds[(protocol, case, workers, batch, system)] = [r.rate(config.jobs) for r in mine]
            stats[(protocol, case, workers, batch, system)] = {
                "rate": summarize([r.rate(config.jobs) for r in mine]),
                "cpu": summarize([r.cpu_us_per_job(config.jobs) for r in mine]),
                "server": summarize([r.server_us_per_job(config.jobs) for r in mine]),
            }
    for (protocol, case, workers, batch, system), s in stats.items():
        rate = s["rate"]
        peer = stats.get((protocol, case, workers, batch, "pgqueuer"))
        bare = stats.get((protocol, case, workers, batch, "bare"))
        sync = stats.get((protocol, case, workers, batch, "sqla-sync"))
        plain = stats.get((protocol, "plain", workers, batch, system))
        mine_rounds = rounds[(protocol, case, workers, batch, system)]

        def paired(other: str) -> float:
            theirs = rounds.get((protocol, case, workers, batch, other), [])  # noqa: B023
            pairs = [a / b for a, b in zip(mine_rounds, theirs, strict=False) if b > 0]  # noqa: B023
            return statistics.median(pairs) if pairs else math.nan

        entry = {
            **rate.as_json(),
            "cpu_us_per_job": s["cpu"].median,
            "server_us_per_job": s["server"].median,
            "total_cpu_us_per_job": s["cpu"].median + s["server"].median,
            # Medians of per-round ratios (the protocol), beside the ratios of
            # medians below.
            "rounds_vs": {
                other: paired(other)
                for other in (
                    "sqla-sync",
                    "sqla-sync-prefetch",
                    "pgqueuer",
                    "bare",
                    "graphile",
                    "graphile-batched",
                )
            },
            "vs_pgqueuer": ratio(rate.median, peer["rate"].median) if peer else math.nan,
            "vs_bare": ratio(rate.median, bare["rate"].median) if bare else math.nan,
            "vs_sqla_sync": ratio(rate.median, sync["rate"].median) if sync else math.nan,
            "vs_plain": ratio(rate.median, plain["rate"].median) if plain else math.nan,
        }
        summary[f"{protocol}/{case}/{system}/W{workers}/b{batch}"] = entry
        if case == "plain" and protocol == config.protocols[0]:
            summary[f"{system}/W{workers}/b{batch}"] = entry
    tables = [
        _case_table(config, stats, cells),
        _matrix_table(config, stats, cells),
        memory_table(runs, config),
    ]
    return {
        "tables": [t for t in tables if t.rows],
        "runs": [
            {
                "system": r.system,
                "workers": r.workers,
                "batch": r.batch,
                "protocol": r.protocol,
                "case": r.case,
                "seconds": r.seconds,
                "planner_rows": r.planner_rows,
                "capped": r.capped,
                "rss_mb": r.rss_mb,
                "cpu_s": r.cpu_s,
                "server_cpu_s": r.server_cpu_s,
            }
            for r in runs
        ],
        "summary": summary,
        "protocols": list(config.protocols),
    }


def case_label(config: DrainConfig, case: str) -> str:
    """What a case is, with its sizes."""
    if case == "burst":
        return f"first {config.jobs:,} of {config.backlog(case):,}"
    if case == "hot":
        return f"{config.jobs:,} behind {config.hot_jobs:,} of 1 key"
    return f"{config.jobs:,} jobs"


def _case_table(
    config: DrainConfig,
    stats: dict[tuple[str, str, int, int, str], dict[str, Summary]],
    cells: Sequence[tuple[int, int, str, str]],
) -> TextTable:
    """The three cases at the headline (workers, batch), one column group per protocol."""
    w, b = config.case_workers, config.case_batch
    protocols = [p for p in config.protocols if any(c[3] == p for c in cells)]
    headers = ["case", "system"]
    for i, protocol in enumerate(protocols):
        name = f"{protocol} (default)" if i == 0 and protocol == "cold" else protocol
        headers += [f"{name} jobs/s", f"{protocol} vs PgQueuer", f"{protocol} vs case a"]
    if len(protocols) > 1:
        headers.append(f"{protocols[0]}/{protocols[1]}")
    table = TextTable(
        f"Drain cases: {w} workers, batch {b}, jobs/s to the last counted completion, "
        f"median (min-max) of {config.repeat}; "
        + " beside ".join(f"{p} protocol" for p in protocols),
        headers,
    )
    for letter, case in zip("abc", CASES, strict=True):
        if case not in config.cases:
            continue
        for system in config.systems_of(case):
            row = [f"({letter}) {case_label(config, case)}", LABELS[system]]
            medians = []
            for protocol in protocols:
                s = stats.get((protocol, case, w, b, system))
                if s is None:
                    row += ["-", "-", "-"]
                    medians.append(math.nan)
                    continue
                rate = s["rate"]
                peer = stats.get((protocol, case, w, b, "pgqueuer"))
                plain = stats.get((protocol, "plain", w, b, system))
                row += [
                    fmt_rate(rate),
                    fmt_ratio(ratio(rate.median, peer["rate"].median)) if peer else "-",
                    fmt_ratio(ratio(rate.median, plain["rate"].median)) if plain else "-",
                ]
                medians.append(rate.median)
            if len(protocols) > 1:
                row.append(fmt_ratio(ratio(medians[0], medians[1])))
            table.add(*row)
    table.note(
        "cold: tables created and ANALYZEd empty, jobs enqueued, no ANALYZE before the "
        "clock (the default). warm: the same plus VACUUM ANALYZE after the enqueue. "
        "'vs case a': this case's rate over the plain drain of the same system, protocol "
        "and run. Case (c) has no bare-SQL row: the bare loop ignores queue_id. PgQueuer's "
        "hot jobs go to a second entrypoint with concurrency_limit=1. A burst or hot run "
        f"still short of its count after {config.cap_s:.0f}s is stopped and shown at the "
        "rate it reached (the log says CAPPED)."
    )
    return table


def _matrix_table(
    config: DrainConfig,
    stats: dict[tuple[str, str, int, int, str], dict[str, Summary]],
    cells: Sequence[tuple[int, int, str, str]],
) -> TextTable:
    """The plain case at every (workers, batch) of the first protocol."""
    protocol = config.protocols[0]
    table = TextTable(
        f"Drain: {config.jobs:,} no-op jobs, {protocol} protocol, jobs/s, median (min-max) "
        f"of {config.repeat}",
        [
            "workers",
            "batch",
            "system",
            "jobs/s",
            "vs sqla sync",
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
        "backends serving the benchmark database (background writers not included). "
        "graphile-worker: defaults (its pool of 10 connections), concurrency = batch; "
        "batched: plus localQueue.size = batch and "
        f"completions batched over {GRAPHILE_BATCH_DELAY_MS} ms; its clock stops at the last "
        "completion its workers wrote (it keeps no history). pg-boss: batchSize = batch, "
        "burstWhenBatchFull, 0.5 s poll, no supervision/cron in the workers."
    )
    for workers, batch, case, proto in cells:
        if case != "plain" or proto != protocol:
            continue
        peer = stats.get((protocol, case, workers, batch, "pgqueuer"))
        bare = stats.get((protocol, case, workers, batch, "bare"))
        sync = stats.get((protocol, case, workers, batch, "sqla-sync"))
        for system in config.systems_of(case):
            s = stats[(protocol, case, workers, batch, system)]
            rate = s["rate"]
            table.add(
                workers,
                batch,
                LABELS[system],
                fmt_rate(rate),
                fmt_ratio(ratio(rate.median, sync["rate"].median)) if sync else "-",
                fmt_ratio(ratio(rate.median, peer["rate"].median)) if peer else "-",
                fmt_ratio(ratio(rate.median, bare["rate"].median)) if bare else "-",
                f"{rate.spread():.0%}",
                f"{s['cpu'].median:.0f}",
                f"{s['server'].median:.0f}",
            )
    return table


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
