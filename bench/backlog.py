"""Scenarios 4 (backlog scaling) and 5 (limit scaling): the cost of one claim.

The claim is sqla_queue's own statement, built by ``claim_statement(queue.tables)``,
compiled with the engine's dialect, and given the parameters a worker core would send. It
runs on a plain psycopg connection. Each timed claim (batch 10) runs in a transaction;
after it, untimed, the claimed executions are completed and as many new jobs enqueued, so
the backlog keeps its size. The first claims of each level warm the caches and the
prepared statement and are not counted.

Backlogs are seeded with INSERT ... SELECT generate_series, consistently into both tables:
pending jobs have a ``queued`` job row and a ``pending`` execution; history is ``succeeded``
job rows without an execution. PgQueuer's claim is timed the same way on its own table
(history goes into its log table) and so is the bare-SQL claim on sqla_queue's tables.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from bench import app, baseline
from bench.common import (
    BenchDatabase,
    TextTable,
    fmt_ratio,
    percentile,
    ratio,
    summarize,
)
from bench.drain import ALL_TABLES, DrainRun, drain_once, truncate_all
from sqla_queue.statements import claim_statement
from sqla_queue.worker.core import GENERIC_PLAN_SETTINGS, WorkerCore
from sqla_queue.worker.settings import WorkerSettings

__all__ = ["BacklogConfig", "LimitConfig", "run_backlog", "run_limits"]

BATCH = 10
WARM_UP = 20
SEED_CHUNK = 250_000


@dataclass(frozen=True)
class BacklogConfig:
    """The levels, as (pending executions, finished jobs in history), and claims per level."""

    levels: Sequence[tuple[int, int]] = (
        (1_000, 0),
        (100_000, 0),
        (1_000_000, 0),
        (1_000_000, 1_000_000),
    )
    claims: int = 300
    pgqueuer: bool = True


def compiled_claim(db: BenchDatabase, task: str) -> tuple[str, dict[str, Any]]:
    """sqla_queue's claim statement as SQL text for the engine's dialect, and its parameters.

    The statement is the one a worker core for ``task`` would run (for an unlimited task,
    ``claim_statement(queue.tables)``; for a limited one, its slot-aware variant).
    """
    assert db.engine is not None
    core = WorkerCore(app.queue, WorkerSettings(concurrency=BATCH, tasks=[task]))
    statement = getattr(core, "claim_statement", None)
    if statement is None:
        statement = claim_statement(app.queue.tables)
    # The limited claim renders its batch size into the SQL at execution time: expand it.
    compiled = statement.compile(dialect=db.engine.dialect)
    state = compiled.construct_expanded_state(core.claim_params(BATCH))
    return state.statement, dict(state.parameters)


# -- seeding ------------------------------------------------------------------------------------

REPLENISH_SQLA = """
WITH j AS (
    INSERT INTO sqla_queue_jobs (task, payload, priority, max_attempts, scheduled_at)
    SELECT %(task)s, '{"args": [], "kwargs": {}}', 0, 1, now()
    FROM generate_series(1, %(n)s)
    RETURNING id, task, priority, scheduled_at
)
INSERT INTO sqla_queue_job_executions (id, task, priority, state, execute_at)
SELECT id, task, priority, 'pending', scheduled_at FROM j
"""

HISTORY_SQLA = """
INSERT INTO sqla_queue_jobs
    (task, payload, priority, max_attempts, scheduled_at, status, attempts, created_at,
     finished_at)
SELECT %(task)s, jsonb_build_object('args', '[]'::jsonb, 'kwargs', jsonb_build_object('n', g)),
       0, 1, now() - interval '2 days', 'succeeded', 1, now() - interval '2 days',
       now() - interval '1 day' + g * interval '1 millisecond'
FROM generate_series(1, %(n)s) g
"""

PENDING_SQLA = """
WITH j AS (
    INSERT INTO sqla_queue_jobs (task, payload, priority, max_attempts, scheduled_at)
    SELECT %(task)s, jsonb_build_object('args', '[]'::jsonb, 'kwargs', jsonb_build_object('n', g)),
           0, 1, now() - interval '1 hour' + g * interval '1 microsecond'
    FROM generate_series(1, %(n)s) g
    RETURNING id, task, priority, scheduled_at
)
INSERT INTO sqla_queue_job_executions (id, task, priority, state, execute_at)
SELECT id, task, priority, 'pending', scheduled_at FROM j
"""

PENDING_PGQ = """
INSERT INTO pgqueuer (priority, entrypoint, payload, status, execute_after)
SELECT 0, %(task)s, convert_to(g::text, 'UTF8'), 'queued',
       now() - interval '1 hour' + g * interval '1 microsecond'
