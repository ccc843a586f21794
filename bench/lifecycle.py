"""The own costs of issue 14's features: a unique enqueue, and ``queue.result()``'s wake-up.

    python -m bench.lifecycle                      # about a minute
    python -m bench.lifecycle --transactions 5000 --results 500

1. Enqueue: one process, one pooled connection, business transactions (an ORM session
   that inserts an order) alternating kind by kind, transaction by transaction, so the
   machine's noise falls on every kind alike (as ``bench.enqueue.same_client_cost``):
   no job; a plain ``task.enqueue``; a unique enqueue that takes a new key (the key's row
   is inserted, locked, and bound to the new job: two statements more than a plain
   enqueue); and a unique enqueue of a key a queued job holds (``on_duplicate="ignore"``:
   only the key statement runs, no job is written). Medians and 99th percentiles of the
   whole transaction, and the time each kind adds to the transaction without a job.
2. ``queue.result()``: one sync worker process (the CLI) runs a job that sleeps 20 ms;
   the producer commits the job, calls ``queue.result(engine, job_id)`` at once (so it is
   waiting on LISTEN when the job completes) and notes the time it returns. The figure is
   that time minus the job's ``finished_at`` (the completion's database clock, same
   machine): the wake-up, from the completing transaction to the caller having the value.
   The same with ``await queue.result(async_engine, ...)``.

The figures go to stdout; ``--json PATH`` writes them as JSON too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, select
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from bench import app
from bench.common import ROOT, BenchDatabase, TextTable, percentile, resolve_server_url
from bench.drain import truncate_all

__all__ = ["enqueue_costs", "result_latency"]

queue = app.queue
SLEEPER = "bench.sleep20"


def _sleep20(n: int = 0) -> int:
    """Run for 20 ms, so that the caller of ``result()`` is already waiting."""
    time.sleep(0.02)
    return n


queue.task(name=SLEEPER)(_sleep20)


def enqueue_costs(db: BenchDatabase, transactions: int) -> dict[str, list[float]]:
    """Wall seconds of every counted transaction, per kind (see the module docstring)."""
    truncate_all(db)
    with db.connect() as conn:
        conn.execute(f"TRUNCATE {queue.tables.unique_keys.fullname}")
    engine = create_engine(db.url, pool_size=1)
    noop = queue.get_task(app.NOOP)
    with Session(engine) as session, session.begin():
        noop.options(unique_key="held").enqueue(session, n=-1)  # the holder, never run
    bodies: dict[str, Callable[[Session, int], object] | None] = {
        "no job": None,
        "plain enqueue": lambda s, i: noop.enqueue(s, n=i),
        "unique, new key": lambda s, i: noop.options(unique_key=f"k{i}").enqueue(s, n=i),
        "unique, key held (ignore)": lambda s, i: noop.options(unique_key="held").enqueue(s, n=i),
    }
    walls: dict[str, list[float]] = {kind: [] for kind in bodies}
    try:
        for i in range(-200, transactions):  # the first 200 of each warm up, uncounted
            for kind, body in bodies.items():
                started = time.perf_counter()
                with Session(engine) as session, session.begin():
                    session.add(app.Order(total=i))
                    if body is not None:
                        body(session, i)
                if i >= 0:
                    walls[kind].append(time.perf_counter() - started)
    finally:
        engine.dispose()
    return walls


def _start_worker(url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "sqla_queue", "--log-level", "ERROR", "worker"]
    command += ["bench.lifecycle:queue", "--url", url, "--tasks", SLEEPER, "--concurrency", "1"]
    return subprocess.Popen(command, cwd=ROOT, env=env)


def result_latency(db: BenchDatabase, jobs: int) -> dict[str, list[float]]:
    """Seconds from each job's completion to ``result()`` returning, sync and async."""
    truncate_all(db)
    engine = create_engine(db.url, pool_size=2)
    async_engine = create_async_engine(db.url, pool_size=2)
    sleeper = queue.get_task(SLEEPER)
    jobs_t = queue.tables.jobs
    worker = _start_worker(db.url)
    found: dict[str, list[float]] = {"sync": [], "async": []}
    loop = asyncio.new_event_loop()
    try:
        for i in range(-20, jobs):  # the first 20 warm up (worker start-up, connections)
            for face, seen in found.items():
                with Session(engine) as session, session.begin():
                    job_id = sleeper.enqueue(session, n=i)
                if face == "sync":
                    value = queue.result(engine, job_id, timeout=60)
                else:
                    value = loop.run_until_complete(queue.result(async_engine, job_id, timeout=60))
                returned = time.time()
                assert value == i, (value, i)
                with engine.connect() as conn:
                    finished = conn.scalar(
                        select(jobs_t.c.finished_at).where(jobs_t.c.id == job_id)
                    )
                if i >= 0:
                    seen.append(returned - finished.timestamp())
    finally:
        worker.terminate()
        worker.wait(30)
        loop.run_until_complete(async_engine.dispose())
        loop.close()
        engine.dispose()
    return found


def main(argv: list[str] | None = None) -> int:
    """Run both measurements and print their tables."""
    parser = argparse.ArgumentParser(prog="python -m bench.lifecycle", description=__doc__)
    parser.add_argument("--url", help="PostgreSQL server to use (any database on it)")
    parser.add_argument("--transactions", type=int, default=2_000, help="per enqueue kind")
    parser.add_argument("--results", type=int, default=200, help="result() calls per face")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {}
    with BenchDatabase(resolve_server_url(args.url)) as db:
        walls = enqueue_costs(db, args.transactions)
        latencies = result_latency(db, args.results)
    base = percentile(walls["no job"], 50)
    plain = percentile(walls["plain enqueue"], 50)
    table = TextTable(
        f"Enqueue in a business transaction, {args.transactions:,} per kind, alternating",
        ["transaction", "p50 ms", "p99 ms", "added ms (p50)", "vs plain enqueue"],
    )
    for kind, values in walls.items():
        p50, p99 = percentile(values, 50), percentile(values, 99)
        figures[f"enqueue/{kind}"] = {"p50_ms": 1000 * p50, "p99_ms": 1000 * p99}
        table.add(
            kind,
            f"{1000 * p50:.3f}",
            f"{1000 * p99:.3f}",
            "-" if kind == "no job" else f"{1000 * (p50 - base):.3f}",
            "-" if kind == "no job" else f"{(p50 - base) / (plain - base):.2f}x",
        )
    print(table.render())
    table = TextTable(
        f"result(): from the job's completion to the caller having its value, {args.results} jobs",
        ["face", "p50 ms", "p90 ms", "p99 ms", "max ms"],
    )
    for face, values in latencies.items():
        marks = {p: 1000 * percentile(values, p) for p in (50, 90, 99, 100)}
        figures[f"result/{face}"] = {f"p{p}_ms": v for p, v in marks.items()}
        table.add(face, *(f"{v:.2f}" for v in marks.values()))
    print(table.render())
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
