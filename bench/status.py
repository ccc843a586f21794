"""How long ``Queue.status`` takes on a large queue: 1M finished jobs, 100k pending.

    python -m bench.status [--url URL] [--finished 1000000] [--pending 100000] [--reads 30]

The history is spread over a week (about 6,000 jobs an hour, 5% failed), so the hour's
throughput window and the day's failure window read thousands of rows; then a burst of
200,000 jobs finished in the last ten minutes makes the hour window hit its cap. Each
shape is read with statistics never taken and after ANALYZE. Prints the p50/p95/max of a
whole read and each statement's p50, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqla_queue.testing.databases import DatabaseFactory, resolve_test_admin_url
from tests.support.limited import queue

TASKS = ("noop", "echo", "limited1", "limited2")


def fill(engine: Engine, finished: int, pending: int) -> None:
    """The history, the backlog, 40 running jobs and 20 live workers, by SQL in bulk."""
    jobs, ex, workers = queue.tables.jobs, queue.tables.executions, queue.tables.workers
    tasks = "ARRAY[" + ", ".join(f"'{t}'" for t in TASKS) + "]"
    with engine.begin() as c:
        c.execute(
            text(
                f"INSERT INTO {jobs.fullname} (task, payload, max_attempts, scheduled_at, status, "
                f"finished_at) SELECT ({tasks})[1 + i % 4], '{{}}', 1, now(), "
                "CASE WHEN i % 20 = 0 THEN 'failed' ELSE 'succeeded' END, "
                "now() - i * (interval '1 week' / :n) FROM generate_series(1, :n) i"
            ),
            {"n": finished},
        )
        c.execute(
            text(
                f"WITH j AS (INSERT INTO {jobs.fullname} (task, payload, max_attempts, "
                f"scheduled_at) SELECT ({tasks})[1 + i % 4], '{{}}', 1, now() "
                "FROM generate_series(1, :n) i RETURNING id, task) "
                f"INSERT INTO {ex.fullname} (id, task, priority, execute_at) "
                "SELECT id, task, 0, now() - (id % 600) * interval '1 second' FROM j"
            ),
            {"n": pending},
        )
        c.execute(
            text(
                f"UPDATE {ex.fullname} SET state = 'running', alive_at = now(), attempt = 1, "
                "worker_id = md5((id % 20)::text)::uuid "
                f"WHERE id IN (SELECT id FROM {ex.fullname} ORDER BY id DESC LIMIT 40)"
            )
        )
        c.execute(
            text(
                f"INSERT INTO {workers.fullname} (worker_id, hostname, pid, tasks, concurrency) "
                f"SELECT md5(i::text)::uuid, 'host-' || i, 1000 + i, {tasks}, 10 "
                "FROM generate_series(0, 19) i"
            )
        )


def burst(engine: Engine, n: int) -> None:
    """``n`` jobs finished within the last ten minutes: the hour window hits its cap."""
    jobs = queue.tables.jobs
    with engine.begin() as c:
        c.execute(
            text(
                f"INSERT INTO {jobs.fullname} (task, payload, max_attempts, scheduled_at, status, "
                "finished_at) SELECT 'noop', '{}', 1, now(), 'succeeded', "
                "now() - i * (interval '10 minutes' / :n) FROM generate_series(1, :n) i"
            ),
            {"n": n},
        )


def measure(engine: Engine, reads: int) -> tuple[list[float], dict[str, list[float]]]:
    """Whole-read times and per-statement times (ms), after three warm-up reads."""
    per: dict[str, list[float]] = defaultdict(list)
    started: dict[int, float] = {}

    def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        started[id(cursor)] = time.perf_counter()

    def after(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        words = " ".join(statement.split())
        for name, marker in (
            ("executions", "AS oldest_due_seconds"),
            ("running/worker", "GROUP BY app_jobs.sqla_queue_job_executions.worker_id"),
            ("finished 1h", "AS recent GROUP BY"),
            ("failed 24h", "AS failures GROUP BY"),
            ("settings", "FULL OUTER JOIN"),
            ("workers", "seen_seconds_ago"),
        ):
            if marker in words:
                per[name].append((time.perf_counter() - started[id(cursor)]) * 1000)

    totals: list[float] = []
    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    try:
        for i in range(reads + 3):
            if i == 3:
                per.clear()
            began = time.perf_counter()
            with engine.connect() as c:
                status = queue.status(c)
            if i >= 3:
                totals.append((time.perf_counter() - began) * 1000)
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)
    print(
        f"    tasks {len(status.tasks)}, workers {len(status.workers)}, pending "
        f"{status.pending:,}, done/h {status.finished_last_hour:,}, capped {status.capped}"
    )
    return totals, per


def report(label: str, engine: Engine, reads: int) -> None:
    """Print one shape's figures."""
    print(label)
    totals, per = measure(engine, reads)
    totals.sort()
    p95 = totals[min(len(totals) - 1, int(len(totals) * 0.95))]
    print(
        f"    read p50 {statistics.median(totals):7.1f}  p95 {p95:7.1f}  max {totals[-1]:7.1f} ms"
    )
    print("    " + "  ".join(f"{k} {statistics.median(v):.1f}" for k, v in per.items()))


def main() -> None:
    """Build the queue in a scratch database, print the figures, drop the database."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="admin URL of the server (default: the test server)")
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--reads", type=int, default=30)
    args = parser.parse_args()
    factory = DatabaseFactory(args.url or resolve_test_admin_url())
    url = factory.clone("template0")
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.begin() as c:
            queue.create_all(c)
        began = time.perf_counter()
        fill(engine, args.finished, args.pending)
        print(
            f"filled {args.finished:,} finished + {args.pending:,} pending jobs in "
            f"{time.perf_counter() - began:.0f} s; Queue.status, {args.reads} reads (ms)"
        )
        report("history over a week, never analyzed", engine, args.reads)
        with engine.begin() as c:
            c.execute(text("ANALYZE"))
        report("history over a week, analyzed", engine, args.reads)
        burst(engine, 200_000)
        report("+200k finished in the last 10 min (hour window capped), stale stats", engine, 10)
        with engine.begin() as c:
            c.execute(text("ANALYZE"))
        report("+200k finished in the last 10 min, analyzed", engine, args.reads)
    finally:
        engine.dispose()
        factory.drop(url)


if __name__ == "__main__":
    main()
