"""A queue of bounded tasks (``max_pending``) for the bounded-queue tests.

It lives in its own schema and metadata, beside the test app's queue, so its tables are
created by the tests that use it. Worker processes load it as
``tests.support.bounded:queue``; the stress test's enqueuer processes run
:func:`enqueue_storm`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import traceback
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, MetaData, create_engine, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_queue import Queue
from sqla_queue.errors import QueueFull

SCHEMA = "bounded_jobs"
metadata = MetaData()
queue = Queue(metadata=metadata, schema=SCHEMA)
EX = queue.tables.executions
JOBS = queue.tables.jobs

#: The bound of :func:`capped`, small enough to fill by hand.
CAPPED = 3
#: The bound of :func:`drained`, the task of the stress test.
DRAINED = 25


@queue.task(name="capped", max_pending=CAPPED)
def capped(n: int = 0) -> int:
    """A bounded task whose jobs nothing needs to run."""
    return n


@queue.task(name="other_capped", max_pending=2)
def other_capped(n: int = 0) -> int:
    """A second bounded task, for calls that bound two tasks at once."""
    return n


@queue.task(name="free")
def free(n: int = 0) -> int:
    """An unbounded task."""
    return n


@queue.task(name="drained", max_pending=DRAINED)
def drained(n: int = 0, pause: float = 0.08) -> int:
    """The stress test's bounded task: a slow worker drains it."""
    time.sleep(pause)
    return n


def create(connection: Connection) -> None:
    """Create this queue's schema and tables on ``connection``."""
    queue.create_all(connection)


def pending(connection: Connection, task: str) -> int:
    """How many of ``task``'s executions are pending or waiting (uncapped)."""
    count = select(EX.c.id).where(EX.c.task == task, EX.c.state.in_(("pending", "waiting")))
    return len(connection.execute(count).all())


def enqueue_storm(db_url: str, index: int, seconds: float, barrier: Any, log_path: str) -> None:
    """One enqueuer process of the stress test: enqueue ``drained`` jobs for ``seconds``.

    Each transaction adds one to three jobs (``enqueue`` or ``enqueue_many``), raising at
    once or waiting up to 0.3 s for room, holds its lock a few milliseconds now and then,
    and rolls back one time in five. Every third process is async. The log (JSON) lists
    the ids of committed and rolled-back calls, how many were refused, and any other error.
    """
    log: dict[str, Any] = {"committed": [], "rolled_back": [], "full": 0, "errors": []}
    rng = random.Random(1000 + index)
    try:
        if index % 3 == 2:
            asyncio.run(_storm_async(db_url, rng, seconds, barrier, log))
        else:
            _storm_sync(db_url, rng, seconds, barrier, log)
    except BaseException:
        log["errors"].append(traceback.format_exc())
    Path(log_path).write_text(json.dumps(log))


def _plan(rng: random.Random) -> tuple[int, float | None, float, bool]:
    """(jobs, wait_if_full, seconds to hold the transaction, roll back) of one call."""
    jobs = rng.choice((1, 1, 1, 2, 3))
    wait = rng.choice((None, None, 0.3))
    hold = rng.uniform(0.0, 0.01) if rng.random() < 0.3 else 0.0
    return jobs, wait, hold, rng.random() < 0.2


def _calls(jobs: int, wait: float | None, rng: random.Random) -> tuple[Any, list[Any]]:
    handle = drained.options(wait_if_full=wait) if wait else drained
    return handle, [handle.call(rng.randrange(1000)) for _ in range(jobs)]


def _storm_sync(
    db_url: str, rng: random.Random, seconds: float, barrier: Any, log: dict[str, Any]
) -> None:
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with Session(engine) as session:
            session.execute(select(1))
            session.rollback()
            barrier.wait(90)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                jobs, wait, hold, rollback = _plan(rng)
                handle, specs = _calls(jobs, wait, rng)
                session.begin()
                try:
                    if jobs == 1:
                        ids = [handle.enqueue(session, *specs[0].args)]
                    else:
                        ids = queue.enqueue_many(session, specs)
                    time.sleep(hold)
                except QueueFull:
                    session.rollback()
                    log["full"] += 1
                    continue
                if rollback:
                    session.rollback()
                    log["rolled_back"].extend(ids)
                else:
                    session.commit()
                    log["committed"].extend(ids)
    finally:
        engine.dispose()


async def _storm_async(
    db_url: str, rng: random.Random, seconds: float, barrier: Any, log: dict[str, Any]
) -> None:
    engine = create_async_engine(db_url, poolclass=NullPool)
    try:
        async with AsyncSession(engine) as session:
            await session.execute(select(1))
            await session.rollback()
            await asyncio.to_thread(barrier.wait, 90)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                jobs, wait, hold, rollback = _plan(rng)
                handle, specs = _calls(jobs, wait, rng)
                await session.begin()
                try:
                    if jobs == 1:
                        ids = [await handle.enqueue(session, *specs[0].args)]
                    else:
                        ids = await queue.enqueue_many(session, specs)
                    await asyncio.sleep(hold)
                except QueueFull:
                    await session.rollback()
                    log["full"] += 1
                    continue
                if rollback:
                    await session.rollback()
                    log["rolled_back"].extend(ids)
                else:
                    await session.commit()
                    log["committed"].extend(ids)
    finally:
        await engine.dispose()
