"""Sustained load: producers enqueue at a fixed rate for a while, workers keep up (or not).

``python -m bench.sustained [--url URL] [--rates 1000,5000] [--seconds 60] [--workers 2]
[--concurrency 10] [--producers N] [--lanes 10] [--producer-nice 10]
[--synchronous-commit on|off] [--systems sqla-sync,sqla-async,pgqueuer,graphile,
graphile-batched] [--poll-interval 0.05] [--json PATH] [--keep]``

For each rate and each system: ``--workers`` worker processes of the system wait idle
(the ``idle`` role of :mod:`bench.worker`, or graphile-worker's Node worker, both with
``--concurrency``); then ``--producers`` producer processes (``produce-paced``; default
one per 1,000 jobs/s), each paced to its share of the rate, run business transactions
for ``--seconds``: one order row and one job per transaction, committed together,
through

* sqla_queue: a Session, ``session.add(Order(...))`` and ``task.enqueue(session, ...)``
  (synchronous ORM producers for every sqla_queue variant; the asyncio worker's task is
  an ``async def``);
* PgQueuer: asyncpg, the order row and ``Queries.enqueue`` in one transaction;
* graphile-worker: psycopg, the order row and ``graphile_worker.add_job`` in one
  transaction (``graphile-batched``: its worker with a local queue and batched
  completions, see ``bench/node/worker.mjs``).

``sqla-poll`` (not run by default) is sqla_queue's sync worker without NOTIFY: the
producers enqueue through ``Queue(notify=False)`` and the workers poll every
``--poll-interval`` seconds. It shows what the per-transaction NOTIFY costs: PostgreSQL
serializes the commits of notifying transactions on one lock (``Lock/object`` waits on
COMMIT in ``pg_stat_activity``), so with ``synchronous_commit = on`` every notifying
commit waits its turn for the WAL flush.

The i-th transaction of a producer is due at ``start + phase + i / rate`` (the producers'
phases interleave), so a late transaction does not push the later ones back; ``--lanes``
threads per producer (asyncio tasks for PgQueuer), one connection each, keep up to that
many transactions in flight. A producer that cannot keep up runs back to back and the
window closes after ``--seconds`` anyway: the table's *achieved* rate says what was
offered. Producers run at ``--producer-nice`` (default +19): on a small machine dozens
of producer threads would otherwise starve the workers of CPU and the latencies would
measure the scheduler (in production the producers run on other hosts).
Each producer records ``time.monotonic()`` right after each commit returns, keyed by the
job's key (producer index * 10**7 + i); each handler records ``time.monotonic()`` as it
starts (CLOCK_MONOTONIC is one clock for every process of the machine).
The price of the lower priority: a lane whose commit has returned may wait for the CPU
(and its process's GIL) before it stamps the time, so on a saturated machine the
latencies read low by up to a few milliseconds; negative ones are that error showing.

Reported per (system, rate), in one table per rate with ratios to sqla_queue sync:

* the achieved rate, and the enqueue-to-start latency (handler start - commit): p50,
  p90, p99, max;
* the backlog over time: a thread of the parent counts every 0.5 s the jobs not yet
  started (sqla_queue: executions in state pending; PgQueuer: rows of its queue table in
  status ``queued``; graphile-worker: jobs with no ``locked_at``, so jobs its batched
  worker holds in its local queue count as started). The summary gives the backlog at
  the start, the middle and the end of the production window, its maximum, the slope
  of a least-squares line through the second half of the window (jobs/s; about 0 when
  the workers keep up) and how long after the window the last job was finished; the
  JSON keeps the whole series, and the latency's p50/p99 per second of the window;
* the jobs completed, each checked to have started exactly once (sqla_queue: in its
  jobs table, succeeded with one attempt; PgQueuer: distinct job ids in its log;
  graphile-worker: the keys its workers reported, and an empty jobs table);
* the CPU time per job of the workers, of the producers, and of the server backends
  serving the scratch database (producers' and workers' backends together).

"No backlog growth" means: slope over the second half at most ``max(5, 1% of the
achieved rate)`` jobs/s and a backlog at the end of the window of at most a quarter
second of arrivals. The targets printed at the end (issue 28) are p99 <= 25 ms at
1,000/s and no backlog growth at 5,000/s, for sqla_queue's runs.

graphile-worker runs only when ``bench.node_peers`` can install it (npm); otherwise
its rows are skipped with the reason. Each run starts from freshly created tables
(the cold protocol of :meth:`~bench.common.BenchDatabase.fresh_tables`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import app
from bench.common import (
    ROOT,
    BackendCpuMeter,
    BenchDatabase,
    TextTable,
    WorkerProcess,
    fmt_ratio,
    machine_info,
    percentile,
    ratio,
    resolve_server_url,
)
from bench.worker import ASTAMP

__all__ = ["SYSTEMS", "SustainedConfig", "run_sustained"]

#: system -> (label, worker system, producer system)
SYSTEMS: dict[str, tuple[str, str, str]] = {
    "sqla-sync": ("sqla_queue sync", "sqla-sync", "sqla"),
    "sqla-async": ("sqla_queue async", "sqla-async", "sqla"),
    "sqla-poll": ("sqla_queue sync, poll only", "sqla-sync", "sqla"),
    "pgqueuer": ("PgQueuer", "pgqueuer", "pgqueuer"),
    "graphile": ("graphile-worker", "graphile", "graphile"),
    "graphile-batched": ("graphile-worker, batched", "graphile-batched", "graphile"),
}
GRAPHILE = ("graphile", "graphile-batched")
#: The task of graphile-worker's jobs (``bench/node/worker.mjs`` records their starts).
GRAPHILE_TASK = "noop"
#: The systems run by default (``sqla-poll`` is a lever: no NOTIFY, workers poll).
DEFAULT_SYSTEMS = ("sqla-sync", "sqla-async", "pgqueuer", "graphile", "graphile-batched")
#: Keys of producer p are ``p * KEY_STRIDE + i``.
KEY_STRIDE = 10**7
#: Business transactions per second one producer process is asked for at most: the
#: Python side of an ORM transaction costs a few hundred microseconds of CPU.
PER_PRODUCER = 1_000.0
QUEUE_TABLES = (
    "sqla_queue_jobs",
    "sqla_queue_job_executions",
    "pgqueuer",
    "pgqueuer_log",
    "pgqueuer_statistics",
    "bench_min_queue",
)


@dataclass(frozen=True)
class SustainedConfig:
    """Rates, window, worker processes and their concurrency, producers, systems."""

    rates: Sequence[float] = (1_000.0, 5_000.0)
    seconds: float = 60.0
    workers: int = 2
    concurrency: int = 10
    #: Producer processes per run; 0: ``ceil(rate / PER_PRODUCER)``.
    producers: int = 0
    #: Transactions each producer process keeps in flight at most (one connection each):
    #: with ``synchronous_commit = on`` one connection commits a few hundred times a
    #: second, bound by the WAL flush, not by the CPU.
    lanes: int = 10
    #: ``synchronous_commit`` of every producer and worker session: ``off`` takes the WAL
    #: flush out of each commit, so a slow disk does not cap the offered rate.
    synchronous_commit: str = "on"
    #: Niceness added to the producers, so that on a small machine their threads do not
    #: starve the workers of CPU (in production producers run elsewhere).
    producer_nice: int = 19
    systems: Sequence[str] = DEFAULT_SYSTEMS
    #: The poll-only workers' poll interval (``sqla-poll``), seconds.
    poll_interval: float = 0.05
    sample_interval: float = 0.5
    #: Seconds the workers get after the window to finish the backlog.
    drain_timeout: float = 60.0
    #: Seconds between releasing the workers and the producers (LISTEN set up, idle).
    warm_up: float = 1.5

    def producers_for(self, rate: float) -> int:
        """Producer processes for ``rate``."""
        return self.producers or max(1, math.ceil(rate / PER_PRODUCER))


# -- graphile-worker (Node) ---------------------------------------------------------------------


@dataclass
class NodePeer:
    """The Node side (``bench.node_peers``) when available, or why it cannot run."""

    peers: Any = None
    reason: str = ""


def graphile_peer(db: BenchDatabase) -> NodePeer:
    """Install graphile-worker (``bench.node_peers``) and its schema in the scratch database.

    Any failure (the module missing included) gives a peer with a ``reason`` instead.
    """
    try:
        peers: Any = importlib.import_module("bench.node_peers")
        peers.ensure_installed()
        peers.fresh_schema(db.dsn)
    except Exception as exc:  # any failure means: skip graphile, say why
        return NodePeer(reason=f"{type(exc).__name__}: {exc}".strip())
    return NodePeer(peers=peers)


class NodeWorker(WorkerProcess):
    """``node bench/node/worker.mjs idle SYSTEM``: the READY/GO handshake, JSON on SIGTERM."""

    def __init__(self, command: Sequence[str], env: dict[str, str]) -> None:
        # The parent's set-up, but a Node command line instead of ``python -m bench.worker``.
        self._stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.terminated = False
        self.proc = subprocess.Popen(
            list(command),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env={**os.environ, **env},
        )


# -- one run ------------------------------------------------------------------------------------


def pending_sql(system: str, graphile_jobs: str = "") -> str:
    """How many jobs of ``system`` wait, not yet started."""
    if system == "pgqueuer":
        return "SELECT count(*) FROM pgqueuer WHERE status = 'queued'"
    if system in GRAPHILE:
        return f"SELECT count(*) FROM {graphile_jobs} WHERE locked_at IS NULL"
    return "SELECT count(*) FROM sqla_queue_job_executions WHERE state = 'pending'"


def remaining_sql(system: str, graphile_jobs: str = "") -> str:
    """How many jobs of ``system`` are not finished (waiting or running)."""
    if system == "pgqueuer":
        return "SELECT count(*) FROM pgqueuer"
    if system in GRAPHILE:
        return f"SELECT count(*) FROM {graphile_jobs}"
    return "SELECT count(*) FROM sqla_queue_job_executions"


class BacklogSampler:
    """A thread counting the system's waiting jobs every ``interval`` seconds."""

    def __init__(self, db: BenchDatabase, sql: str, interval: float) -> None:
        self.db = db
        self.sql = sql
        self.interval = interval
        self.t0 = time.monotonic()
        self.series: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="backlog", daemon=True)

    def _run(self) -> None:
        with self.db.connect() as conn:
            tick = 0
            while True:
                row = conn.execute(self.sql).fetchone()
                assert row is not None
                self.series.append((time.monotonic() - self.t0, int(row[0])))
                tick += 1
                pause = self.t0 + tick * self.interval - time.monotonic()
                if self._stop.wait(max(0.0, pause)):
                    return

    def start(self, t0: float) -> None:
        """Start sampling; times are seconds since ``t0``."""
        self.t0 = t0
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join()