FROM generate_series(1, %(n)s) g
"""

HISTORY_PGQ = """
INSERT INTO pgqueuer_log (job_id, status, priority, entrypoint, created, aggregated)
SELECT g, 'successful', 0, %(task)s, now() - interval '1 day', true
FROM generate_series(1, %(n)s) g
"""


def _seed(conn: psycopg.Connection[Any], sql: str, task: str, n: int) -> None:
    for start in range(0, n, SEED_CHUNK):
        conn.execute(sql, {"task": task, "n": min(SEED_CHUNK, n - start)})


def _count(conn: psycopg.Connection[Any], sql: str) -> int:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def top_up(db: BenchDatabase, pending: int, history: int, *, pgqueuer: bool) -> float:
    """Bring both systems' tables to ``pending`` due jobs and ``history`` finished ones.

    Returns the seconds the seeding took.
    """
    start = time.perf_counter()
    with db.connect() as conn:
        have = _count(conn, "SELECT count(*) FROM sqla_queue_job_executions")
        done = _count(conn, "SELECT count(*) FROM sqla_queue_jobs WHERE status = 'succeeded'")
        _seed(conn, PENDING_SQLA, app.NOOP, pending - have)
        _seed(conn, HISTORY_SQLA, app.NOOP, history - done)
        if pgqueuer:
            have = _count(conn, "SELECT count(*) FROM pgqueuer")
            done = _count(conn, "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
            _seed(conn, PENDING_PGQ, app.NOOP, pending - have)
            _seed(conn, HISTORY_PGQ, app.NOOP, history - done)
    db.settle(ALL_TABLES)
    return time.perf_counter() - start


# -- timing -----------------------------------------------------------------------------------


def time_sqla_claims(
    db: BenchDatabase, sql: str, params: dict[str, Any], claims: int, task: str
) -> list[float]:
    """Milliseconds of ``claims`` claims with sqla_queue's statement (or the bare one).

    sqla_queue's claim runs with the worker connection's settings (generic plans, no JIT):
    from the sixth run on, psycopg has prepared it, as it does in a worker.
    """
    times: list[float] = []
    worker = params["worker"]
    with psycopg.connect(db.dsn) as conn:
        if sql is not baseline.CLAIM:
            # The session a worker's own connection runs its statements in.
            for setting in GENERIC_PLAN_SETTINGS:
                conn.execute(setting)
            conn.commit()
        for i in range(claims + WARM_UP):
            start = time.perf_counter()
            rows = conn.execute(sql, params).fetchall()
            elapsed = time.perf_counter() - start
            if i >= WARM_UP:
                times.append(1000 * elapsed)
            got = [r for r in rows if r[0] is not None] if sql is not baseline.CLAIM else rows
            ids, attempts = _ids_attempts(sql, got)
            if ids:
                conn.execute(
                    baseline.COMPLETE, {"ids": ids, "attempts": attempts, "worker": worker}
                )
                conn.execute(REPLENISH_SQLA, {"task": task, "n": len(ids)})
            conn.commit()
    return times


def _ids_attempts(sql: str, rows: Sequence[Any]) -> tuple[list[int], list[int]]:
    if sql is baseline.CLAIM:
        return [r[0] for r in rows], [r[1] for r in rows]
    # sqla_queue's claim: next_due, id, attempt, ...; an empty claim is one row of NULLs.
    live = [r for r in rows if r[1] is not None]
    return [r[1] for r in live], [r[2] for r in live]


def time_pgqueuer_claims(db: BenchDatabase, claims: int) -> list[float]:
    """Milliseconds of ``claims`` runs of PgQueuer's dequeue statement (no limits)."""
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueEntrypoint, QueueManagerId

    async def main() -> list[float]:
        conn = await asyncpg.connect(db.dsn)
        queries = Queries(AsyncpgDriver(conn))
        query = queries.qbq.build_dequeue_query(
            batch_size=BATCH,
            entrypoints=[QueueEntrypoint(app.NOOP)],
            concurrency_limits=[0],
            queue_manager_id=QueueManagerId(uuid.uuid4()),
            global_concurrency_limit=None,
            heartbeat_timeout=dt.timedelta(seconds=30),
        )
        times: list[float] = []
        for i in range(claims + WARM_UP):
            async with conn.transaction():
                start = time.perf_counter()
                rows = await conn.fetch(query.sql, *query.args)
                elapsed = time.perf_counter() - start
                ids = [r["id"] for r in rows]
                await conn.execute("DELETE FROM pgqueuer WHERE id = ANY($1)", ids)
                await conn.execute(
                    "INSERT INTO pgqueuer (priority, entrypoint, payload, status) "
                    "SELECT 0, $1, NULL, 'queued' FROM generate_series(1, $2)",
                    app.NOOP,
                    len(ids),
                )
            if i >= WARM_UP:
                times.append(1000 * elapsed)
        await conn.close()
        return times

    return asyncio.run(main())


