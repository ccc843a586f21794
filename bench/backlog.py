"""Scenarios 4 (backlog shapes) and 5 (limit scaling): the cost of one claim.

The claim is sqla_queue's own statement, ``claim_statement(queue.tables)`` compiled with
the engine's dialect, run on a psycopg connection exactly as a worker runs it: in a
transaction opened by ``planner_guard(generic_plans=True)``, as a prepared statement
(``prepare=True``). Each timed claim (batch 10) is rolled back, so the backlog never
changes; the first claims warm the caches and are not counted.

Each shape starts from fresh tables analyzed while empty and is seeded with INSERT ...
SELECT generate_series straight into the queue's tables. The cold figure is taken first
(the statistics are still those of the empty tables), then the tables are VACUUM ANALYZEd
and the warm figure taken on the same rows. Seeding follows what ``enqueue_many`` writes:
one or two template jobs are enqueued through the public API and their rows cloned, so a
job of a hot key gets whatever state the installed schema gives a key's later jobs. History
is ``succeeded`` job rows without an execution. PgQueuer's claim is timed the same way on
its own table and so is the bare-SQL claim on sqla_queue's tables, at the plain levels.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg.sql
from sqlalchemy.orm import Session

from bench import app, baseline
from bench.common import (
    PROTOCOLS,
    BenchDatabase,
    TextTable,
    fmt_ratio,
    percentile,
    ratio,
    summarize,
)
from bench.drain import ALL_TABLES, DrainRun, drain_once
from sqla_queue.statements import claim_statement
from sqla_queue.statements.planner import planner_guard

__all__ = ["BacklogConfig", "LimitConfig", "Shape", "run_backlog", "run_limits"]

BATCH = 10
WARM_UP = 5
SEED_CHUNK = 250_000
#: The task of the worker whose claim is timed, and the other task of the "other task" shape.
TASK_A = app.NOOP
TASK_B = app.ANOOP


@dataclass(frozen=True)
class Segment:
    """``count`` jobs of ``task`` (of one hot key with ``keyed``), after earlier segments."""

    task: str
    count: int
    keyed: bool = False


@dataclass(frozen=True)
class Shape:
    """One backlog: segments in claim order, plus finished jobs in history."""

    name: str
    segments: tuple[Segment, ...]
    history: int = 0
    #: Also time PgQueuer's and the bare-SQL claim (plain backlogs only).
    peers: bool = False

    @property
    def pending(self) -> int:
        """Jobs in the backlog."""
        return sum(s.count for s in self.segments)


def shapes(big: int, history: int) -> tuple[Shape, ...]:
    """The shapes: 1k, big/10 and ``big`` pending, then three shapes of ``big`` pending."""
    small = 1_000
    rest = min(10_000, big // 100)
    return (
        Shape(f"{small:,} pending", (Segment(TASK_A, small),), peers=True),
        Shape(f"{big // 10:,} pending", (Segment(TASK_A, big // 10),), peers=True),
        Shape(f"{big:,} pending", (Segment(TASK_A, big),), peers=True),
        Shape(
            f"{big:,} pending, {big - rest:,} of one hot queue_id ahead",
            (Segment(TASK_A, big - rest, keyed=True), Segment(TASK_A, rest)),
        ),
        Shape(
            f"{big:,} of another task ahead of {small:,} of task a",
            (Segment(TASK_B, big), Segment(TASK_A, small)),
        ),
        Shape(f"{big:,} pending + {history:,} history", (Segment(TASK_A, big),), history=history),
    )


@dataclass(frozen=True)
class BacklogConfig:
    """The shapes (``big`` pending, ``history`` finished jobs) and claims per figure."""

    big: int = 1_000_000
    history: int = 1_000_000
    claims: int = 50
    #: A figure stops after this many seconds of claims (at least 3 claims).
    budget_s: float = 20.0
    pgqueuer: bool = True
    protocols: Sequence[str] = PROTOCOLS
    shapes: tuple[Shape, ...] = field(default=())

    def all_shapes(self) -> tuple[Shape, ...]:
        """The configured shapes, or the default ones for ``big`` and ``history``."""
        return self.shapes or shapes(self.big, self.history)


def claim_params(task: str, *, limit: int | None = None) -> dict[str, Any]:
    """The parameters a worker for ``task`` sends with its claim (batch of :data:`BATCH`)."""
    params: dict[str, Any] = {
        "tasks": [task],
        "batch": BATCH,
        "worker": uuid.uuid4(),
        "lease": float(app.queue.lost_interval),
        "lease_map": "{}",
    }
    if limit is not None:
        params["limit_map"] = json.dumps({task: limit})
        params["seat_offset"] = 12345
    return params


def compiled_claim(
    db: BenchDatabase, task: str, *, limit: int | None = None
) -> tuple[str, dict[str, Any]]:
    """sqla_queue's claim for a worker of ``task`` as SQL text, and its parameters.

    ``limit``: the task's concurrency limit (the slot-aware claim), else the plain claim.
    The batch size is rendered into the text at execution time, as the worker does.
    """
    assert db.engine is not None
    statement = claim_statement(app.queue.tables, limited=limit is not None)
    params = claim_params(task, limit=limit)
    compiled = statement.compile(dialect=db.engine.dialect)
    state = compiled.construct_expanded_state(params)
    return state.statement, dict(state.parameters)


def guard_sql(db: BenchDatabase) -> str:
    """The planner guard the worker runs first in each of its transactions, as SQL."""
    assert db.engine is not None
    return str(planner_guard(generic_plans=True).compile(dialect=db.engine.dialect))


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


def top_up(
    db: BenchDatabase, pending: int, history: int, *, pgqueuer: bool, protocol: str = "warm"
) -> float:
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
    db.settle(ALL_TABLES, protocol)
    return time.perf_counter() - start


# -- seeding of the shapes ----------------------------------------------------------------------


def _template(db: BenchDatabase, task: str, keyed: bool) -> int:
    """Enqueue the template of a segment through the public API; the id of the row to clone.

    For a hot key, two jobs of the key: the first is the key's head, the second the model
    of every later job of the key (its execution's state is the schema's business).
    """
    handle = app.queue.get_task(task)
    if keyed:
        handle = handle.options(queue_id="hot")
    assert db.engine is not None
    with Session(db.engine) as session, session.begin():
        ids = app.queue.enqueue_many(session, [handle.call(n=0) for _ in range(2 if keyed else 1)])
    assert isinstance(ids, list)
    return int(ids[-1])


def _clone_sql() -> str:
    """INSERT ... SELECT generate_series cloning a template job and its execution.

    Every column is copied from the template but the id, the payload, the times and the
    task; the clones' due times are ``%(base)s`` plus ``g`` microseconds.
    """
    tables = app.queue.tables
    own = {
        "payload": "jsonb_build_object('args', '[]'::jsonb, 'kwargs', jsonb_build_object('n', g))",
        "scheduled_at": "%(base)s::timestamptz + g * interval '1 microsecond'",
        "created_at": "now()",
        "task": "%(task)s",
    }
    job_cols = [c.name for c in tables.jobs.columns if c.name != "id"]
    job_values = [own.get(c, f"t.{c}") for c in job_cols]
    ex_cols = [c.name for c in tables.executions.columns]
    ex_own = {"id": "j.id", "execute_at": "j.scheduled_at", "task": "%(task)s"}
    ex_values = [ex_own.get(c, f"x.{c}") for c in ex_cols]
    return (
        f"WITH j AS (INSERT INTO {tables.jobs.name} ({', '.join(job_cols)}) "
        f"SELECT {', '.join(job_values)} FROM {tables.jobs.name} t, "
        "generate_series(%(lo)s::bigint, %(hi)s::bigint) g WHERE t.id = %(template)s "
        "RETURNING id, scheduled_at) "
        f"INSERT INTO {tables.executions.name} ({', '.join(ex_cols)}) "
        f"SELECT {', '.join(ex_values)} FROM j, {tables.executions.name} x "
        "WHERE x.id = %(template)s"
    )


def seed_shape(db: BenchDatabase, shape: Shape, *, pgqueuer: bool) -> float:
    """Fresh tables analyzed empty, then ``shape``'s rows; returns the seconds it took.

    Segment ``i`` is due from two hours ago plus ``i`` minutes, so segments come in claim
    order; the template rows are moved to the start of their segment.
    """
    start = time.perf_counter()
    db.fresh_tables()
    tables = app.queue.tables
    clone = _clone_sql()
    with db.connect() as conn:
        base_row = conn.execute("SELECT now() - interval '2 hours'").fetchone()
        assert base_row is not None
        origin: dt.datetime = base_row[0]
        for i, seg in enumerate(shape.segments):
            base = origin + dt.timedelta(minutes=i)
            template = _template(db, seg.task, seg.keyed)
            # The template jobs (for a key, its head too) go to the start of the segment.
            ids = f"SELECT id FROM {tables.jobs.name} WHERE id >= %(t)s - %(k)s AND id <= %(t)s"
            k = 1 if seg.keyed else 0
            conn.execute(
                f"UPDATE {tables.jobs.name} SET scheduled_at = %(at)s WHERE id IN ({ids})",
                {"at": base, "t": template, "k": k},
            )
            conn.execute(
                f"UPDATE {tables.executions.name} SET execute_at = %(at)s + "
                f"(id - %(t)s + %(k)s) * interval '1 microsecond' WHERE id IN ({ids})",
                {"at": base, "t": template, "k": k},
            )
            made = k + 1
            for lo in range(made + 1, seg.count + 1, SEED_CHUNK):
                hi = min(seg.count, lo + SEED_CHUNK - 1)
                conn.execute(
                    clone,
                    {"base": base, "task": seg.task, "lo": lo, "hi": hi, "template": template},
                )
            if pgqueuer and shape.peers:
                _seed(conn, PENDING_PGQ, seg.task, seg.count)
        _seed(conn, HISTORY_SQLA, TASK_A, shape.history)
    return time.perf_counter() - start


# -- timing -----------------------------------------------------------------------------------


def time_claims(
    db: BenchDatabase,
    sql: str,
    params: dict[str, Any],
    claims: int,
    *,
    guard: bool = True,
    budget_s: float = 20.0,
) -> list[float]:
    """Milliseconds of up to ``claims`` claims, each in a transaction rolled back after it.

    With ``guard`` (sqla_queue's claim), each transaction opens with the worker's planner
    guard and the claim runs as a statement prepared on the server once (``PREPARE``), as a
    worker's runs after its fifth use. psycopg's own ``prepare=True`` would not do here: it
    forgets its prepared statements at every rollback, so each timed claim would be
    planned again, which a worker's committed claims never are. Without ``guard`` (the
    bare loop's claim) the statement is sent as the bare loop sends it. The first
    :data:`WARM_UP` runs are not counted; the run stops after ``budget_s`` seconds once
    three claims are counted.
    """
    times: list[float] = []
    guard_text = guard_sql(db)
    deadline = time.monotonic() + budget_s
    with psycopg.connect(db.dsn) as conn:
        query: Any = sql
        args: dict[str, Any] | None = params
        if guard:
            query, args = _prepared(conn, "bench_timed_claim", sql, params), None
            conn.commit()
        for i in range(claims + WARM_UP):
            if guard:
                conn.execute(guard_text)
            start = time.perf_counter()
            conn.execute(query, args).fetchall()
            elapsed = time.perf_counter() - start
            conn.rollback()
            if i >= WARM_UP or (i >= 1 and time.monotonic() > deadline):
                times.append(1000 * elapsed)
            if len(times) >= 3 and time.monotonic() > deadline:
                break
    return times


def _prepared(
    conn: psycopg.Connection[Any], name: str, sql: str, params: dict[str, Any]
) -> psycopg.sql.Composed:
    """PREPARE ``sql`` (``%(name)s`` parameters) as ``name``; the EXECUTE that runs it.

    The values go into the EXECUTE as literals: it cannot infer the type of a bound array.
    """
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    # The pyformat text doubles a literal %: PREPARE takes it once (the limited claim's
    # modulo of the seat offset).
    prepared = re.sub(r"%\((\w+)\)s", number, sql).replace("%%", "%")
    conn.execute(f"PREPARE {name} AS {prepared}")
    values = psycopg.sql.SQL(", ").join(psycopg.sql.Literal(params[n]) for n in names)
    return psycopg.sql.SQL("EXECUTE {}({})").format(psycopg.sql.Identifier(name), values)


def time_pgqueuer_claims(
    db: BenchDatabase, claims: int, task: str = TASK_A, budget_s: float = 20.0
) -> list[float]:
    """Milliseconds of PgQueuer's dequeue statement (no limits), each rolled back."""
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueEntrypoint, QueueManagerId

    async def main() -> list[float]:
        conn = await asyncpg.connect(db.dsn)
        queries = Queries(AsyncpgDriver(conn))
        query = queries.qbq.build_dequeue_query(
            batch_size=BATCH,
            entrypoints=[QueueEntrypoint(task)],
            concurrency_limits=[0],
            queue_manager_id=QueueManagerId(uuid.uuid4()),
            global_concurrency_limit=None,
            heartbeat_timeout=dt.timedelta(seconds=30),
        )
        times: list[float] = []
        deadline = time.monotonic() + budget_s
        for i in range(claims + WARM_UP):
            tx = conn.transaction()
            await tx.start()
            start = time.perf_counter()
            await conn.fetch(query.sql, *query.args)
            elapsed = time.perf_counter() - start
            await tx.rollback()
            if i >= WARM_UP or (i >= 1 and time.monotonic() > deadline):
                times.append(1000 * elapsed)
            if len(times) >= 3 and time.monotonic() > deadline:
                break
        await conn.close()
        return times

    return asyncio.run(main())


def explain_claim(db: BenchDatabase, sql: str, params: dict[str, Any]) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim's generic plan under the guard, rolled back.

    The claim is PREPAREd with ``$n`` parameters, as psycopg prepares it for the worker,
    and EXPLAINed as an EXECUTE after the planner guard, so the plan shown is the generic
    plan a worker runs.
    """
    with psycopg.connect(db.dsn) as conn:
        conn.execute(guard_sql(db))
        execute = _prepared(conn, "bench_claim", sql, params)
        query = psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS) {}").format(execute)
        rows = conn.execute(query).fetchall()
        conn.rollback()
    return [str(r[0]) for r in rows]


def seq_scans(plan: Sequence[str]) -> list[str]:
    """Plan lines that scan one of sqla_queue's tables sequentially."""
    return [
        line.strip()
        for line in plan
        if "Seq Scan on sqla_queue_job" in line or "Seq Scan on sqla_queue_jobs" in line
    ]


def _p50(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_backlog(db: BenchDatabase, config: BacklogConfig, log: Any = print) -> dict[str, Any]:
    """Claim cost for every shape, cold (statistics of the empty tables) beside warm."""
    all_shapes = config.all_shapes()
    bare_params = {"tasks": [TASK_A], "batch": BATCH, "worker": uuid.uuid4()}
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    planner: dict[str, dict[str, float]] = {}
    plans: dict[str, list[str]] = {}
    largest = max((s for s in all_shapes if s.peers), key=lambda s: s.pending)
    for shape in all_shapes:
        seconds = seed_shape(db, shape, pgqueuer=config.pgqueuer)
        log(f"  backlog {shape.name}: seeded in {seconds:.1f}s")
        sql, params = compiled_claim(db, TASK_A)
        results[shape.name] = {}
        planner[shape.name] = {}
        for protocol in config.protocols:
            db.settle(ALL_TABLES, protocol)
            rows = db.planner_rows(["sqla_queue_job_executions"])
            planner[shape.name][protocol] = rows.get("sqla_queue_job_executions", float("nan"))
            level = {"sqla": time_claims(db, sql, params, config.claims, budget_s=config.budget_s)}
            if shape.peers:
                level["bare"] = time_claims(
                    db, baseline.CLAIM, bare_params, config.claims, guard=False
                )
                if config.pgqueuer:
                    level["pgqueuer"] = time_pgqueuer_claims(db, config.claims)
            results[shape.name][protocol] = level
            if protocol == "cold" and (shape is largest or shape.history or not shape.peers):
                plans[shape.name] = explain_claim(db, sql, params)
            log(
                f"  backlog {shape.name} {protocol} (planner rows "
                f"{planner[shape.name][protocol]:,.0f}): "
                + ", ".join(f"{k} median {_p50(v):.2f} ms of {len(v)}" for k, v in level.items())
            )
    return _backlog_report(config, all_shapes, results, planner, plans, largest)


def _backlog_report(
    config: BacklogConfig,
    all_shapes: Sequence[Shape],
    results: dict[str, dict[str, dict[str, list[float]]]],
    planner: dict[str, dict[str, float]],
    plans: dict[str, list[str]],
    largest: Shape,
) -> dict[str, Any]:
    protocols = list(config.protocols)
    first = all_shapes[0].name
    headers = ["backlog"]
    for i, protocol in enumerate(protocols):
        name = f"{protocol} (default)" if i == 0 and protocol == "cold" else protocol
        headers += [
            f"{name} sqla_queue",
            f"{protocol} bare SQL",
            f"{protocol} PgQueuer",
            f"{protocol} vs {first}",
        ]
    table = TextTable(
        f"Backlog: one claim of {BATCH} (ms, median of up to {config.claims} claims, each "
        "rolled back; planner guard, prepared), "
        + " beside ".join(f"{p} protocol" for p in protocols),
        headers,
    )
    summary: dict[str, Any] = {}
    for shape in all_shapes:
        row: list[str] = [shape.name]
        entry: dict[str, Any] = {
            "pending": shape.pending,
            "history": shape.history,
            "large": shape.pending >= config.big,
        }
        for protocol in protocols:
            level = results[shape.name].get(protocol, {})
            base = _p50(results[first].get(protocol, {}).get("sqla", []))
            med = {k: _p50(v) for k, v in level.items()}
            row += [
                f"{med['sqla']:.2f}" if "sqla" in med else "-",
                f"{med['bare']:.2f}" if "bare" in med else "-",
                f"{med['pgqueuer']:.2f}" if "pgqueuer" in med else "-",
                fmt_ratio(ratio(med.get("sqla", float("nan")), base)),
            ]
            entry[protocol] = {
                k: summarize(v).as_json() | {"p95": percentile(v, 95)} for k, v in level.items()
            } | {
                "vs_first": ratio(med.get("sqla", float("nan")), base),
                "planner_rows": planner[shape.name].get(protocol),
            }
        table.add(*row)
        summary[shape.name] = entry
    scans = {name: seq_scans(plan) for name, plan in plans.items()}
    table.note(
        "Ratios above 1.00x are slower than the first level. cold: tables analyzed while "
        "empty, then seeded, no ANALYZE; warm: the same rows after VACUUM ANALYZE. The bare "
        "claim runs without the guard, as the bare loop does. Sequential scans of "
        f"sqla_queue's tables in the cold claim plans: "
        f"{ {k: v for k, v in scans.items() if v} or 'none' }"
    )
    return {
        "tables": [table],
        "summary": summary,
        "plan": plans.get(largest.name, []),
        "plans": plans,
        "largest": largest.name,
        "seq_scans": [line for v in scans.values() for line in v],
        "protocols": protocols,
        "first": first,
    }


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
    protocol: str = "cold"


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
        db.fresh_tables()
        with db.connect() as conn:
            _seed(conn, PENDING_SQLA, task, config.backlog)
        db.settle(ALL_TABLES, config.protocol)
        sql, params = compiled_claim(db, task, limit=limit or None)
        times = time_claims(db, sql, params, config.claims)
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
                        db,
                        system,
                        config.workers,
                        BATCH,
                        config.jobs,
                        task=task,
                        limit=limit,
                        protocol=config.protocol,
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