def _slope(points: Sequence[tuple[float, int]]) -> float:
    """The least-squares slope of ``points`` (count per second)."""
    if len(points) < 2:
        return math.nan
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if not var:
        return math.nan
    return sum((t - mt) * (v - mv) for t, v in points) / var


def _at(series: Sequence[tuple[float, int]], t: float) -> int:
    """The sample nearest to ``t``."""
    if not series:
        return -1
    return min(series, key=lambda s: abs(s[0] - t))[1]


def backlog_summary(series: Sequence[tuple[float, int]], seconds: float) -> dict[str, Any]:
    """Backlog at the start, middle and end of the window, its max, the second-half slope."""
    window = [s for s in series if s[0] <= seconds + 1e-9]
    return {
        "start": _at(series, 0.0),
        "middle": _at(series, seconds / 2),
        "end": _at(series, seconds),
        "max": max((v for _, v in series), default=-1),
        "slope": _slope([s for s in window if s[0] >= seconds / 2]),
    }


def no_growth(backlog: dict[str, Any], rate: float) -> bool:
    """Whether the backlog did not grow: flat second half, small at the end of the window."""
    slope = float(backlog["slope"])
    return (
        not math.isnan(slope)
        and slope <= max(5.0, 0.01 * rate)
        and int(backlog["end"]) <= 0.25 * rate
    )


