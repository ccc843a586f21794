"""The worker's own statements use a pool of their own, never the handlers' pool.

What this proves, on a real PostgreSQL:

- a handler that holds the only connection of its engine's pool (``pool_size=1``,
  ``max_overflow=0``) in an open transaction for longer than its task's lost interval
  does not delay a heartbeat: ``alive_at`` keeps moving, the job is not reclaimed and
  succeeds at its first attempt, for the sync and the async worker. On the old code path
  (the run loop and the heartbeats on the handlers' pool) the handler's session cannot
  even get a connection, and the job fails;
- the handlers' pool sees only the handlers' checkouts, the worker's pool is another one
  that keeps ``pool_size`` connections, and it is disposed when ``run()`` returns;
- the derived engine behaves as the handlers' one: same ``schema_translate_map`` and
  other execution options, same pool ``connect`` listeners (a ``SET`` done there holds),
  and disposing it leaves the handlers' pool alone.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, create_engine, event, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool, QueuePool

from sqla_queue import JobContext, Queue
from sqla_queue.worker.pools import own_pool_engine
from tests.support.app import QUEUE_SCHEMA
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration

#: The lost interval of the slow task, and how long its handler holds its transaction.
LOST = 1.0
HOLD = 2.5 * LOST


def _queue_pool(engine: Engine) -> QueuePool:
    """``engine``'s pool, a ``QueuePool`` in these tests."""
    assert isinstance(engine.pool, QueuePool)
    return engine.pool


def _slow_queue() -> tuple[Queue, dict[str, Any]]:
    """A queue on the test schema with one sync and one async task holding a transaction."""
    queue = Queue(metadata=MetaData(), schema=QUEUE_SCHEMA, lost_interval=LOST)
    seen: dict[str, Any] = {"checkedout": []}

    @queue.task(name="pool_test_hold", pass_context=True)
    def hold(ctx: JobContext[Session]) -> int:
        """Keep a transaction open on the handlers' only connection for ``HOLD`` seconds."""
        pid = int(ctx.session.execute(text("SELECT pg_backend_pid()")).scalar_one())
        deadline = time.monotonic() + HOLD
        while time.monotonic() < deadline:
            bind = ctx.session.get_bind()
            assert isinstance(bind, Engine)
            seen["checkedout"].append(_queue_pool(bind).checkedout())
            time.sleep(0.05)
        return pid

    @queue.task(name="pool_test_hold_async", pass_context=True)
    async def hold_async(ctx: JobContext[AsyncSession]) -> int:
        """The async twin of ``hold``: an open transaction on an ``AsyncSession``."""
        pid = int((await ctx.session.execute(text("SELECT pg_backend_pid()"))).scalar_one())
        await asyncio.sleep(HOLD)
        return pid

    return queue, seen


@pytest.fixture
def tight_engine(db_url: str) -> Iterator[Engine]:
    """The handlers' engine: one connection, no overflow, and a short wait for it."""
    engine = create_engine(db_url, pool_size=1, max_overflow=0, pool_timeout=1.0)
    yield engine
    engine.dispose()


@pytest.fixture
def observer(db_url: str) -> Iterator[Engine]:
    """An engine of the test's own, to watch the database while the worker runs."""
    engine = create_engine(db_url, poolclass=NullPool)
    yield engine
    engine.dispose()


def _alive_at(observer: Engine, queue: Queue, job_id: int) -> dt.datetime | None:
    executions = queue.tables.executions
    with observer.connect() as connection:
        return connection.scalar(select(executions.c.alive_at).where(executions.c.id == job_id))


def _job(observer: Engine, queue: Queue, job_id: int) -> tuple[str, int]:
    jobs = queue.tables.jobs
    with observer.connect() as connection:
        status, attempts = connection.execute(
            select(jobs.c.status, jobs.c.attempts).where(jobs.c.id == job_id)
        ).one()
    return str(status), int(attempts)


def _watch_heartbeats(
    observer: Engine, queue: Queue, job_id: int, stop: threading.Event
) -> list[dt.datetime]:
    """The distinct ``alive_at`` values of the job's execution until ``stop`` or it ends."""
    seen: list[dt.datetime] = []
    wait_for(lambda: _alive_at(observer, queue, job_id) is not None, timeout=10)
    while not stop.is_set():
        alive = _alive_at(observer, queue, job_id)
        if alive is None:
            break
        if not seen or alive != seen[-1]:
            seen.append(alive)
        time.sleep(0.05)
    return seen


