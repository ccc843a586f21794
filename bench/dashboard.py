"""``python -m bench.dashboard``: the web dashboard's cost on a queue with 1M jobs.

1. The overview page (and ``queue.status()`` alone) on a database holding 1,000,000 jobs:
   940k finished over the last two hours (so every window over ``jobs`` hits its row cap),
   10k failed, and 50k pending jobs of another task. p50/p99 over ``--loads`` loads;
   the target is p50 under 500 ms.
2. The claim with the dashboard open: drains of ``--jobs`` no-op jobs by 2 worker
   processes (batch 10), on top of that history, with and without a poller loading the
   overview every second, rounds interleaved in alternating order, in one run. It prints
   the median rates and their ratio (polled / plain): the machine is shared, so compare
   the ratio, not the rates.

Options: ``--url`` (a server where it may create a database; default as bench.run),
``--jobs`` (20,000), ``--rounds`` (3), ``--loads`` (30), ``--keep``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import warnings
from typing import Any

from sqlalchemy import text

from bench import app
from bench.common import BenchDatabase, percentile, resolve_server_url, worker_processes
from bench.drain import enqueue_jobs

HISTORY_TASK = "bench.history"
FINISHED = 940_000
FAILED = 10_000
PENDING = 50_000


def fill_history(db: BenchDatabase) -> None:
    """1M jobs in the queue's tables, written by SQL (an enqueue loop would take minutes)."""
    assert db.engine is not None
    jobs = app.queue.tables.jobs.name
    executions = app.queue.tables.executions.name
    payload = """'{"args": [], "kwargs": {}}'::jsonb"""
    with db.engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {jobs} (task, payload, status, attempts, max_attempts, "
                "created_at, scheduled_at, finished_at, errors) "
                f"SELECT :task, {payload}, "
                "CASE WHEN n <= :failed THEN 'failed' ELSE 'succeeded' END, 1, 1, "
                "now() - n * interval '7 milliseconds' - interval '1 second', "
                "now() - n * interval '7 milliseconds' - interval '1 second', "
                "now() - n * interval '7 milliseconds', "
                """CASE WHEN n <= :failed THEN '[{"type": "ValueError", "message": "x"}]'"""
                "::jsonb ELSE '[]'::jsonb END "
                "FROM generate_series(1, :finished) AS n"
            ),
            {"task": HISTORY_TASK, "failed": FAILED, "finished": FINISHED + FAILED},
        )
        conn.execute(
            text(
                f"WITH j AS (INSERT INTO {jobs} (task, payload, max_attempts, scheduled_at) "
                f"SELECT :task, {payload}, 1, now() FROM generate_series(1, :pending) "
                "RETURNING id, task, priority, scheduled_at) "
                f"INSERT INTO {executions} (id, task, priority, state, execute_at) "
                "SELECT id, task, priority, 'pending', scheduled_at FROM j"
            ),
            {"task": HISTORY_TASK, "pending": PENDING},
        )
    with db.connect() as conn:
        conn.execute(f"VACUUM ANALYZE {jobs}")
        conn.execute(f"VACUUM ANALYZE {executions}")


def _client(db: BenchDatabase) -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
        from starlette.testclient import TestClient
    assert db.engine is not None
    return TestClient(app.queue.dashboard(db.engine, refresh=None))


def _ms(values: list[float]) -> str:
    return f"p50 {percentile(values, 50):7.1f} ms   p99 {percentile(values, 99):7.1f} ms"


def measure_pages(db: BenchDatabase, loads: int) -> dict[str, list[float]]:
    """Milliseconds per load of the overview, the job list, and ``queue.status`` alone."""
    assert db.engine is not None
    timings: dict[str, list[float]] = {"status": [], "overview": [], "jobs": [], "failed": []}
    with _client(db) as client:
        client.get("/")  # the first load compiles the templates and warms the pool
        for _ in range(loads):
            t = time.perf_counter()
            with db.engine.connect() as conn:
                app.queue.status(conn)
            timings["status"].append(1000 * (time.perf_counter() - t))
            for name, path in (
                ("overview", "/"),
                ("jobs", "/jobs"),
                ("failed", "/jobs?state=failed"),
            ):
                t = time.perf_counter()
                response = client.get(path)
                timings[name].append(1000 * (time.perf_counter() - t))
                assert response.status_code == 200, response.text[:500]
    return timings