def _prepare(db: BenchDatabase, system: str, peer: NodePeer | None) -> None:
    """Every contender's tables recreated and analyzed empty (the cold protocol)."""
    db.fresh_tables()
    if system in GRAPHILE:
        assert peer is not None
        peer.peers.fresh_schema(db.dsn)
    db.settle(QUEUE_TABLES, "cold")
    with db.connect() as conn:
        conn.execute("TRUNCATE bench_orders")


def stamp_task(system: str) -> str:
    """The stamp task of ``system``'s jobs: the asyncio worker gets the ``async def`` one."""
    return ASTAMP if system == "sqla-async" else app.STAMP


def _quiet(system: str, config: SustainedConfig) -> list[str]:
    """The poll-only variant's extra arguments: no NOTIFY, no LISTEN."""
    if system != "sqla-poll":
        return []
    return ["--quiet", "--poll-interval", repr(config.poll_interval)]


def _worker_args(db: BenchDatabase, system: str, config: SustainedConfig) -> list[str]:
    return [
        "idle",
        SYSTEMS[system][1],
        "--url",
        db.url,
        "--dsn",
        db.dsn,
        "--concurrency",
        str(config.concurrency),
        "--task",
        stamp_task(system),
        *_quiet(system, config),
    ]


def _producer_args(
    db: BenchDatabase, system: str, rate: float, config: SustainedConfig
) -> list[list[str]]:
    producers = config.producers_for(rate)
    share = rate / producers
    return [
        [
            "produce-paced",
            SYSTEMS[system][2],
            "--url",
            db.url,
            "--dsn",
            db.dsn,
            "--rate",
            repr(share),
            "--seconds",
            repr(config.seconds),
            "--lanes",
            str(config.lanes),
            "--nice",
            str(config.producer_nice),
            "--task",
            stamp_task(system),
            *_quiet(system, config),
            "--offset",
            str(p * KEY_STRIDE),
            # Producer p takes the p-th slot of each round: the arrivals interleave.
            "--phase",
            repr(p / rate),
        ]
        for p in range(producers)
    ]


