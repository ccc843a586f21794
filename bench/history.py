"""History at scale: the claim and the single enqueue with no history and with 10M finished
jobs, and pruning 1M of them, for the plain and the partitioned layout, in one run.

    python -m bench.history [--url URL] [--history 10000000] [--calls 1000]
                            [--layouts plain,partitioned]

For each layout, in a schema of its own on one fresh database:

1. with no history: ``--calls`` single enqueues, each in its own committed transaction
   (p50, p99), then as many claims of 10 jobs from that backlog, each rolled back so that
   the backlog stays the same (p50, p99);
2. ``--history`` finished jobs are written (one tenth per day over the last ten days), and
   the same two measurements are repeated *cold*: no ANALYZE after the load, as users are
   when a history grows between two autovacuum runs (the cold protocol of
   docs/performance.md);
3. the oldest day (a tenth of the history) is pruned with ``queue.prune``: a DELETE of
   every row on the plain layout, a DROP of one partition on the partitioned one.

It prints one table: per layout, the p50 and p99 of each measurement before and after the
load, their ratio, and the prune's time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import Engine, MetaData, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import percentile
from sqla_queue import Queue, statements
from sqla_queue.conversation import run_flow
from sqla_queue.history.layout import history_names
from sqla_queue.history.partitions import ensure_flow
from sqla_queue.testing.databases import DatabaseFactory, resolve_test_admin_url

LAYOUTS = ("plain", "partitioned")
DAYS = 10


def make_queue(layout: str) -> Queue:
    """The benchmark's queue of one layout, in a schema named after it."""
    queue = Queue(metadata=MetaData(), schema=f"bench_history_{layout}", history=layout)

    @queue.task(name="noop")
    def noop(n: int = 0) -> None:
        """Does nothing."""

    return queue


def timed_enqueues(sessions: sessionmaker[Session], queue: Queue, calls: int) -> list[float]:
    """Milliseconds of each single enqueue, in its own committed transaction."""
    task = queue.get_task("noop")
    times = []
    for i in range(calls):
        start = time.perf_counter()
        with sessions.begin() as session:
            task.enqueue(session, n=i)
        times.append((time.perf_counter() - start) * 1000)
    return times


def timed_claims(engine: Engine, queue: Queue, calls: int) -> list[float]:
    """Milliseconds of each claim of 10 (as a worker runs it), rolled back after timing."""
    claim = statements.claim_statement(queue.tables)
    params = {
        "tasks": ["noop"],
        "batch": 10,
        "worker": uuid.uuid4(),
        "lease": 30.0,
        "lease_map": "{}",
    }
    times = []
    with engine.connect() as connection:
        for _ in range(calls):
            transaction = connection.begin()
            connection.execute(statements.planner_guard())
            start = time.perf_counter()
            rows = connection.execute(claim, params).all()
            times.append((time.perf_counter() - start) * 1000)
            transaction.rollback()
            assert len(rows) == 10, "the backlog must hold at least 10 jobs"
    return times


def load_history(engine: Engine, queue: Queue, rows: int) -> float:
    """Write ``rows`` succeeded jobs over the last ten days; the seconds it took."""
    jobs = f"{queue.tables.schema}.{queue.tables.jobs.name}"
    start = time.perf_counter()
    with engine.begin() as connection:
        if queue.tables.history == "partitioned":
            first_day = dt.datetime.now(dt.UTC) - dt.timedelta(days=DAYS + 1)
            run_flow(
                connection,
                ensure_flow(
                    queue.tables, history_names(queue.tables), ahead=DAYS + 4, now=first_day
                ),
            )
    per_day = rows // DAYS
    for day in range(1, DAYS + 1):
        with engine.begin() as connection:
            connection.execute(
                text(
                    f"INSERT INTO {jobs} (task, payload, max_attempts, scheduled_at, "
                    "created_at, status, finished_at, attempts) "
                    "SELECT 'noop', jsonb_build_object('n', i), 1, d, d, 'succeeded', "
                    "d + make_interval(secs => (i % 86000)), 1 "
                    "FROM generate_series(1, :n) AS i, "
                    "(SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' "
                    "- make_interval(days => :day) AS d) AS day"
                ),
                {"n": per_day, "day": day},
            )
    return time.perf_counter() - start


