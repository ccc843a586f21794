"""The durable-execution benchmark: steps, a signal's round trip, and what a suspended
job costs the claim; beside DBOS Transact.

    python -m bench.durable            # about 2 to 3 minutes, DBOS included
    python -m bench.durable --quick    # about a minute
    python -m bench.durable --no-peers --suspended 10000

It creates a scratch database (``sqlaq_bench_<pid>_<hex>``, as :mod:`bench.run` does) and,
for DBOS, a second one (``..._dbos``, its system database), drops both at the end, and
prints two tables:

1. **Steps**: a job of ``--steps`` steps (``ctx.run_step``), each writing one row through
   ``ctx.session`` that commits with the step's checkpoint. (a) ``--step-jobs`` such jobs
   one at a time on an idle worker: steps per second within one job, from the handler's
   first line to its last step's commit (median over the jobs). (b) ``--jobs`` of them
   drained by one worker process of concurrency ``--concurrency``: jobs/s from the first
   job's start to the last job's last step.
2. **Signal round trip**: a job waits in ``ctx.wait_for_signal("go")`` (suspended: it holds
   no worker); the benchmark sends ``queue.signal(...)`` and commits; the figure is from
   that commit to the start of the job's next step (``ctx.run_step("after", time.time)``),
   p50 and p99 over ``--round-trips``. The commit moment is marked as in
   :mod:`bench.workflows`: a *deferred* constraint trigger on the signals table records
   ``clock_timestamp()`` inside ``COMMIT``, so the figure includes the commit's WAL flush
   (pessimistic by that much, never optimistic). DBOS's ``DBOS.send`` is marked the same
   way, on its notifications table.
3. **A suspended job costs nothing per claim**: the claim (batch 10, a worker serving the
   sleeping jobs' task too, timed as :mod:`bench.backlog` times it) and a plain drain of
   ``--drain-jobs`` no-op jobs (one worker process of concurrency ``--concurrency``), with
   no suspended job and with ``--suspended`` sleeping ones present (clones of one job that
   really went to sleep, with its execution and its wait's checkpoint). The tables are
   ``VACUUM ANALYZE``d before each measurement; rounds alternate their order. The target:
   the claim and the drain change by less than 10%.

DBOS (:mod:`bench.durable_peers`) runs shapes 1 and 2 in a process of its own; the
benchmark installs it when it is missing (``--no-install`` to refuse), and a DBOS that
cannot be installed or run is reported as such while sqla_queue's figures are printed.
Figures move with the machine's load: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from bench import app, backlog, durable_peers
from bench import durable_tasks as dt
from bench.common import (
    BenchDatabase,
    TextTable,
    WorkerProcess,
    load_average,
    percentile,
    ratio,
    resolve_server_url,
)
from bench.workflows import same_host, stop_workers
from sqla_queue.statements import claim_statement

__all__ = [
    "QUICK",
    "DurableConfig",
    "cost_verdict",
    "main",
    "run_durable",
    "signal_latencies",
    "span_rate",
    "steps_per_second",
]

queue = app.queue

#: Seconds a drain may take before the run gives up.
DRAIN_TIMEOUT = 300.0
#: How often the drains look for their last completion.
POLL_S = 0.02
#: Warm-up jobs or round trips, not counted.
WARM_UP = 3
#: The bound of section 3: a suspended backlog changes the claim and the drain by less.
COST_BOUND = 0.10


@dataclass(frozen=True)
class DurableConfig:
    """The sizes of one run."""

    steps: int = 10
    step_jobs: int = 30
    jobs: int = 300
    concurrency: int = 10
    round_trips: int = 200
    suspended: int = 100_000
    drain_jobs: int = 5_000
    claims: int = 50
    repeat: int = 2
    peers: bool = True
    install: bool = True


#: ``--quick``: fewer of everything but the suspended backlog.
QUICK = DurableConfig(step_jobs=10, jobs=100, round_trips=50, drain_jobs=2_000, repeat=1)


# -- figures (pure) ---------------------------------------------------------------------------


def steps_per_second(results: Iterable[Mapping[str, float]], steps: int) -> list[float]:
    """Steps per second of each job, from its ``began`` to its ``ended`` (epoch seconds)."""
    out = []
    for r in results:
        took = r["ended"] - r["began"]
        if took <= 0:
            raise ValueError(f"a job that ended before it began: {r}")
        out.append(steps / took)
    return out


def span_rate(results: Sequence[Mapping[str, float]]) -> float:
    """Jobs per second from the first job's ``began`` to the last job's ``ended``."""
    if not results:
        raise ValueError("no job to time")
    span = max(r["ended"] for r in results) - min(r["began"] for r in results)
    return len(results) / span if span > 0 else math.nan


def signal_latencies(starts: Mapping[Any, float], marks: Mapping[Any, float]) -> list[float]:
    """Milliseconds from each signal's commit mark to its receiver's next step (both epoch
    seconds, by receiver), in the order of ``starts``; a receiver without a mark is an error."""
    missing = [k for k in starts if k not in marks]
    if missing:
        raise ValueError(f"no commit mark for {missing[:5]}")
    return [1000 * (at - marks[k]) for k, at in starts.items()]


def cost_verdict(claim_ratio: float, drain_ratio: float, bound: float = COST_BOUND) -> str:
    """``met`` when the claim (time, with/without) and the drain (rate) move by less than
    ``bound``; ``not measured`` if either is missing."""
    if math.isnan(claim_ratio) or math.isnan(drain_ratio):
        return "not measured"
    ok = claim_ratio < 1 + bound and drain_ratio > 1 - bound
    return "met" if ok else "NOT met"


def fmt_ms(values: Sequence[float]) -> str:
    """``p50 / p99`` of millisecond values."""
    if not values:
        return "-"
    return f"{percentile(values, 50):.1f} / {percentile(values, 99):.1f}"


def fmt_x(value: float) -> str:
    """A ratio as ``1.23x`` (``-`` when missing)."""
    return "-" if math.isnan(value) else f"{value:.2f}x"


# -- the scratch database ---------------------------------------------------------------------


def reset(db: BenchDatabase) -> None:
    """Empty the queue's tables, the steps' writes and the marks."""
    t = queue.tables
    names = [t.job_signals, t.job_steps, t.executions, t.jobs]
    with db.connect() as conn:
        conn.execute(dt.WRITES_DDL)
        conn.execute(
            f"TRUNCATE {', '.join(x.fullname for x in names)}, bench_durable_writes "
            "RESTART IDENTITY CASCADE"
        )
        conn.execute(f"DROP TRIGGER IF EXISTS bench_mark_signal ON {t.job_signals.fullname}")
        conn.execute("DROP TABLE IF EXISTS bench_signal_marks")


def settle(db: BenchDatabase) -> None:
    """VACUUM ANALYZE the queue's tables, then CHECKPOINT."""
    t = queue.tables
    with db.connect() as conn:
        for table in (t.jobs, t.executions, t.job_steps):
            conn.execute(f"VACUUM ANALYZE {table.fullname}")
        conn.execute("CHECKPOINT")