def _starts(reports: Sequence[dict[str, Any]]) -> tuple[dict[int, float], int]:
    """Handler start times by key from every worker, and how many keys started twice."""
    starts: dict[int, float] = {}
    twice = 0
    for report in reports:
        raw = report.get("starts", {})
        pairs = raw.items() if isinstance(raw, dict) else raw
        for key, at in pairs:
            k = int(key)
            if k in starts:
                twice += 1
            starts[k] = min(float(at), starts.get(k, math.inf))
    return starts, twice


def _exactly_once(db: BenchDatabase, system: str, expected: int, graphile_jobs: str) -> str:
    """'' when the database shows each of ``expected`` jobs done exactly once, else why not."""
    with db.connect() as conn:
        if system == "pgqueuer":
            row = conn.execute(
                "SELECT count(*), count(DISTINCT job_id) FROM pgqueuer_log "
                "WHERE status = 'successful'"
            ).fetchone()
        elif system in GRAPHILE:
            row = conn.execute(f"SELECT {expected}, {expected} - count(*) FROM {graphile_jobs}")
            row = row.fetchone()
        else:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
                "count(*) FILTER (WHERE status = 'succeeded' AND attempts = 1) "
                "FROM sqla_queue_jobs"
            ).fetchone()
    assert row is not None
    done, once = int(row[0]), int(row[1])
    if done == expected and once == expected:
        return ""
    return f"{done} completions, {once} jobs done exactly once, of {expected} enqueued"