class Poller:
    """Loads the overview every ``interval`` seconds in a thread, as an open browser tab."""

    def __init__(self, db: BenchDatabase, interval: float = 1.0) -> None:
        self.db = db
        self.interval = interval
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with _client(self.db) as client:
            while not self._stop.is_set():
                t = time.perf_counter()
                response = client.get("/")
                took = time.perf_counter() - t
                assert response.status_code == 200
                self.latencies.append(1000 * took)
                self._stop.wait(max(0.0, self.interval - took))

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def drain(db: BenchDatabase, jobs: int, *, polled: bool) -> tuple[float, list[float]]:
    """Seconds for 2 worker processes to drain ``jobs`` no-op jobs; the poll latencies."""
    with db.connect() as conn:
        row = conn.execute(f"SELECT coalesce(max(id), 0) FROM {app.queue.tables.jobs.name}")
        base = int(row.fetchone()[0])  # type: ignore[index]
    enqueue_jobs(db, "sqla-sync", jobs, app.NOOP)
    db.settle(("sqla_queue_jobs",), "cold")
    args = ["drain", "sqla-sync", "--url", db.url, "--dsn", db.dsn, "--concurrency", "10"]
    poller = Poller(db) if polled else None
    with worker_processes([args, args]) as procs, db.connect() as conn:
        t0 = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        if poller is not None:
            poller.__enter__()
        try:
            for p in procs:
                p.go()
            for p in procs:
                p.finish(max(120.0, jobs / 100))
        finally:
            if poller is not None:
                poller.__exit__()
        done, last = conn.execute(
            f"SELECT count(*), max(finished_at) FROM {app.queue.tables.jobs.name} "
            "WHERE id > %s AND status = 'succeeded'",
            (base,),
        ).fetchone()  # type: ignore[misc]
    if done != jobs:
        raise RuntimeError(f"{done} of {jobs} jobs succeeded")
    return (last - t0).total_seconds(), poller.latencies if poller else []


def main(argv: list[str] | None = None) -> int:
    """Run both measurements and print them."""
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__)
    parser.add_argument("--url", help="a database URL of the server to use")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--rounds", type=int, default=3, help="drains of each kind")
    parser.add_argument("--loads", type=int, default=30, help="page loads measured")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args(argv)
    with BenchDatabase(resolve_server_url(args.url), keep=args.keep) as db:
        t = time.perf_counter()
        fill_history(db)
        print(f"history: {FINISHED + FAILED + PENDING:,} jobs in {time.perf_counter() - t:.0f} s")
        timings = measure_pages(db, args.loads)
        print(f"\n1. page loads on 1M jobs ({args.loads} loads each; target: p50 < 500 ms)")
        for name, label in (
            ("status", "queue.status()"),
            ("overview", "overview page /"),
            ("jobs", "job list /jobs"),
            ("failed", "job list, failed"),
        ):
            print(f"  {label:<18} {_ms(timings[name])}")
        plain: list[float] = []
        polled: list[float] = []
        polls: list[float] = []
        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            for with_poller in order:
                seconds, latencies = drain(db, args.jobs, polled=with_poller)
                (polled if with_poller else plain).append(args.jobs / seconds)
                polls += latencies
                kind = "with poller" if with_poller else "plain      "
                print(f"  round {i + 1} {kind}: {args.jobs / seconds:8.0f} jobs/s")
        p, q = statistics.median(plain), statistics.median(polled)
        print(
            f"\n2. drain of {args.jobs:,} no-op jobs, 2 processes, batch 10, "
            f"{args.rounds} rounds each, interleaved"
        )
        print(f"  plain                  {p:8.0f} jobs/s (median)")
        print(f"  overview every second  {q:8.0f} jobs/s (median)")
        print(f"  ratio polled/plain     {q / p:8.2f}")
        if polls:
            print(f"  overview during drains {_ms(polls)} ({len(polls)} loads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
