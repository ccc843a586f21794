"""Chancy's workflow plugin as a peer of :mod:`bench.workflows` (PyPI ``chancy``).

``python -m bench.workflow_chancy --dsn DSN --concurrency N`` is one Chancy worker with
:mod:`bench.worker`'s contract (``READY``, ``GO``, work until SIGTERM, one JSON report).
The other functions drive Chancy from the benchmark's process. Chancy's tables (its
own migrations, prefix ``chancy_``) live in a scratch database of their own.

Set-up, as generous to Chancy as its options allow: the asyncio executor (its default
runs each job in a process pool), ``eager_polling`` and a 1 s poll (its least) on one
queue, the leadership poll at 1 s (the workflow plugin works only on the leader), the
workflow plugin's own poll at 1 s (a workflow pushed while no worker listened waits for
it), and completions written every 10 ms instead of every second
(``send_outgoing_interval``).
Chancy keeps no job result: a join or step handler inserts its start time (taken first)
into ``bench_chancy_starts``. A job's completion moment is its ``completed_at`` (set by
the worker when the job ends, before its batched write).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import Any

import psycopg
from chancy import job
from psycopg.rows import dict_row

from bench.worker import peak_rss_mb

__all__ = ["QUEUE", "chain", "chord", "fan_in", "install", "main", "plain", "write"]

QUEUE = "bench"
#: Seconds between the worker's batched writes of job updates (Chancy's default: 1).
OUTGOING_S = 0.01
STARTS_DDL = "CREATE TABLE IF NOT EXISTS bench_chancy_starts (tag text PRIMARY KEY, at float8)"

_conn: dict[str, Any] = {}
#: Where the worker tells its jobs the database's DSN.
DSN_VARIABLE = "BENCH_CHANCY_DSN"


async def _stamp(tag: str) -> None:
    at = time.time()
    conn = _conn.get("starts")
    if conn is None:
        # The worker runs as __main__ while Chancy imports the jobs from this module by
        # name: the environment is what both copies of the module share.
        dsn = os.environ[DSN_VARIABLE]
        conn = _conn["starts"] = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await conn.execute("INSERT INTO bench_chancy_starts VALUES (%s, %s)", (tag, at))


@job(queue=QUEUE)
async def leaf(n: int = 0, tag: str = "") -> None:
    """A chord's child: nothing to do."""


@job(queue=QUEUE)
async def join(tag: str = "") -> None:
    """A chord's callback: records its start."""
    await _stamp(tag)


@job(queue=QUEUE)
async def step(n: int = 0, tag: str = "") -> None:
    """A chain's step: records its start."""
    await _stamp(tag)


def _app(dsn: str, *, worker: bool = False) -> Any:
    from chancy import Chancy
    from chancy.plugins.leadership import Leadership
    from chancy.plugins.workflow import WorkflowPlugin

    plugins = (
        [Leadership(poll_interval=1, timeout=3), WorkflowPlugin(polling_interval=1)]
        if worker
        else []
    )
    # Warnings only, on stderr: its default logs a line per job to stdout, where the
    # worker's report goes (a pipe read at the end, which would fill and stall it).
    log = logging.getLogger("bench.chancy")
    log.setLevel(logging.WARNING)
    if not log.handlers:
        log.addHandler(logging.StreamHandler(sys.stderr))
    return Chancy(
        dsn,
        plugins=plugins,
        no_default_plugins=not worker,
        max_connection_pool_size=4,
        log=log,
    )


async def _install(dsn: str) -> None:
    from chancy import Queue

    # The worker's plugins, so that their tables (the workflow plugin's) are migrated too.
    async with _app(dsn, worker=True) as app:
        await app.migrate()
        await app.declare(
            Queue(
                QUEUE,
                concurrency=10,
                executor="chancy.executors.asyncex.AsyncExecutor",
                polling_interval=1,
                eager_polling=True,
            ),
            upsert=True,
        )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(STARTS_DDL)


def install(dsn: str) -> None:
    """Chancy's tables (its workflow plugin's included), the queue, the starts table."""
    asyncio.run(_install(dsn))


def _chord(children: int, tag: str) -> Any:
    from chancy.plugins.workflow import Workflow

    wf = Workflow(f"chord-{tag}")
    for i in range(children):
        wf.add(f"c{i}", leaf.job.with_kwargs(n=i, tag=tag))
    wf.add("join", join.job.with_kwargs(tag=tag), [f"c{i}" for i in range(children)])
    return wf


async def _write(dsn: str, children: int) -> tuple[float, float]:
    from chancy.plugins.workflow import WorkflowPlugin

    async with _app(dsn) as app:
        began = time.perf_counter()
        await WorkflowPlugin.push(app, _chord(children, "w"))
        flow_s = time.perf_counter() - began
        jobs = [leaf.job.with_kwargs(n=i) for i in range(children + 1)]
        began = time.perf_counter()
        async with (
            app.pool.connection() as conn,
            conn.transaction(),
            conn.cursor(row_factory=dict_row) as cur,
        ):
            await app.push_many_ex(cur, jobs)
        return flow_s, time.perf_counter() - began


def write(dsn: str, children: int) -> tuple[float, float]:
    """Seconds to push a chord workflow, and ``children + 1`` plain jobs in one transaction."""
    return asyncio.run(_write(dsn, children))