def _latency_series(
    commits: dict[int, float], starts: dict[int, float], t0: float
) -> list[tuple[int, float, float, int]]:
    """Per second of the window: (second, p50 ms, p99 ms, jobs) by commit time."""
    buckets: dict[int, list[float]] = {}
    for key, at in commits.items():
        if key in starts:
            buckets.setdefault(int(at - t0), []).append(1000 * (starts[key] - at))
    return [
        (sec, percentile(v, 50), percentile(v, 99), len(v)) for sec, v in sorted(buckets.items())
    ]


@dataclass
class SustainedRun:
    """One (system, rate) run."""

    system: str
    rate: float
    producers: int
    offered: float = math.nan
    committed: int = 0
    completed: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)
    backlog: dict[str, Any] = field(default_factory=dict)
    series: list[tuple[float, int]] = field(default_factory=list)
    latency_series: list[tuple[int, float, float, int]] = field(default_factory=list)
    worker_cpu_s: float = 0.0
    producer_cpu_s: float = 0.0
    server_cpu_s: float = math.nan
    producer_late_max_ms: float = 0.0
    worker_rss_mb: float = 0.0
    problems: list[str] = field(default_factory=list)
    skipped: str = ""
    #: The 1-minute load average before and after the run (the machine may be shared).
    load: tuple[float, float] = (math.nan, math.nan)

    def per_job_us(self, seconds: float) -> float:
        """CPU seconds per completed job, in microseconds."""
        return 1e6 * seconds / self.completed if self.completed else math.nan

    def as_json(self) -> dict[str, Any]:
        """Everything, the backlog series included."""
        return {
            "system": self.system,
            "rate": self.rate,
            "producers": self.producers,
            "achieved_rate": self.offered,
            "committed": self.committed,
            "completed": self.completed,
            "latency_ms": self.latency_ms,
            "backlog": self.backlog,
            "backlog_series": self.series,
            "latency_series": self.latency_series,
            "worker_cpu_us_per_job": self.per_job_us(self.worker_cpu_s),
            "producer_cpu_us_per_job": self.per_job_us(self.producer_cpu_s),
            "server_cpu_us_per_job": self.per_job_us(self.server_cpu_s),
            "producer_late_max_ms": self.producer_late_max_ms,
            "worker_rss_mb": self.worker_rss_mb,
            "problems": self.problems,
            "skipped": self.skipped,
            "load_average_1m": list(self.load),
        }


