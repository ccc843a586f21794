"""The workflow benchmark's tasks and its worker process (``python -m bench.workflow_tasks``).

The tasks live on the benchmark application's queue (:data:`bench.app.queue`), so the
scratch database of :class:`~bench.common.BenchDatabase` already has their tables. The
worker process keeps :mod:`bench.worker`'s contract: it connects, prints ``READY``, waits
for ``GO`` on stdin, works until SIGTERM, then prints one JSON report.

Handlers that the latency figures read return ``time.time()`` taken as their first line:
the same clock as the server's ``clock_timestamp()`` when the server runs on this host.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from bench import app
from bench.worker import _handshake, _report
from sqla_queue import JobContext

__all__ = ["JOIN", "LEAF", "STEP", "WF_TASKS", "main"]

queue = app.queue

#: A fan-out child: does nothing (the benchmark measures the queue, not the work).
LEAF = "bench.wf.leaf"
#: A fan-in callback: returns when it started; it does not read its parents' results.
JOIN = "bench.wf.join"
#: A chain step: returns when it started.
STEP = "bench.wf.step"
#: The tasks a workflow worker serves (the plain drain's no-op included).
WF_TASKS = (LEAF, JOIN, STEP, app.NOOP)


@queue.task(name=LEAF)
def leaf(n: int = 0) -> None:
    """A child of a chord: nothing to do."""


@queue.task(name=JOIN, pass_context=True)
def join(ctx: JobContext[Session], n: int = 0) -> float:
    """The callback of a chord: its start time (epoch seconds)."""
    return time.time()


@queue.task(name=STEP)
def step(n: int = 0) -> float:
    """A step of a chain: its start time (epoch seconds)."""
    return time.time()


def run_worker(args: argparse.Namespace) -> None:
    """A sync worker over :data:`WF_TASKS`, with LISTEN, until SIGTERM."""
    engine = create_engine(args.url, pool_size=2)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    worker = queue.worker(
        sessionmaker(engine),
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        tasks=list(WF_TASKS),
        poll_interval=args.poll_interval,
    )
    _handshake()
    # run() stops gracefully at SIGTERM (its own signal handlers).
    stats = worker.run()
    engine.dispose()
    _report(claimed=stats.claimed)


def main(argv: list[str] | None = None) -> None:
    """Run one worker process."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    parser = argparse.ArgumentParser(prog="python -m bench.workflow_tasks")
    parser.add_argument("--url", required=True, help="SQLAlchemy URL of the scratch database")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--prefetch", type=int, default=0)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    run_worker(parser.parse_args(argv))


if __name__ == "__main__":
    main()