def explain_claim(db: BenchDatabase, sql: str, params: dict[str, Any]) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim, rolled back."""
    with psycopg.connect(db.dsn) as conn:
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall()
        conn.rollback()
    return [str(r[0]) for r in rows]


def seq_scans(plan: Sequence[str]) -> list[str]:
    """Plan lines that scan one of sqla_queue's tables sequentially."""
    return [
        line.strip()
        for line in plan
        if "Seq Scan on sqla_queue_job" in line or "Seq Scan on sqla_queue_jobs" in line
    ]


def _label(pending: int, history: int) -> str:
    text = f"{pending:,} pending"
    return text + (f" + {history:,} history" if history else "")


def run_backlog(db: BenchDatabase, config: BacklogConfig, log: Any = print) -> dict[str, Any]:
    """Claim cost at each backlog level for sqla_queue, bare SQL and PgQueuer."""
    truncate_all(db)
    sql, params = compiled_claim(db, app.NOOP)
    bare_params = {"tasks": [app.NOOP], "batch": BATCH, "worker": uuid.uuid4()}
    results: dict[str, dict[str, list[float]]] = {}
    plan: list[str] = []
    for pending, history in config.levels:
        seconds = top_up(db, pending, history, pgqueuer=config.pgqueuer)
        label = _label(pending, history)
        log(f"  backlog {label}: seeded in {seconds:.1f}s")
        level: dict[str, list[float]] = {
            "sqla": time_sqla_claims(db, sql, params, config.claims, app.NOOP),
            "bare": time_sqla_claims(db, baseline.CLAIM, bare_params, config.claims, app.NOOP),
        }
        if config.pgqueuer:
            level["pgqueuer"] = time_pgqueuer_claims(db, config.claims)
        results[label] = level
        log(
            "  backlog "
            + label
            + ": "
            + ", ".join(f"{k} p50 {percentile(v, 50):.2f} ms" for k, v in level.items())
        )
        plan = explain_claim(db, sql, params)
    first = next(iter(results.values()))
    table = TextTable(
        f"Backlog: one claim of {BATCH} (ms, p50 / p95 of {config.claims} claims), "
        "backlog held constant",
        [
            "backlog",
            "sqla_queue",
            "bare SQL",
            "PgQueuer",
            "sqla vs bare",
            "sqla vs PgQueuer",
            "sqla vs 1k level",
        ],
    )
    summary: dict[str, Any] = {}
    for label, level in results.items():
        p50 = {k: percentile(v, 50) for k, v in level.items()}
        table.add(
            label,
            f"{p50['sqla']:.2f} / {percentile(level['sqla'], 95):.2f}",
            f"{p50['bare']:.2f} / {percentile(level['bare'], 95):.2f}",
            f"{p50['pgqueuer']:.2f} / {percentile(level['pgqueuer'], 95):.2f}"
            if "pgqueuer" in level
            else "-",
            fmt_ratio(ratio(p50["sqla"], p50["bare"])),
            fmt_ratio(ratio(p50["sqla"], p50.get("pgqueuer", float("nan")))),
            fmt_ratio(ratio(p50["sqla"], percentile(first["sqla"], 50))),
        )
        summary[label] = {
            k: summarize(v).as_json() | {"p95": percentile(v, 95)} for k, v in level.items()
        }
    scans = seq_scans(plan)
    table.note(
        "Ratios below 1.00x are faster. Sequential scans of sqla_queue's tables in the claim "
        f"plan at the largest level: {scans or 'none'}"
    )
    return {"tables": [table], "summary": summary, "plan": plan, "seq_scans": scans}


# -- limits ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LimitConfig:
    """Limit scaling: drains of a limited task, and the claim at each limit."""

    limits: Sequence[int] = (10, 5000)
    jobs: int = 20_000
    workers: int = 2
    repeat: int = 3
    claims: int = 300
    backlog: int = 100_000