def sustained_once(
    db: BenchDatabase,
    system: str,
    rate: float,
    config: SustainedConfig,
    peer: NodePeer | None = None,
) -> SustainedRun:
    """``config.seconds`` of producers at ``rate`` while the system's workers run."""
    producers = config.producers_for(rate)
    run = SustainedRun(system, rate, producers)
    load_before = os.getloadavg()[0]
    graphile_jobs = peer.peers.GRAPHILE_JOBS if peer is not None and peer.peers else ""
    _prepare(db, system, peer)
    workers: list[WorkerProcess] = []
    feeders: list[WorkerProcess] = []
    env = {"PGOPTIONS": f"-c synchronous_commit={config.synchronous_commit}"}
    try:
        for _ in range(config.workers):
            if system in GRAPHILE:
                assert peer is not None
                command = peer.peers.worker_command(
                    "idle", system, db.dsn, config.concurrency, GRAPHILE_TASK
                )
                workers.append(NodeWorker(command, env))
            else:
                workers.append(WorkerProcess(_worker_args(db, system, config), env=env))
        for args in _producer_args(db, system, rate, config):
            feeders.append(WorkerProcess(args, env=env))
        for proc in [*workers, *feeders]:
            proc.wait_ready()
        sampler = BacklogSampler(db, pending_sql(system, graphile_jobs), config.sample_interval)
        with BackendCpuMeter(db) as server:
            for proc in workers:
                proc.go()
            time.sleep(config.warm_up)
            t0 = time.monotonic()
            sampler.start(t0)
            for proc in feeders:
                proc.go()
            produced = [p.finish(config.seconds + 120) for p in feeders]
            emptied = _wait_empty(db, remaining_sql(system, graphile_jobs), config, workers)
            sampler.stop()
            for proc in workers:
                proc.terminate()
            reports = [p.finish(60) for p in workers]
        run.server_cpu_s = server.seconds
        run.load = (load_before, os.getloadavg()[0])
    finally:
        for proc in [*workers, *feeders]:
            proc.kill()
    commits = {int(k): float(t) for r in produced for k, t in r["commits"]}
    starts, twice = _starts(reports)
    run.committed = len(commits)
    run.offered = len(commits) / config.seconds
    run.producer_cpu_s = sum(float(r["cpu_s"]) for r in produced)
    run.producer_late_max_ms = max(float(r["late_max_ms"]) for r in produced)
    run.worker_cpu_s = sum(float(r["cpu_s"]) for r in reports)
    run.worker_rss_mb = max(float(r["maxrss_mb"]) for r in reports)
    latencies = [1000 * (starts[k] - t) for k, t in commits.items() if k in starts]
    run.completed = sum(1 for k in commits if k in starts)
    run.latency_ms = {
        "p50": percentile(latencies, 50),
        "p90": percentile(latencies, 90),
        "p99": percentile(latencies, 99),
        "max": max(latencies, default=math.nan),
    }
    run.series = [(round(t, 3), v) for t, v in sampler.series]
    run.backlog = backlog_summary(sampler.series, config.seconds)
    # The sampler may stop before it sees the empty queue: the wait saw it.
    after = emptied - t0 - config.seconds
    run.backlog["drained_after_s"] = after if math.isnan(after) else max(0.0, after)
    run.latency_series = _latency_series(commits, starts, t0)
    missing = run.committed - run.completed
    if missing:
        run.problems.append(f"{missing} committed jobs never started")
    if twice:
        run.problems.append(f"{twice} jobs started more than once")
    check = _exactly_once(db, system, run.committed, graphile_jobs)
    if check:
        run.problems.append(check)
    return run


def _wait_empty(
    db: BenchDatabase, sql: str, config: SustainedConfig, workers: Sequence[WorkerProcess]
) -> float:
    """Wait until no job is left; when that was (NaN after ``drain_timeout``)."""
    deadline = time.monotonic() + config.drain_timeout
    with db.connect() as conn:
        while time.monotonic() < deadline:
            row = conn.execute(sql).fetchone()
            assert row is not None
            if int(row[0]) == 0:
                return time.monotonic()
            if all(p.proc.poll() is not None for p in workers):
                raise RuntimeError("every worker exited before the backlog was done")
            time.sleep(0.05)
    return math.nan


# -- the scenario -------------------------------------------------------------------------------


