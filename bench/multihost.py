"""Drain across hosts: the same N jobs drained by worker processes spread over 4 network
namespaces, and by as many worker processes in 1 namespace, against one server.

    sudo python -m bench.multihost [--jobs 20000] [--workers 8] [--hosts 4] [--rounds 1]

It needs root, ``ip netns`` and the PostgreSQL server binaries: it makes its own
namespaces, bridge, veth pairs and server exactly as ``tests/acceptance/test_multihost.py``
does (see ``tests/support/netns.py`` and ``tests/support/multihost.py``), and removes them
at the end. Each drain runs the test's task (a handler that does nothing; the worker
batches its completions, and database triggers record each claim and each job's
completion) on fresh tables: the workers start in their namespaces, connect, open their
connections and wait at a start barrier while the jobs are enqueued. The clock runs
from the barrier to the last commit, on the database clock. Latency is per job, from
its claim's write to its completion's commit (its wait in the worker's batch, the round
trips over its host's link and its wait for a CPU), p50 and p99. Both layouts use
the same server, the same worker settings and the same path (a veth into the bridge);
only the number of namespaces differs. The layouts take turns over the rounds. Every
drain is checked (:func:`tests.support.multihost.verify_multihost`): each job succeeded
with exactly one committed completion, of its last claim.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    # The network, the server and the worker entry point live in the test package.
    sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, create_engine, text  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

from tests.support.clusters import cluster_skip_reason  # noqa: E402
from tests.support.multihost import (  # noqa: E402
    RECORDS,
    Environment,
    MultihostConfig,
    queue,
    run_multihost,
    verify_multihost,
)
from tests.support.multihost import environment as make_environment  # noqa: E402
from tests.support.netns import netns_skip_reason  # noqa: E402


def reset(engine: Engine) -> None:
    """Empty the queue's tables and the record tables between drains."""
    tables = [queue.tables.executions, queue.tables.jobs, *RECORDS]
    names = ", ".join(t.fullname for t in tables)
    with engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {names}"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("CHECKPOINT"))


def drain(
    env: Environment, admin: Engine, config: MultihostConfig, scratch: Path, label: str
) -> tuple[float, float, float]:
    """One drain; returns (jobs/s, p50 ms, p99 ms). Exits 1 when the check fails."""
    reset(admin)
    log_dir = Path(tempfile.mkdtemp(prefix="drain-", dir=scratch))
    run = run_multihost(env.topology, admin, env.host_url, config, log_dir)
    report = verify_multihost(admin, run)
    if report.problems or report.jobs_per_second is None:
        print(f"{label}: FAILED")
        print("\n".join(report.problems[:20]))
        sys.exit(1)
    assert report.latency_p50_ms is not None
    assert report.latency_p99_ms is not None
    print(
        f"  {label}: {report.jobs_per_second:,.0f} jobs/s, p50 {report.latency_p50_ms:.1f} ms, "
        f"p99 {report.latency_p99_ms:.1f} ms ({report.drain_seconds:.1f}s)",
        flush=True,
    )
    return report.jobs_per_second, report.latency_p50_ms, report.latency_p99_ms


def main() -> int:
    """Run the layouts in turns and print jobs/s, p50/p99 latency and their ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--workers", type=int, default=8, help="worker processes per drain")
    parser.add_argument("--hosts", type=int, default=4, help="namespaces of the spread layout")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=MultihostConfig().concurrency,
        help="handlers (and claim batch) per worker, as in the test",
    )
    parser.add_argument("--rounds", type=int, default=1, help="drains of each layout")
    args = parser.parse_args()
    if args.workers % args.hosts:
        parser.error("--workers must be a multiple of --hosts")
    reason = netns_skip_reason() or cluster_skip_reason()
    if reason is not None:
        print(f"cannot run: {reason}")
        return 2
    layouts = {
        f"{args.hosts} hosts x {args.workers // args.hosts}": (
            args.hosts,
            args.workers // args.hosts,
        ),
        f"1 host x {args.workers}": (1, args.workers),
    }
    results: dict[str, list[tuple[float, float, float]]] = {label: [] for label in layouts}
    began = time.monotonic()
    with (
        make_environment(args.hosts) as env,
        tempfile.TemporaryDirectory(prefix="sqqt-bench-") as scratch,
    ):
        admin = create_engine(env.admin_url, poolclass=NullPool)
        try:
            for round_no in range(args.rounds):
                print(f"round {round_no + 1}/{args.rounds}", flush=True)
                # Alternate which layout goes first, so drift in the machine's load is shared.
                order = list(layouts.items())
                if round_no % 2:
                    order.reverse()
                for label, (hosts, per_host) in order:
                    config = MultihostConfig(
                        jobs=args.jobs,
                        hosts=hosts,
                        workers_per_host=per_host,
                        concurrency=args.concurrency,
                        batch=args.concurrency,
                        cut_at=None,
                    )
                    results[label].append(drain(env, admin, config, Path(scratch), label))
        finally:
            admin.dispose()

    print(
        f"\n{args.jobs:,} jobs, {args.workers} worker processes (concurrency "
        f"{args.concurrency}), 1 server, median of {args.rounds} "
        f"({time.monotonic() - began:.0f}s in all)"
    )
    print(f"{'layout':<16} {'jobs/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    medians = {}
    for label, rows in results.items():
        rate, p50, p99 = (statistics.median(column) for column in zip(*rows, strict=True))
        medians[label] = (rate, p50, p99)
        print(f"{label:<16} {rate:9,.0f} {p50:8.1f} {p99:8.1f}")
    (spread, one) = medians.values()
    print(
        f"ratio spread/1 host: jobs/s {spread[0] / one[0]:.2f}x, p50 {spread[1] / one[1]:.2f}x, "
        f"p99 {spread[2] / one[2]:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
