"""The drain through PgBouncer in transaction mode, beside the same drain on direct connections.

``python -m bench.pgbouncer_drain`` from the repository root. It starts a PgBouncer of its
own (``pool_mode = transaction``, on a free loopback port, as the tests do: see
tests/support/pgbouncer.py; ``bash .ci/install_pgbouncer.sh`` installs Debian's), creates
the scratch database of the other scenarios, and runs the plain drain of scenario 1 (N
no-op jobs pre-enqueued, W worker processes, cold protocol) twice per repeat and system:
the workers' engines on the server directly, and through PgBouncer with psycopg's
prepared statements off (PgBouncer 1.18 keeps none) and LISTEN on a direct connection
(``listen_url``), as docs/guides/pgbouncer.md recommends. The order of the two alternates
between repeats.

Printed per system and path: jobs per second (median and range of the repeats), p50 and
p99 of the jobs' completion times counted from the start barrier (when half, and 99 %, of
the drain was done; medians of the repeats), the workers' CPU per job, and the ratio of
the PgBouncer rate to the direct one.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.common import (
    BenchDatabase,
    TextTable,
    fmt_rate,
    fmt_ratio,
    ratio,
    resolve_server_url,
    summarize,
)
from bench.drain import DrainRun, drain_once

__all__ = ["main", "run_pgbouncer_drain"]

PATHS = ("direct", "pgbouncer")
SYSTEMS = ("sqla-sync", "sqla-async", "sqla-sync-prefetch", "sqla-async-prefetch")


def _completion_percentiles(db: BenchDatabase, run: DrainRun) -> tuple[float, float]:
    """Seconds from the start barrier to the p50 and p99 completion of ``run``'s jobs."""
    with db.connect() as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(finished_at)), "
            "extract(epoch FROM percentile_disc(0.5) WITHIN GROUP (ORDER BY finished_at)), "
            "extract(epoch FROM percentile_disc(0.99) WITHIN GROUP (ORDER BY finished_at)) "
            "FROM sqla_queue_jobs WHERE status = 'succeeded'"
        ).fetchone()
    assert row is not None
    last, p50, p99 = (float(v) for v in row)
    start = last - run.seconds
    return p50 - start, p99 - start


def run_pgbouncer_drain(
    server_url: str,
    *,
    jobs: int,
    workers: int,
    batch: int,
    repeat: int,
    systems: Sequence[str],
    log: Any = print,
) -> TextTable:
    """Run the drains and return their table (see the module docstring)."""
    from tests.support.pgbouncer import start_pgbouncer

    bouncer = start_pgbouncer(server_url, pool_size=max(10, 3 * workers))
    results: dict[tuple[str, str], list[tuple[DrainRun, float, float]]] = {}
    try:
        with BenchDatabase(server_url) as db:
            through = bouncer.url(db.url)
            for i in range(repeat):
                for system in systems:
                    order = PATHS if i % 2 == 0 else PATHS[::-1]
                    for path in order:
                        extra = ["--through", through] if path == "pgbouncer" else []
                        run = drain_once(db, system, workers, batch, jobs, extra_args=extra)
                        p50, p99 = _completion_percentiles(db, run)
                        results.setdefault((system, path), []).append((run, p50, p99))
                        log(
                            f"  {system:<10} {path:<9} repeat {i + 1}: "
                            f"{run.rate(jobs):,.0f} jobs/s, p50 {1000 * p50:.0f} ms, "
                            f"p99 {1000 * p99:.0f} ms"
                        )
    finally:
        bouncer.stop()
    table = TextTable(
        f"Drain of {jobs:,} no-op jobs, {workers} worker processes, batch {batch}: "
        "direct vs through PgBouncer (transaction mode)",
        ["system", "path", "jobs/s", "p50 done (ms)", "p99 done (ms)", "CPU us/job", "vs direct"],
    )
    for system in systems:
        direct_rate = math.nan
        for path in PATHS:
            runs = results[(system, path)]
            rate = summarize([run.rate(jobs) for run, _, _ in runs])
            if path == "direct":
                direct_rate = rate.median
            table.add(
                system,
                path,
                fmt_rate(rate),
                f"{1000 * statistics.median(p50 for _, p50, _ in runs):.0f}",
                f"{1000 * statistics.median(p99 for _, _, p99 in runs):.0f}",
                f"{statistics.median(run.cpu_us_per_job(jobs) for run, _, _ in runs):.0f}",
                fmt_ratio(ratio(rate.median, direct_rate)),
            )
    table.note(
        "p50/p99 done: time from the start barrier until half / 99 % of the jobs had "
        "finished (median of the repeats). Through PgBouncer: prepare_threshold=None, "
        "LISTEN on a direct connection (listen_url)."
    )
    return table


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="any database on the server (default: the test server)")
    parser.add_argument("--jobs", type=int, default=5_000, help="jobs per drain (5,000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--batch", type=int, default=10, help="concurrency and batch (10)")
    parser.add_argument("--repeat", type=int, default=3, help="repeats of each drain (3)")
    parser.add_argument(
        "--systems",
        default="sqla-sync,sqla-async",
        help="comma-separated, of " + ", ".join(SYSTEMS) + " (default sqla-sync,sqla-async)",
    )
    args = parser.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    started = time.monotonic()
    table = run_pgbouncer_drain(
        resolve_server_url(args.url),
        jobs=args.jobs,
        workers=args.workers,
        batch=args.batch,
        repeat=args.repeat,
        systems=systems,
    )
    print()
    print(table.render())
    print(f"\n({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