def run_sustained(
    db: BenchDatabase, config: SustainedConfig, log: Callable[[str], Any] = print
) -> dict[str, Any]:
    """Every system at every rate; returns tables, runs and a summary keyed ``system/rate``."""
    unknown = set(config.systems) - set(SYSTEMS)
    if unknown:
        raise ValueError(f"unknown systems {sorted(unknown)}; choose from {list(SYSTEMS)}")
    peer: NodePeer | None = None
    if any(s in GRAPHILE for s in config.systems):
        peer = graphile_peer(db)
        if peer.reason:
            log(f"  sustained: graphile-worker skipped: {peer.reason}")
    runs: list[SustainedRun] = []
    for rate in config.rates:
        for system in config.systems:
            if system in GRAPHILE and peer is not None and peer.reason:
                runs.append(SustainedRun(system, rate, 0, skipped=peer.reason))
                continue
            run = sustained_once(db, system, rate, config, peer)
            runs.append(run)
            lat, bl = run.latency_ms, run.backlog
            log(
                f"  sustained {SYSTEMS[system][0]:<26} {rate:>6,.0f}/s: achieved "
                f"{run.offered:,.0f}/s ({run.producers}x{config.lanes} producers, worst lag "
                f"{run.producer_late_max_ms:,.0f} ms), latency p50 {lat['p50']:.1f} / p99 "
                f"{lat['p99']:.1f} / max {lat['max']:.0f} ms, backlog end {bl['end']} max "
                f"{bl['max']} slope {bl['slope']:+.1f}/s, {run.completed:,} done, load "
                f"{run.load[0]:.1f} -> {run.load[1]:.1f}"
                + (f"; PROBLEMS: {'; '.join(run.problems)}" if run.problems else "")
            )
    tables = [
        _rate_table(config, rate, [r for r in runs if r.rate == rate]) for rate in config.rates
    ]
    summary = {f"{r.system}/{r.rate:.0f}": r.as_json() for r in runs}
    return {
        "tables": tables,
        "runs": [r.as_json() for r in runs],
        "summary": summary,
        "targets": targets(runs),
    }


def _fmt(value: float, spec: str = ".1f") -> str:
    return "-" if math.isnan(value) else format(value, spec)


def _rate_table(config: SustainedConfig, rate: float, runs: Sequence[SustainedRun]) -> TextTable:
    """One rate: latency, backlog, CPU, and the ratios to sqla_queue sync."""
    table = TextTable(
        f"Sustained load: {rate:,.0f} business transactions/s for {config.seconds:.0f} s, "
        f"{config.workers} worker processes x concurrency {config.concurrency}, "
        f"synchronous_commit={config.synchronous_commit} "
        "(latency: commit to handler start, ms)",
        [
            "system",
            "achieved/s",
            "done",
            "p50",
            "p90",
            "p99",
            "max",
            "p99 vs sqla sync",
            "backlog start/mid/end/max",
            "slope/s",
            "emptied after s",
            "worker CPU us/job",
            "producer CPU us/job",
            "server CPU us/job",
            "server vs sqla sync",
        ],
    )
    base = next((r for r in runs if r.system == "sqla-sync" and not r.skipped), None)
    for r in runs:
        label = SYSTEMS[r.system][0]
        if r.skipped:
            table.add(label, *(["-"] * 14))
            continue
        lat, bl = r.latency_ms, r.backlog
        server = r.per_job_us(r.server_cpu_s)
        table.add(
            label + (" (!)" if r.problems else ""),
            f"{r.offered:,.0f}",
            f"{r.completed:,}",
            _fmt(lat["p50"]),
            _fmt(lat["p90"]),
            _fmt(lat["p99"]),
            _fmt(lat["max"], ".0f"),
            fmt_ratio(ratio(lat["p99"], base.latency_ms["p99"])) if base else "-",
            f"{bl['start']}/{bl['middle']}/{bl['end']}/{bl['max']}",
            _fmt(bl["slope"], "+.1f"),
            _fmt(bl["drained_after_s"]),
            _fmt(r.per_job_us(r.worker_cpu_s), ".0f"),
            _fmt(r.per_job_us(r.producer_cpu_s), ".0f"),
            _fmt(server, ".0f"),
            fmt_ratio(ratio(server, base.per_job_us(base.server_cpu_s))) if base else "-",
        )
    for r in runs:
        if r.skipped:
            table.note(f"{SYSTEMS[r.system][0]}: skipped ({r.skipped})")
        for problem in r.problems:
            table.note(f"(!) {SYSTEMS[r.system][0]}: {problem}")
    table.note(
        "achieved/s: committed transactions over the window (producers that cannot keep "
        "up offer less than asked). backlog: jobs not yet started, sampled every "
        f"{config.sample_interval} s, at the window's start, middle and end and its max; "
        "slope: least-squares jobs/s over the window's second half; emptied after: seconds "
        "after the window until none waited. server CPU: every backend of the scratch "
        "database (producers' and workers')."
    )
    return table


