"""What ``max_pending`` costs one enqueue: bounded tasks at 10% and 90% full, beside an
unbounded task, in one run on one fresh database.

    python -m bench.bounded [--url URL] [--calls 600] [--rounds 6]

Each call enqueues one job in its own transaction and is rolled back, so a task stays at
its fill level; only the enqueue call is timed (for a bounded task: lock, count, insert;
for an unbounded one: the insert). The cases take turns in rounds, so drift in the
machine's load spreads over all of them. The backlog is written straight into the
executions table and analyzed, as autovacuum would have seen it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from sqlalchemy import Engine, MetaData, create_engine, text
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqla_queue import Queue
from sqla_queue.testing.databases import DatabaseFactory, resolve_test_admin_url

queue = Queue(metadata=MetaData(), schema="bench_bounded")


@queue.task(name="free")
def free(n: int = 0) -> None:
    """Unbounded."""


@queue.task(name="b1000", max_pending=1000)
def b1000(n: int = 0) -> None:
    """Bounded at 1,000."""


@queue.task(name="b10000", max_pending=10_000)
def b10000(n: int = 0) -> None:
    """Bounded at 10,000."""


#: (label, task handle, the bound, pending rows of the task written before timing).
CASES = [
    ("unbounded", free, None, 0),
    ("max_pending=1000, 10% full", b1000, 1000, 100),
    ("max_pending=1000, 90% full", b1000, 1000, 900),
    ("max_pending=10000, 10% full", b10000, 10_000, 1000),
    ("max_pending=10000, 90% full", b10000, 10_000, 9000),
]
EXECUTIONS = f"{queue.tables.schema}.{queue.tables.prefix}job_executions"
#: Rows of another task in the table, so that no count can pass for cheap by scanning it.
OTHER_BACKLOG = 20_000


def fill(engine: Engine, task: str, rows: int, first_id: int) -> None:
    """Write ``rows`` pending executions of ``task`` (ids from ``first_id``)."""
    with engine.begin() as connection:
        connection.execute(
            text(
                f"INSERT INTO {EXECUTIONS} (id, task, priority, state, execute_at) "
                "SELECT g, :task, 0, 'pending', now() + interval '1 day' "
                "FROM generate_series(:first, :last) AS g"
            ),
            {"task": task, "first": first_id, "last": first_id + rows - 1},
        )


def time_calls(engine: Engine, handle: object, calls: int) -> list[float]:
    """Milliseconds of ``calls`` enqueues, each in a transaction rolled back afterwards."""
    times: list[float] = []
    with Session(engine) as session:
        for n in range(calls):
            session.begin()
            began = time.perf_counter()
            handle.enqueue(session, n)  # type: ignore[attr-defined]
            times.append((time.perf_counter() - began) * 1000)
            session.rollback()
    return times


def percentile(values: list[float], pct: float) -> float:
    """The ``pct`` percentile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def main() -> None:
    """Run the cases and print p50/p99 per case and their ratios to the unbounded task."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an admin URL of the server (default: the test server's)")
    parser.add_argument("--calls", type=int, default=600, help="enqueues per case")
    parser.add_argument("--rounds", type=int, default=6, help="turns each case takes")
    args = parser.parse_args()
    factory = DatabaseFactory(args.url or resolve_test_admin_url())
    url = factory.clone("template0")
    try:
        engine = create_engine(url)
        with engine.begin() as connection:
            queue.create_all(connection)
        next_id = 10_000_000
        fill(engine, "other", OTHER_BACKLOG, next_id)
        next_id += OTHER_BACKLOG
        # The 10% cases run first; the 90% cases then add to the same tasks' backlogs.
        results: dict[str, list[float]] = {label: [] for label, *_ in CASES}
        per_round = max(1, args.calls // args.rounds)
        held: dict[str, int] = {}
        for phase in ("10%", "90%"):
            for label, handle, bound, rows in CASES:
                if bound is not None and phase in label:
                    fill(engine, handle.name, rows - held.get(handle.name, 0), next_id)
                    next_id += rows
                    held[handle.name] = rows
            with engine.begin() as connection:
                connection.execute(text(f"ANALYZE {EXECUTIONS}"))
            chosen = [c for c in CASES if c[2] is None or phase in c[0]]
            for _label, handle, *_ in chosen:
                time_calls(engine, handle, 20)  # warm up: compile caches, prepared plans
            for _ in range(args.rounds):
                for label, handle, *_ in chosen:
                    results[label].extend(time_calls(engine, handle, per_round))
        engine.dispose()
    finally:
        factory.drop(url)

    base50 = percentile(results["unbounded"], 50)
    base99 = percentile(results["unbounded"], 99)
    print(f"enqueue latency, one job per transaction ({per_round * args.rounds} calls per case,")
    print(f"unbounded measured in both phases; {OTHER_BACKLOG} rows of another task in the table)")
    print(f"{'case':<30} {'p50 ms':>8} {'p99 ms':>8} {'p50 x':>7} {'p99 x':>7}")
    for label, *_ in CASES:
        values = results[label]
        p50, p99 = percentile(values, 50), percentile(values, 99)
        print(f"{label:<30} {p50:8.3f} {p99:8.3f} {p50 / base50:7.2f} {p99 / base99:7.2f}")
    print(f"(mean of all unbounded calls: {statistics.fmean(results['unbounded']):.3f} ms)")


if __name__ == "__main__":
    main()