def timed_prune(sessions: sessionmaker[Session], queue: Queue) -> tuple[float, int]:
    """Prune the oldest day (older than the midnight nine days ago): seconds and count."""
    with sessions() as session:
        age = session.scalar(
            text(
                f"SELECT extract(epoch FROM now() - (date_trunc('day', now() AT TIME ZONE 'UTC') "
                f"AT TIME ZONE 'UTC' - make_interval(days => {DAYS - 1})))"
            )
        )
    start = time.perf_counter()
    with sessions.begin() as session:
        count = queue.prune(session, older_than=dt.timedelta(seconds=float(age)))
    return time.perf_counter() - start, count


def fmt(values: list[float]) -> tuple[float, float]:
    return percentile(values, 50), percentile(values, 99)


def main() -> None:
    """Run every layout and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an admin URL of the server (default: the test server's)")
    parser.add_argument("--history", type=int, default=10_000_000, help="finished jobs loaded")
    parser.add_argument("--calls", type=int, default=1000, help="enqueues and claims measured")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="plain,partitioned")
    args = parser.parse_args()
    layouts = [name for name in args.layouts.split(",") if name]
    factory = DatabaseFactory(args.url or resolve_test_admin_url())
    url = factory.clone("template0")
    results: dict[str, dict[str, object]] = {}
    try:
        engine = create_engine(url)
        sessions = sessionmaker(engine)
        for layout in layouts:
            queue = make_queue(layout)
            with engine.begin() as connection:
                queue.create_all(connection)
            print(f"[{layout}] no history: {args.calls} enqueues, {args.calls} claims", flush=True)
            timed_enqueues(sessions, queue, 50)  # warm-up: caches, prepared statements
            before_enqueue = timed_enqueues(sessions, queue, args.calls)
            before_claim = timed_claims(engine, queue, args.calls)
            print(f"[{layout}] loading {args.history:,} finished jobs ...", flush=True)
            load_seconds = load_history(engine, queue, args.history)
            print(f"[{layout}] loaded in {load_seconds:.0f} s; measuring cold", flush=True)
            after_enqueue = timed_enqueues(sessions, queue, args.calls)
            after_claim = timed_claims(engine, queue, args.calls)
            prune_seconds, pruned = timed_prune(sessions, queue)
            results[layout] = {
                "enqueue": (fmt(before_enqueue), fmt(after_enqueue)),
                "claim": (fmt(before_claim), fmt(after_claim)),
                "prune": (prune_seconds, pruned),
                "load": load_seconds,
            }
        engine.dispose()
    finally:
        factory.drop(url)

    print()
    print(f"history: {args.history:,} finished jobs over {DAYS} days; {args.calls} calls each;")
    print("after the load: cold (no ANALYZE). Times in ms; x = with history / without.")
    columns = ("p50 0", "p99 0", "p50 H", "p99 H")
    print(
        f"{'layout':<12} {'measure':<22} " + " ".join(f"{c:>8}" for c in columns) + "  p50 x  p99 x"
    )
    for layout, figures in results.items():
        for measure in ("enqueue", "claim"):
            (b50, b99), (a50, a99) = figures[measure]  # type: ignore[misc]
            label = "single enqueue" if measure == "enqueue" else "claim of 10"
            print(
                f"{layout:<12} {label:<22} {b50:8.3f} {b99:8.3f} {a50:8.3f} {a99:8.3f} "
                f"{a50 / b50:6.2f} {a99 / b99:6.2f}"
            )
    for layout, figures in results.items():
        seconds, count = figures["prune"]  # type: ignore[misc]
        how = "DROP of partitions" if layout == "partitioned" else "DELETE"
        print(f"{layout:<12} prune {count:,} jobs ({how}): {seconds * 1000:,.0f} ms")
    if len(results) == 2:
        plain = results["plain"]["prune"][0]  # type: ignore[index]
        part = results["partitioned"]["prune"][0]  # type: ignore[index]
        print(f"prune: DELETE / DROP = {plain / part:,.0f}x")


if __name__ == "__main__":
    main()