#: A target counts as measured only when the producers offered this share of its rate.
OFFERED_SHARE = 0.9


def targets(runs: Sequence[SustainedRun]) -> list[dict[str, Any]]:
    """Issue 28's targets for sqla_queue's runs: p99 <= 25 ms at 1,000/s; no growth at 5,000/s.

    ``met`` is None (not measured) when the producers offered less than
    :data:`OFFERED_SHARE` of the rate: the workers were not put under that load.
    """
    out: list[dict[str, Any]] = []
    for r in runs:
        if r.skipped or not r.system.startswith("sqla") or r.rate not in (1_000, 5_000):
            continue
        if r.rate == 1_000:
            target, value = f"{r.system} p99 <= 25 ms at 1,000/s", r.latency_ms["p99"]
            met: bool | None = value <= 25 and not r.problems
        else:
            target, value = f"{r.system} no backlog growth at 5,000/s", r.backlog["slope"]
            met = no_growth(r.backlog, r.offered) and not r.problems
        if r.offered < OFFERED_SHARE * r.rate:
            met = None
        out.append({"target": target, "value": value, "met": met, "achieved_rate": r.offered})
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the scenario from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a URL of the server (default: the test server's)")
    parser.add_argument("--rates", default="1000,5000", help="comma-separated jobs/s")
    parser.add_argument("--seconds", type=float, default=60.0, help="production window")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=10, help="per worker process")
    parser.add_argument(
        "--producers", type=int, default=0, help=f"producer processes (0: rate/{PER_PRODUCER:.0f})"
    )
    parser.add_argument(
        "--lanes", type=int, default=10, help="transactions in flight per producer process"
    )
    parser.add_argument(
        "--synchronous-commit",
        choices=("on", "off"),
        default="on",
        help="synchronous_commit of the producers and workers (off: no WAL flush per commit)",
    )
    parser.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"comma-separated, of {','.join(SYSTEMS)}",
    )
    parser.add_argument(
        "--poll-interval", type=float, default=0.05, help="sqla-poll: the workers' poll interval"
    )
    parser.add_argument(
        "--producer-nice", type=int, default=19, help="niceness added to the producers"
    )
    parser.add_argument("--json", type=Path, help="write every figure and series here")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args(argv)
    config = SustainedConfig(
        rates=tuple(float(r) for r in args.rates.split(",") if r.strip()),
        seconds=args.seconds,
        workers=args.workers,
        concurrency=args.concurrency,
        producers=args.producers,
        lanes=args.lanes,
        synchronous_commit=args.synchronous_commit,
        poll_interval=args.poll_interval,
        producer_nice=args.producer_nice,
        systems=tuple(s.strip() for s in args.systems.split(",") if s.strip()),
    )
    with BenchDatabase(resolve_server_url(args.url), keep=args.keep) as db:
        info = machine_info(db)
        result = run_sustained(db, config, log=lambda line: print(line, flush=True))
    for table in result["tables"]:
        print("\n" + table.render())
    print()
    for target in result["targets"]:
        met = target["met"]
        mark = "not measured" if met is None else "met" if met else "NOT met"
        print(
            f"{target['target']}: {mark} ({target['value']:.1f}; producers offered "
            f"{target['achieved_rate']:,.0f}/s)"
        )
    if args.json:
        payload = {
            "machine": info,
            "arguments": sys.argv[1:] if argv is None else argv,
            "config": {
                "rates": list(config.rates),
                "seconds": config.seconds,
                "workers": config.workers,
                "concurrency": config.concurrency,
                "producers": config.producers,
                "lanes": config.lanes,
                "synchronous_commit": config.synchronous_commit,
                "poll_interval": config.poll_interval,
                "producer_nice": config.producer_nice,
                "systems": list(config.systems),
            },
            "result": {
                **result,
                "tables": [t.as_json() for t in result["tables"]],
            },
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