def run_limits(db: BenchDatabase, config: LimitConfig, log: Any = print) -> dict[str, Any]:
    """Scenario 5, or a clear note that the installed sqla_queue cannot run it."""
    table = TextTable(
        f"Limit scaling: drain of {config.jobs:,} no-op jobs of a task with a concurrency "
        f"limit, {config.workers} workers, batch {BATCH} (jobs/s, median of {config.repeat})",
        [
            "limit",
            "sqla_queue sync",
            "PgQueuer",
            "sqla vs PgQueuer",
            "sqla vs unlimited",
            "paired vs unlimited",
            "worker CPU us/job",
            "server CPU us/job",
        ],
    )
    if not app.limits_supported():
        table.note(
            "SKIPPED: the installed sqla_queue has no @queue.task(concurrency_limit=N) "
            "(inspect.signature(queue.task) lacks it), so there is nothing to measure yet."
        )
        log("  limits: skipped, sqla_queue lacks concurrency_limit")
        return {"tables": [table], "summary": {"skipped": True}}
    summary: dict[str, Any] = {}
    unlimited = None
    claims = TextTable(
        f"Limit scaling: one claim of {BATCH} with {config.backlog:,} pending jobs of the "
        f"task (ms, p50 / p95 of {config.claims})",
        ["limit", "sqla_queue claim", "vs unlimited"],
    )
    plain = None
    for limit in (0, *config.limits):
        task = app.limit_task(limit)
        truncate_all(db)
        with db.connect() as conn:
            _seed(conn, PENDING_SQLA, task, config.backlog)
        db.settle(ALL_TABLES)
        sql, params = compiled_claim(db, task)
        times = time_sqla_claims(db, sql, params, config.claims, task)
        p50 = percentile(times, 50)
        plain = plain or p50
        claims.add(
            limit or "none",
            f"{p50:.2f} / {percentile(times, 95):.2f}",
            fmt_ratio(ratio(p50, plain)),
        )
        summary[f"claim/{limit}"] = summarize(times).as_json()
        log(f"  limits: claim at limit {limit or 'none'}: p50 {p50:.2f} ms")
    # Repeats interleave the limits (none, 10, 5000, none, ...), so a slow spell of the
    # shared machine hits every limit alike; each repeat's sqla_queue drain is also
    # compared with the unlimited one of the same repeat (the paired ratio).
    order = (0, *config.limits)
    runs: dict[int, dict[str, list[DrainRun]]] = {
        limit: {"sqla-sync": [], "pgqueuer": []} for limit in order
    }
    for _ in range(config.repeat):
        for limit in order:
            task = app.limit_task(limit)
            for system, done in runs[limit].items():
                done.append(
                    drain_once(
                        db, system, config.workers, BATCH, config.jobs, task=task, limit=limit
                    )
                )
    for limit in order:
        s = {k: summarize([r.rate(config.jobs) for r in v]) for k, v in runs[limit].items()}
        sqla = runs[limit]["sqla-sync"]
        if limit == 0:
            unlimited = s["sqla-sync"].median
        paired = [
            ratio(mine.rate(config.jobs), base.rate(config.jobs))
            for mine, base in zip(sqla, runs[0]["sqla-sync"], strict=True)
        ]
        cpu = statistics.median(r.cpu_us_per_job(config.jobs) for r in sqla)
        server = statistics.median(r.server_us_per_job(config.jobs) for r in sqla)
        table.add(
            limit or "none",
            f"{s['sqla-sync'].median:,.0f}",
            f"{s['pgqueuer'].median:,.0f}",
            fmt_ratio(ratio(s["sqla-sync"].median, s["pgqueuer"].median)),
            fmt_ratio(ratio(s["sqla-sync"].median, unlimited or float("nan"))),
            f"{statistics.median(paired):.2f}x ({min(paired):.2f}-{max(paired):.2f})",
            f"{cpu:.0f}",
            f"{server:.0f}",
        )
        summary[str(limit)] = {k: v.as_json() for k, v in s.items()}
        summary[str(limit)]["paired_vs_unlimited"] = paired
        summary[str(limit)]["worker_cpu_us_per_job"] = cpu
        summary[str(limit)]["server_cpu_us_per_job"] = server
        log(
            f"  limits: drain at limit {limit or 'none'}: "
            + ", ".join(f"{k} {v.median:,.0f}/s" for k, v in s.items())
        )
    return {"tables": [table, claims], "summary": summary}
