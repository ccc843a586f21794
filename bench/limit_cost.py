"""One slot-aware claim at limit 10 and at limit 5000, with the same number of running rows.

The bench.run "limits" scenario lets running rows pile up over its 300 claims, so its two
limits end with different numbers of seats held. This script holds that number fixed, which
isolates the one thing the limit could change: the free-seat search.

    python -m bench.limit_cost [--url URL] [--running 0,1000] [--claims 200]

With 0 running both limits claim a full batch, so their ratio compares like with like.
More running seats cost the claim a count over them at any limit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text, update
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqla_queue import statements
from sqla_queue.testing.databases import DatabaseFactory, resolve_test_admin_url
from tests.support.limited import limited3, queue

TASK = "limited3"
#: Claims before timing starts: psycopg prepares a statement on its sixth run.
WARM_UP = 10


def _params(batch: int) -> dict[str, Any]:
    return {
        "tasks": [TASK],
        "batch": batch,
        "worker": uuid.uuid4(),
        "lease": 30.0,
        "lease_map": "{}",
        "limit_map": json.dumps({TASK: 3}),
        "seat_offset": 12345,
    }


def measure(engine: Engine, limit: int, running: int, claims: int) -> list[float]:
    """Claim times (ms) at ``limit`` with ``running`` seats held; each claim rolled back."""
    ex = queue.tables.executions
    stmt = statements.claim_statement(queue.tables, limited=True)
    with Session(engine) as session, session.begin():
        queue.set_limit(session, TASK, max(limit, running))
    with engine.begin() as connection:
        connection.execute(
            update(ex)
            .where(ex.c.state == "running")
            .values(state="pending", slot=None, worker_id=None, alive_at=None)
        )
        for start in range(0, running, 10):
            connection.execute(stmt, _params(min(10, running - start))).all()
        connection.execute(text("ANALYZE"))
    times: list[float] = []
    guard = statements.planner_guard(generic_plans=True)
    with engine.connect() as connection:
        for i in range(claims + WARM_UP):
            # As in a worker's transaction: the planner guard first (generic plans once
            # prepared, no JIT), outside the time measured.
            connection.execute(guard)
            began = time.perf_counter()
            connection.execute(stmt, _params(10)).all()
            if i >= WARM_UP:
                times.append((time.perf_counter() - began) * 1000)
            connection.rollback()
    return sorted(times)


def main() -> None:
    """Print claim p50/p95 at limit 10 and 5000 for each number of running seats."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="admin URL of the server (default: the test server)")
    parser.add_argument("--running", default="0", help="seats held, comma-separated")
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--backlog", type=int, default=100_000)
    args = parser.parse_args()
    factory = DatabaseFactory(args.url or resolve_test_admin_url())
    url = factory.clone("template0")
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            queue.create_all(connection)
        with Session(engine) as session, session.begin():
            queue.enqueue_many(session, [limited3.call() for _ in range(args.backlog)])
        print(f"one claim of 10, {args.backlog:,} pending jobs of a limited task (ms)")
        print(f"{'running':>8} {'limit':>6} {'p50':>7} {'p95':>7}")
        for running in [int(n) for n in args.running.split(",")]:
            results = {}
            for limit in (10, 5000):
                if running > limit:
                    continue
                times = measure(engine, limit, running, args.claims)
                p50 = statistics.median(times)
                results[limit] = p50
                print(f"{running:>8} {limit:>6} {p50:>7.2f} {times[int(len(times) * 0.95)]:>7.2f}")
            # Only with room left at both limits do both claims do the same work.
            if len(results) == 2 and running + 10 <= 10:
                print(f"{'':>8} ratio 5000/10: {results[5000] / results[10]:.2f}x")
    finally:
        engine.dispose()
        factory.drop(url)


if __name__ == "__main__":
    main()