def enqueue(db: BenchDatabase, task: str, n: int, **kwargs: Any) -> list[int]:
    """``n`` jobs of ``task`` in one transaction; their ids."""
    assert db.engine is not None
    handle = queue.get_task(task)
    with Session(db.engine) as session, session.begin():
        ids = queue.enqueue_many(session, [handle.call(**kwargs) for _ in range(n)])
    assert isinstance(ids, list)
    return [int(i) for i in ids]


def start_worker(db: BenchDatabase, concurrency: int, *, go: bool = True) -> WorkerProcess:
    """One durable worker process, past its set-up; released unless ``go`` is false."""
    command = (sys.executable, "-m", "bench.durable_tasks")
    args = ["--url", db.url, "--concurrency", str(concurrency), "--poll-interval", "1"]
    proc = WorkerProcess(args, command=command)
    try:
        proc.wait_ready()
    except BaseException:
        proc.kill()
        raise
    if go:
        proc.go()
    return proc


def wait_done(db: BenchDatabase, ids: Sequence[int], what: str) -> None:
    """Block until every job of ``ids`` succeeded."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    with db.connect() as conn:
        while True:
            row = conn.execute(
                f"SELECT count(*) FROM {queue.tables.jobs.fullname} "
                "WHERE id = ANY(%s) AND status = 'succeeded'",
                (list(ids),),
            ).fetchone()
            assert row is not None
            if int(row[0]) >= len(ids):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {row[0]} of {len(ids)} jobs done in time")
            time.sleep(POLL_S)


def results(db: BenchDatabase, ids: Sequence[int]) -> dict[int, Any]:
    """The results of ``ids``, by id."""
    jobs = queue.tables.jobs
    with db.connect() as conn:
        rows = conn.execute(
            f"SELECT id, result FROM {jobs.fullname} WHERE id = ANY(%s)", (list(ids),)
        ).fetchall()
    return {int(k): v for k, v in rows}


# -- 1. steps ---------------------------------------------------------------------------------


def one_job_steps(db: BenchDatabase, config: DurableConfig) -> list[float]:
    """Steps/s within each of ``step_jobs`` jobs run one at a time (warm-up jobs left out)."""
    reset(db)
    ids = enqueue(db, dt.STEPS, WARM_UP + config.step_jobs, count=config.steps)
    proc = start_worker(db, 1)
    try:
        wait_done(db, ids, "one job at a time")
    finally:
        stop_workers([proc])
    got = results(db, ids)
    return steps_per_second([got[i] for i in ids[WARM_UP:]], config.steps)


def steps_drain(db: BenchDatabase, config: DurableConfig) -> float:
    """Jobs/s of ``jobs`` step jobs drained by one worker of ``concurrency``."""
    reset(db)
    ids = enqueue(db, dt.STEPS, config.jobs, count=config.steps)
    settle(db)
    proc = start_worker(db, config.concurrency)
    try:
        wait_done(db, ids, "step drain")
    finally:
        stop_workers([proc])
    with db.connect() as conn:
        row = conn.execute("SELECT count(*) FROM bench_durable_writes").fetchone()
    assert row is not None
    if int(row[0]) != config.jobs * config.steps:
        raise RuntimeError(f"{row[0]} step writes, {config.jobs * config.steps} expected")
    got = results(db, ids)
    return span_rate([got[i] for i in ids])


# -- 2. signal round trip ---------------------------------------------------------------------


def signal_round_trips(db: BenchDatabase, config: DurableConfig) -> dict[str, list[float]]:
    """Milliseconds from each signal's commit (and from the call that sends it) to the
    waiting job's next step."""
    assert db.engine is not None
    reset(db)
    with db.connect() as conn:
        conn.execute(durable_peers.marks_ddl(queue.tables.job_signals.fullname, "job_id"))
    starts: dict[str, float] = {}
    calls: dict[str, float] = {}
    proc = start_worker(db, config.concurrency)
    try:
        time.sleep(0.5)  # the worker LISTENs and settles into its idle wait
        with db.connect() as conn:
            for i in range(WARM_UP + config.round_trips):
                (job,) = enqueue(db, dt.SIGNAL, 1)
                _wait_suspended(conn, job)
                called = time.time()
                with Session(db.engine) as session:
                    queue.signal(session, job, dt.GO)
                    session.commit()
                at = queue.result(db.engine, job, timeout=30)
                assert isinstance(at, float)
                if i >= WARM_UP:
                    starts[str(job)] = at
                    calls[str(job)] = called
    finally:
        stop_workers([proc])
    with db.connect() as conn:
        marks = {str(k): float(v) for k, v in conn.execute(durable_peers.MARKS_READ)}
    return {
        "signal_ms": signal_latencies(starts, marks),
        "signal_from_call_ms": [1000 * (at - calls[k]) for k, at in starts.items()],
    }


