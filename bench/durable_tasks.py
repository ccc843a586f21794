"""The durable-execution benchmark's tasks and its worker process
(``python -m bench.durable_tasks``).

The tasks live on the benchmark application's queue (:data:`bench.app.queue`), so the
scratch database of :class:`~bench.common.BenchDatabase` already has their tables; the
one table of their own writes, :data:`WRITES_DDL`, is created by :mod:`bench.durable`.
The worker process keeps :mod:`bench.worker`'s contract: it connects, prints ``READY``,
waits for ``GO`` on stdin, works until SIGTERM, then prints one JSON report.

Times are ``time.time()``: the same realtime clock as the server's ``clock_timestamp()``
and as the benchmark's own process on this host.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from bench import app
from bench.worker import _handshake, _report
from sqla_queue import JobContext

__all__ = ["DURABLE_TASKS", "SIGNAL", "SLEEPER", "STEPS", "WRITES_DDL", "main"]

queue = app.queue

#: ``steps`` steps, each one row written through ``ctx.session`` with its checkpoint.
STEPS = "bench.durable.steps"
#: Waits for signal ``go``, then one step that returns when it started.
SIGNAL = "bench.durable.signal"
#: Sleeps a day: the suspended jobs of the claim-cost section are clones of one of these.
SLEEPER = "bench.durable.sleeper"
#: The tasks a durable worker serves (the plain drain's no-op included).
DURABLE_TASKS = (STEPS, SIGNAL, SLEEPER, app.NOOP)
#: The signal the round trip sends.
GO = "go"

#: The steps' business table: one row per step, keyed so a step that committed twice fails.
WRITES_DDL = (
    "CREATE TABLE IF NOT EXISTS bench_durable_writes "
    "(job_id bigint NOT NULL, step int NOT NULL, PRIMARY KEY (job_id, step))"
)
_INSERT = text("INSERT INTO bench_durable_writes (job_id, step) VALUES (:job, :step)")


def _write(session: Session, job_id: int, step: int) -> int:
    session.execute(_INSERT, {"job": job_id, "step": step})
    return step


@queue.task(name=STEPS, pass_context=True)
def steps(ctx: JobContext[Session], count: int = 10) -> dict[str, float]:
    """``count`` steps, each writing one row; when the first began and the last committed."""
    began = time.time()
    for i in range(count):
        ctx.run_step(f"s{i}", _write, ctx.session, ctx.job_id, i)
    return {"began": began, "ended": time.time()}


@queue.task(name=SIGNAL, pass_context=True)
def signal_round(ctx: JobContext[Session]) -> float:
    """Wait for signal ``go``; then the start time of the step after it (epoch seconds)."""
    ctx.wait_for_signal(GO)
    at: float = ctx.run_step("after", time.time)
    return at


@queue.task(name=SLEEPER, pass_context=True)
def sleeper(ctx: JobContext[Session]) -> None:
    """Sleep a day: a suspended job that no claim should pay for."""
    ctx.sleep(86_400)


def run_worker(args: argparse.Namespace) -> None:
    """A sync worker over :data:`DURABLE_TASKS`, with LISTEN, until SIGTERM."""
    engine = create_engine(args.url, pool_size=max(2, args.concurrency + 1))
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    worker = queue.worker(
        sessionmaker(engine),
        concurrency=args.concurrency,
        tasks=list(DURABLE_TASKS),
        poll_interval=args.poll_interval,
    )
    _handshake()
    # run() stops gracefully at SIGTERM (its own signal handlers).
    stats: Any = worker.run()
    engine.dispose()
    _report(claimed=stats.claimed)


def main(argv: list[str] | None = None) -> None:
    """Run one worker process."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    parser = argparse.ArgumentParser(prog="python -m bench.durable_tasks")
    parser.add_argument("--url", required=True, help="SQLAlchemy URL of the scratch database")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    run_worker(parser.parse_args(argv))


if __name__ == "__main__":
    main()
