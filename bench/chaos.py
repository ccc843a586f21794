"""Chaos drain, the long version: SIGKILL workers and cut their connections while they work.

The same scenario as ``tests/acceptance/test_chaos.py`` (see ``tests/support/chaos.py``),
with sizes and rhythm as flags. It prints a summary and exits 1 when any job is missing or
any extra execution is unexplained::

    python bench/chaos.py --jobs 100000 --workers 8 --kill-every 1.5 --terminations 10

Without ``--url`` it creates a scratch database on the test server (``$SQLA_QUEUE_TEST_URL``,
else 127.0.0.1:5432, else an embedded one) and drops it afterwards. With ``--url`` the
database gets the test app's tables if it lacks them. Careful: the backend sweeps terminate
every client session of that database, not only the workers'.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    # The scenario and the worker target live in the test package.
    sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, create_engine  # noqa: E402

from sqla_queue.testing.databases import DatabaseFactory, resolve_test_admin_url  # noqa: E402
from tests.support.app import Base, queue  # noqa: E402
from tests.support.chaos import ChaosConfig, run_chaos, summary, verify_chaos  # noqa: E402


def create_app_schema(engine: Engine) -> None:
    """Create the queue's tables and the test app's own tables, where missing."""
    with engine.begin() as connection:
        queue.create_all(connection)
        Base.metadata.create_all(
            connection, tables=[t for t in Base.metadata.sorted_tables if t.schema is None]
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    defaults = ChaosConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="database to use (default: a scratch database)")
    parser.add_argument("--jobs", type=int, default=defaults.jobs)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument(
        "--kill-every",
        type=float,
        default=defaults.kill_every,
        help="seconds between SIGKILLs (jittered by 25%%); 0 disables them",
    )
    parser.add_argument(
        "--terminations",
        type=int,
        default=defaults.terminations,
        help="pg_terminate_backend sweeps, spread evenly over the drain",
    )
    parser.add_argument(
        "--pause", type=float, default=defaults.pause, help="seconds each job sleeps"
    )
    parser.add_argument("--poll-interval", type=float, default=defaults.poll_interval)
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="give up draining after this long"
    )
    parser.add_argument("--seed", type=int, help="random seed of the kill schedule")
    parser.add_argument("--logs", type=Path, help="keep worker logs here (default: temporary)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one chaos drain and print what happened."""
    args = parse_args(argv)
    config = ChaosConfig(
        jobs=args.jobs,
        workers=args.workers,
        concurrency=args.concurrency,
        kill_every=args.kill_every if args.kill_every > 0 else float("inf"),
        terminations=args.terminations,
        pause=args.pause,
        poll_interval=args.poll_interval,
        timeout=args.timeout,
        seed=args.seed,
    )
    factory: DatabaseFactory | None = None
    if args.url:
        url = args.url
    else:
        factory = DatabaseFactory(resolve_test_admin_url())
        url = factory.clone("template0")
    started = time.monotonic()

    def say(message: str) -> None:
        if not args.quiet:
            print(f"[{time.monotonic() - started:7.1f}s] {message}", flush=True)

    try:
        engine = create_engine(url)
        try:
            create_app_schema(engine)
        finally:
            engine.dispose()
        with tempfile.TemporaryDirectory(prefix="sqlaq-chaos-") as scratch:
            log_dir = args.logs or Path(scratch)
            log_dir.mkdir(parents=True, exist_ok=True)
            run = run_chaos(url, config, log_dir, on_progress=say)
            report = verify_chaos(url, run)
    finally:
        if factory is not None:
            factory.drop(url)
    print(summary(run, report))
    ok = run.drained_at is not None and not report.problems
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