def _wait_suspended(conn: Any, job: int) -> None:
    ex = queue.tables.executions.fullname
    deadline = time.monotonic() + 30
    while True:
        row = conn.execute(f"SELECT state FROM {ex} WHERE id = %s", (job,)).fetchone()
        if row is not None and row[0] == "suspended":
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job} did not suspend: {row}")
        time.sleep(0.002)


# -- 3. suspended jobs and the claim ----------------------------------------------------------


def _clone_sql(table: Any, own: Mapping[str, str]) -> tuple[list[str], list[str]]:
    cols = [c.name for c in table.columns if c.name not in own or own[c.name]]
    return cols, [own.get(c, f"t.{c}") for c in cols]


def seed_suspended(db: BenchDatabase, count: int) -> int:
    """``count`` sleeping jobs: one sent to sleep by a worker, the rest its clones (job,
    execution and checkpoint rows). Returns how many executions are suspended."""
    assert db.engine is not None
    (template,) = enqueue(db, dt.SLEEPER, 1)
    worker = queue.worker(sessionmaker(db.engine), concurrency=1, tasks=[dt.SLEEPER])
    worker.run(burst=True)
    t = queue.tables
    seq = t.job_steps.c.get("seq")
    skip_seq = seq is not None and (seq.server_default is not None or seq.identity is not None)
    job_cols, job_vals = _clone_sql(t.jobs, {"id": "", "created_at": "now()"})
    ex_cols, ex_vals = _clone_sql(t.executions, {"id": "j.id"})
    st_own = {"job_id": "j.id", **({"seq": ""} if skip_seq else {})}
    st_cols, st_vals = _clone_sql(t.job_steps, st_own)
    sql = (
        f"WITH j AS (INSERT INTO {t.jobs.fullname} ({', '.join(job_cols)}) "
        f"SELECT {', '.join(job_vals)} FROM {t.jobs.fullname} t, generate_series(1, %(n)s) g "
        "WHERE t.id = %(template)s RETURNING id), "
        f"x AS (INSERT INTO {t.executions.fullname} ({', '.join(ex_cols)}) "
        f"SELECT {', '.join(ex_vals)} FROM j, {t.executions.fullname} t "
        "WHERE t.id = %(template)s) "
        f"INSERT INTO {t.job_steps.fullname} ({', '.join(st_cols)}) "
        f"SELECT {', '.join(st_vals)} FROM j, {t.job_steps.fullname} t "
        "WHERE t.job_id = %(template)s"
    )
    with db.connect() as conn:
        conn.execute(sql, {"n": count - 1, "template": template})
        row = conn.execute(
            f"SELECT count(*) FROM {t.executions.fullname} WHERE state = 'suspended'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def claim_ms(db: BenchDatabase, claims: int) -> list[float]:
    """Milliseconds of the claim of a worker serving the no-op and the sleeping task."""
    assert db.engine is not None
    params = backlog.claim_params(app.NOOP)
    params["tasks"] = [app.NOOP, dt.SLEEPER]
    compiled = claim_statement(queue.tables).compile(dialect=db.engine.dialect)
    state = compiled.construct_expanded_state(params)
    return backlog.time_claims(db, state.statement, dict(state.parameters), claims)


def plain_drain(db: BenchDatabase, ids: Sequence[int], concurrency: int) -> float:
    """Jobs/s of the drain of the no-op jobs ``ids``, from the start barrier to the last
    ``finished_at``."""
    proc = start_worker(db, concurrency, go=False)
    with db.connect() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    t0 = row[0]
    proc.go()
    try:
        wait_done(db, ids, "plain drain")
    finally:
        stop_workers([proc])
    with db.connect() as conn:
        row = conn.execute(
            f"SELECT max(finished_at) FROM {queue.tables.jobs.fullname} WHERE id = ANY(%s)",
            (list(ids),),
        ).fetchone()
    assert row is not None
    return float(len(ids) / (row[0] - t0).total_seconds())


def suspended_cost(
    db: BenchDatabase, config: DurableConfig, log: Callable[[str], object]
) -> dict[str, Any]:
    """Claim p50 and drain rate with no suspended job and with ``suspended`` of them, in
    ``repeat`` rounds of alternating order; the paired ratios."""
    runs: dict[str, list[dict[str, float]]] = {"none": [], "suspended": []}
    for rnd in range(config.repeat):
        for kind in ("none", "suspended") if rnd % 2 == 0 else ("suspended", "none"):
            reset(db)
            present = seed_suspended(db, config.suspended) if kind == "suspended" else 0
            ids = enqueue(db, app.NOOP, config.drain_jobs)
            settle(db)
            # Each timed claim is rolled back: the drain then starts from the same rows.
            claim = statistics.median(claim_ms(db, config.claims))
            rate = plain_drain(db, ids, config.concurrency)
            runs[kind].append({"claim_ms": claim, "rate": rate, "present": present})
            log(f"  {present:>7,} suspended: claim {claim:.2f} ms, drain {rate:,.0f} jobs/s")
    pairs = list(zip(runs["suspended"], runs["none"], strict=True))
    out: dict[str, Any] = {"runs": runs}
    out["claim_ratio"] = statistics.median(s["claim_ms"] / n["claim_ms"] for s, n in pairs)
    out["drain_ratio"] = statistics.median(s["rate"] / n["rate"] for s, n in pairs)
    for kind, done in runs.items():
        out[f"{kind}_claim_ms"] = statistics.median(r["claim_ms"] for r in done)
        out[f"{kind}_rate"] = statistics.median(r["rate"] for r in done)
    out["verdict"] = cost_verdict(out["claim_ratio"], out["drain_ratio"])
    return out


# -- the run ----------------------------------------------------------------------------------


def run_durable(
    db: BenchDatabase, config: DurableConfig, log: Callable[[str], object] = print
) -> dict[str, Any]:
    """Every measurement of sqla_queue, then DBOS's; the figures and the tables."""
    figures: dict[str, Any] = {"config": asdict(config)}
    one = one_job_steps(db, config)
    figures["one_job_steps_per_s"] = one
    figures["median_one_job_steps_per_s"] = statistics.median(one)
    log(f"  one job: {figures['median_one_job_steps_per_s']:,.0f} steps/s (median)")
    figures["drain_jobs_per_s"] = statistics.median(
        steps_drain(db, config) for _ in range(config.repeat)
    )
    log(f"  drain: {figures['drain_jobs_per_s']:,.0f} jobs/s of {config.steps} steps")
    figures.update(signal_round_trips(db, config))
    log(f"  signal round trip: p50/p99 {fmt_ms(figures['signal_ms'])} ms")
    figures["suspended_cost"] = suspended_cost(db, config, log)
    figures["dbos"] = run_peer(db, config, log) if config.peers else {"skipped": "--no-peers"}
    return {"figures": figures, "tables": tables_of(figures, config)}


def run_peer(
    db: BenchDatabase, config: DurableConfig, log: Callable[[str], object]
) -> dict[str, Any]:
    """DBOS's figures, or ``{"skipped": reason}``: the peer never fails the run."""
    options = {
        "steps": config.steps,
        "step_jobs": config.step_jobs,
        "jobs": config.jobs,
        "concurrency": config.concurrency,
        "round_trips": config.round_trips,
    }
    try:
        got = durable_peers.run_dbos(
            db.server_url, f"{db.name}_dbos", options, install=config.install, log=log
        )
    except durable_peers.DbosUnavailable as exc:
        log(f"  DBOS: skipped: {exc}")
        return {"skipped": str(exc)}
    except Exception as exc:  # a peer's failure is reported, never fatal
        log(f"  DBOS: failed: {type(exc).__name__}: {exc}")
        return {"skipped": f"failed: {type(exc).__name__}: {str(exc)[:400]}"}
    log(f"  DBOS {got['version']}: done")
    return got


def _p(values: Sequence[float] | None, pct: float) -> float:
    return percentile(values, pct) if values else math.nan


def tables_of(figures: Mapping[str, Any], config: DurableConfig) -> list[TextTable]:
    """The side-by-side table (sqla_queue, DBOS, their ratio) and the claim-cost table."""
    peer = figures.get("dbos", {})
    skipped = "skipped" in peer
    label = f"DBOS {peer.get('version', '')}".strip()
    side = TextTable(
        "Durable execution: sqla_queue beside DBOS Transact",
        ["shape", "sqla_queue", label, "sqla_queue vs DBOS"],
    )
    # (label, figure, percentile): a rate (higher is better) without one, else milliseconds.
    rows: list[tuple[str, str, float | None]] = [
        (f"1a. one job of {config.steps} steps: steps/s", "median_one_job_steps_per_s", None),
        (
            f"1b. {config.jobs} such jobs, 1 x {config.concurrency}: jobs/s",
            "drain_jobs_per_s",
            None,
        ),
        (f"2. signal commit to next step, p50 (ms), {config.round_trips} trips", "signal_ms", 50),
        ("   p99 (ms)", "signal_ms", 99),
        ("   from the send call, p50 (ms)", "signal_from_call_ms", 50),
    ]
    for name, key, pct in rows:
        fmt = ",.0f" if pct is None else ".1f"

        def read(v: Any, pct: float | None = pct) -> float:
            return float(v) if pct is None else _p(v, pct)

        ours = read(figures.get(key))
        theirs = math.nan if skipped or key not in peer else read(peer[key])
        better = ratio(ours, theirs) if pct is None else ratio(theirs, ours)
        cell = "skipped" if skipped else ("-" if math.isnan(theirs) else format(theirs, fmt))
        side.add(name, format(ours, fmt), cell, fmt_x(better))
    side.note("sqla_queue vs DBOS: above 1.00x, sqla_queue is better (faster or sooner)")
    if skipped:
        side.note(f"DBOS: skipped: {peer['skipped']}")
    cost = figures["suspended_cost"]
    n = f"{config.suspended:,}"
    claims = TextTable(
        "A suspended job costs nothing per claim",
        ["measure", "no suspended job", f"{n} sleeping", "ratio", "target", "verdict"],
    )
    claims.add(
        "claim, batch 10, p50 (ms)",
        f"{cost['none_claim_ms']:.2f}",
        f"{cost['suspended_claim_ms']:.2f}",
        fmt_x(cost["claim_ratio"]),
        "< 1.10x",
        "met" if cost["claim_ratio"] < 1 + COST_BOUND else "NOT met",
    )
    claims.add(
        f"drain of {config.drain_jobs:,} no-op jobs, 1 x {config.concurrency} (jobs/s)",
        f"{cost['none_rate']:,.0f}",
        f"{cost['suspended_rate']:,.0f}",
        fmt_x(cost["drain_ratio"]),
        "> 0.90x",
        "met" if cost["drain_ratio"] > 1 - COST_BOUND else "NOT met",
    )
    claims.note(f"ratios: median of {config.repeat} paired rounds; overall: {cost['verdict']}")
    return [side, claims]


# -- the command line -------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.durable", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--url", help="PostgreSQL server to use (any database on it)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    d = DurableConfig()
    # Every size of the configuration (its int fields) has an option of its own.
    for field_name in (f.name for f in fields(DurableConfig) if f.type == "int"):
        flag = "--" + field_name.replace("_", "-")
        parser.add_argument(flag, type=int, default=None, help=f"default {getattr(d, field_name)}")
    parser.add_argument("--no-peers", action="store_true", help="sqla_queue alone")
    parser.add_argument("--no-install", action="store_true", help="never pip install dbos")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--markdown", type=Path, help="write the tables as Markdown too")
    return parser.parse_args(argv)


def config_of(args: argparse.Namespace) -> DurableConfig:
    """The configuration the command line asks for (``--quick`` first, then each size)."""
    config = QUICK if args.quick else DurableConfig()
    sizes = {k: v for k, v in vars(args).items() if k in asdict(config) and v is not None}
    return replace(config, **sizes, peers=not args.no_peers, install=not args.no_install)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    args = parse_args(argv)
    config = config_of(args)
    server = resolve_server_url(args.url)
    if not same_host(server):
        print("warning: the server is not on this host: latencies mix two clocks")
    began = time.monotonic()
    print(f"load average at start: {load_average()}")
    with BenchDatabase(server, keep=args.keep) as db:
        result = run_durable(db, config)
    for table in result["tables"]:
        print(table.render())
    print(f"load average at end: {load_average()}; {time.monotonic() - began:.0f} s in all")
    if args.json:
        figures = dict(result["figures"], load_average_end=load_average())
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    if args.markdown:
        args.markdown.write_text("\n\n".join(t.markdown() for t in result["tables"]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