def test_a_handler_holding_the_handlers_pool_does_not_delay_heartbeats(
    tight_engine: Engine, observer: Engine
) -> None:
    queue, seen = _slow_queue()
    factory = sessionmaker(tight_engine)
    checkouts: list[str] = []
    event.listen(
        tight_engine.pool,
        "checkout",
        lambda *_: checkouts.append(threading.current_thread().name),
    )
    with factory.begin() as session:
        job_id = queue.get_task("pool_test_hold").enqueue(session)
    checkouts.clear()
    worker = queue.worker(
        factory,
        tasks=["pool_test_hold"],
        heartbeat_interval=0.1,
        install_signal_handlers=False,
        listen=False,
        poll_interval=0.05,
    )
    stop = threading.Event()
    with worker_thread(worker):
        beats = _watch_heartbeats(observer, queue, job_id, stop)
        wait_for(lambda: _job(observer, queue, job_id)[0] not in ("queued", "running"), timeout=10)
        own = worker.worker_engine
    assert _job(observer, queue, job_id) == ("succeeded", 1)
    assert own is not None and own.pool is not tight_engine.pool
    assert isinstance(own.pool, QueuePool) and own.pool.size() == 3
    # alive_at moved all along the handler's HOLD seconds, more than the lost interval.
    assert len(beats) >= 5, beats
    assert (beats[-1] - beats[0]).total_seconds() >= LOST
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(beats)]
    assert max(gaps) < LOST, gaps
    # The handlers' pool: only the handler's session (the listener, copied with the pool's
    # events, hears the worker's pool too, so count the handler threads' checkouts).
    assert set(seen["checkedout"]) == {1}
    handler_checkouts = [name for name in checkouts if name.startswith("sqla-queue-handler")]
    assert handler_checkouts and _queue_pool(tight_engine).checkedout() == 0
    assert _queue_pool(own).checkedout() == 0


async def test_an_async_handler_holding_the_handlers_pool_does_not_delay_heartbeats(
    db_url: str, observer: Engine
) -> None:
    queue, _ = _slow_queue()
    engine = create_async_engine(db_url, pool_size=1, max_overflow=0, pool_timeout=1.0)
    try:
        factory = async_sessionmaker(engine, expire_on_commit=False)
        async with factory.begin() as session:
            job_id = await queue.get_task("pool_test_hold_async").enqueue(session)
        worker = queue.async_worker(
            factory,
            tasks=["pool_test_hold_async"],
            heartbeat_interval=0.1,
            install_signal_handlers=False,
            listen=False,
            poll_interval=0.05,
            pool_size=2,
        )
        run = asyncio.create_task(worker.run())
        stop = threading.Event()
        beats = await asyncio.to_thread(_watch_heartbeats, observer, queue, job_id, stop)
        await asyncio.to_thread(
            wait_for, lambda: _job(observer, queue, job_id)[0] not in ("queued", "running"), 10
        )
        own = worker.worker_engine
        worker.stop()
        await asyncio.wait_for(run, 30)
        assert _job(observer, queue, job_id) == ("succeeded", 1)
        assert own is not None and own.pool is not engine.sync_engine.pool
    finally:
        await engine.dispose()
    assert len(beats) >= 5, beats
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(beats)]
    assert max(gaps) < LOST, gaps


def test_the_own_pool_engine_keeps_options_and_listeners_but_not_the_pool(db_url: str) -> None:
    engine = create_engine(db_url, pool_size=1, max_overflow=0, pool_timeout=1.0)

    @event.listens_for(engine, "connect")
    def set_name(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET application_name = 'from-listener'")

    tenant = engine.execution_options(schema_translate_map={"tenant": QUEUE_SCHEMA})
    own = own_pool_engine(tenant, 2)
    try:
        assert own.get_execution_options()["schema_translate_map"] == {"tenant": QUEUE_SCHEMA}
        assert own.url == engine.url and own.dialect is engine.dialect
        with engine.connect() as held:  # the handlers' only connection is taken
            connections = [own.connect() for _ in range(4)]  # more than it keeps: overflow
            try:
                names = {c.scalar(text("SHOW application_name")) for c in connections}
                assert names == {"from-listener"}
                assert _queue_pool(engine).checkedout() == 1
                assert _queue_pool(own).checkedout() == 4
            finally:
                for connection in connections:
                    connection.close()
            assert held.scalar(text("SELECT 1")) == 1
        assert _queue_pool(own).checkedin() == 2
        own.dispose()
        assert _queue_pool(own).checkedin() == 0 and _queue_pool(engine).checkedin() == 1
    finally:
        engine.dispose()
    unpooled = create_engine(db_url, poolclass=NullPool)
    assert isinstance(own_pool_engine(unpooled, 3).pool, NullPool)