async def _push(dsn: str, what: Any) -> None:
    from chancy.plugins.workflow import WorkflowPlugin

    async with _app(dsn) as app:
        if isinstance(what, list):
            async with (
                app.pool.connection() as conn,
                conn.transaction(),
                conn.cursor(row_factory=dict_row) as cur,
            ):
                await app.push_many_ex(cur, what)
        else:
            await WorkflowPlugin.push(app, what)


def chord(dsn: str, children: int) -> None:
    """Push one chord workflow."""
    asyncio.run(_push(dsn, _chord(children, "d")))


def plain(dsn: str, children: int) -> None:
    """Push ``children`` independent leaf jobs in one transaction."""
    asyncio.run(_push(dsn, [leaf.job.with_kwargs(n=i) for i in range(children)]))


async def _wait_start(conn: Any, tag: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while True:
        cur = await conn.execute("SELECT at FROM bench_chancy_starts WHERE tag = %s", (tag,))
        row = await cur.fetchone()
        if row is not None:
            return float(row[0])
        if time.monotonic() > deadline:
            raise RuntimeError(f"chancy: {tag} did not start in {timeout:.0f}s")
        await asyncio.sleep(0.01)


async def _last_completion(conn: Any, tag: str) -> float:
    """Epoch seconds of the last completion of ``tag``'s children (their ``completed_at``)."""
    deadline = time.monotonic() + 30
    while True:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE completed_at IS NULL), "
            "extract(epoch FROM max(completed_at))::float8 FROM chancy_jobs "
            "WHERE func LIKE %s AND kwargs->>'tag' = %s",
            ("%leaf", tag),
        )
        row = await cur.fetchone()
        if row is not None and row[0] == 0 and row[1] is not None:
            return float(row[1])
        if time.monotonic() > deadline:
            raise RuntimeError(f"chancy: the children of {tag} have no completion")
        await asyncio.sleep(0.01)


async def _fan_in(dsn: str, chords: int, size: int) -> list[tuple[float, list[float]]]:
    from chancy.plugins.workflow import WorkflowPlugin

    found: list[tuple[float, list[float]]] = []
    async with (
        _app(dsn) as app,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
    ):
        for i in range(-1, chords):
            tag = f"f{i}"
            await WorkflowPlugin.push(app, _chord(size, tag))
            start = await _wait_start(conn, tag, 60)
            if i >= 0:
                found.append((start, [await _last_completion(conn, tag)]))
    return found


def fan_in(dsn: str, chords: int, size: int) -> list[tuple[float, list[float]]]:
    """``(callback start, [last child's completion])`` of chords run one after the other."""
    return asyncio.run(_fan_in(dsn, chords, size))


async def _chain(dsn: str, steps: int) -> tuple[list[float], list[float]]:
    from chancy.plugins.workflow import Workflow, WorkflowPlugin

    wf = Workflow("chain")
    for i in range(steps):
        wf.add(f"s{i}", step.job.with_kwargs(n=i, tag=f"s{i}"), [f"s{i - 1}"] if i else [])
    async with (
        _app(dsn) as app,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
    ):
        await WorkflowPlugin.push(app, wf)
        await _wait_start(conn, f"s{steps - 1}", 60 + 5 * steps)
        await asyncio.sleep(0.5)  # the last step's completion is written in a batch
        cur = await conn.execute("SELECT tag, at FROM bench_chancy_starts")
        starts = {str(t): float(a) for t, a in await cur.fetchall()}
        cur = await conn.execute(
            "SELECT kwargs->>'tag', extract(epoch FROM completed_at)::float8 FROM chancy_jobs "
            "WHERE func LIKE %s",
            ("%step",),
        )
        done = {str(t): float(c) for t, c in await cur.fetchall() if c is not None}
    order = [f"s{i}" for i in range(steps)]
    return [starts[t] for t in order], [done.get(t, float("nan")) for t in order]


def chain(dsn: str, steps: int) -> tuple[list[float], list[float]]:
    """Starts and completions (epoch seconds) of a chain of ``steps`` steps, in order."""
    return asyncio.run(_chain(dsn, steps))


async def _work(dsn: str) -> dict[str, Any]:
    from chancy import Worker

    os.environ[DSN_VARIABLE] = dsn
    async with _app(dsn, worker=True) as app:
        worker = Worker(app, register_signal_handlers=False, shutdown_timeout=5)
        worker.send_outgoing_interval = OUTGOING_S
        print("READY", flush=True)
        loop = asyncio.get_running_loop()
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if line.strip() != "GO":
            raise SystemExit(3)
        cpu0 = time.process_time()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await worker.start()
        await stop.wait()
        await worker.stop()
        return {"cpu_s": time.process_time() - cpu0}


def main(argv: list[str] | None = None) -> None:
    """One Chancy worker process."""
    parser = argparse.ArgumentParser(prog="python -m bench.workflow_chancy")
    parser.add_argument("--dsn", required=True)
    args = parser.parse_args(argv)
    report = asyncio.run(_work(args.dsn))
    print(json.dumps({"maxrss_mb": peak_rss_mb(), **report}), flush=True)


if __name__ == "__main__":
    main()
