"""The asyncio worker: a run loop in the caller's event loop, ``def`` handlers in threads."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from sqla_queue.conversation import drive_async
from sqla_queue.schema.verify import verify_schema
from sqla_queue.worker.actions import Claim, Flush, Maintain, Start, Stop, Wait, Work
from sqla_queue.worker.background import background_engine, capturing_connect_keywords
from sqla_queue.worker.base import RunStats, WorkerBase, bound_engine
from sqla_queue.worker.decider import ContextFactory, Decider
from sqla_queue.worker.executors import HandlerPool, in_turn, in_turn_async
from sqla_queue.worker.handlers import HandlerRunner, RunningJob
from sqla_queue.worker.plan import WorkerPlan
from sqla_queue.worker.pools import own_pool_engine
from sqla_queue.worker.raw import (
    RawStatements,
    driver_error,
    raw_statements_for,
    unit_statement,
)
from sqla_queue.worker.settings import WorkerSettings
from sqla_queue.worker.signals import graceful_signals

__all__ = ["AsyncWorker"]

log = logging.getLogger("sqla_queue.worker")


class AsyncWorker(WorkerBase):
    """Runs ``async def`` handlers as tasks in the running loop; ``def`` ones in threads.

    Build it with :meth:`Queue.async_worker`; ``await worker.run()``. Its own statements
    use a pool of its own (``WorkerSettings.pool_size``), apart from the handlers' pool:
    one connection on the event loop for the run loop, derived from the session factory's
    engine, and a synchronous pool for its heartbeater and services, which run in threads.
    ``read_session_factory`` (an ``async_sessionmaker`` on a read replica) gives handlers
    ``ctx.read_session``.
    """

    asynchronous = True

    def __init__(
        self,
        plan: WorkerPlan,
        session_factory: async_sessionmaker[AsyncSession],
        settings: WorkerSettings,
        read_session_factory: async_sessionmaker[AsyncSession] | None = None,
    ) -> None:
        super().__init__(plan, session_factory, settings, read_session_factory)
        self.engine: AsyncEngine = bound_engine(session_factory)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._raw = raw_statements_for(
            self.engine.dialect,
            enabled=settings.raw_statements,
            execution_options=self.engine.get_execution_options(),
        )

    async def run(self, *, burst: bool = False) -> RunStats:
        """Process jobs until SIGINT/SIGTERM (or :meth:`stop`); with ``burst``, until idle.

        Stops on its own, as on SIGTERM, and then raises, when a handler raises
        ``KeyboardInterrupt`` or ``SystemExit`` (raised again as it is) or when the worker
        cannot do its job (:class:`~sqla_queue.WorkerStoppedError`: a
        missing privilege or table, an outcome the database refuses even as a failure).
        """
        decider = self._new_decider(burst)
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def wake_up() -> None:
            # Thread-safe even from the loop's own thread: a signal handler runs there too,
            # possibly just before the selector blocks, and only the self-pipe write that
            # call_soon_threadsafe makes is sure to wake it.
            loop.call_soon_threadsafe(wake.set)

        decider.set_waker(wake_up)
        engine = AsyncEngine(self._own_engine(self.engine.sync_engine))
        try:
            # Handlers go in first: a deploy's SIGTERM during start-up is a clean stop too.
            with graceful_signals(
                lambda: decider.request_stop(time.monotonic()),
                enabled=self.settings.install_signal_handlers,
            ):
                if self.settings.verify_schema:
                    await self._verify(engine)
                await self._loop(decider, wake, engine)
        finally:
            await engine.dispose()
        log.info("async worker %s stopped: %s", decider.worker_id, decider.stats)
        self._raise_if_stopped_by(decider)
        return self._stats(decider)

    async def _verify(self, engine: AsyncEngine) -> None:
        for attempt in itertools.count(1):
            try:
                async with engine.connect() as check:
                    await check.run_sync(verify_schema, self.plan.tables)
                return
            except DBAPIError as exc:
                delay = self._verify_retry_delay(exc, attempt)
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    async def _loop(self, decider: Decider, wake: asyncio.Event, engine: AsyncEngine) -> None:
        # Heartbeats run on a thread with a sync connection, immune to a blocked loop.
        heartbeat_engine = await self._background_engine(engine)
        pool, heartbeater, listener = self._start_background(decider, heartbeat_engine)
        make_context = self._make_context(decider)
        runner = self._runner(decider)
        connection: AsyncConnection | None = None
        log.info("async worker %s started: tasks %s", decider.worker_id, self.plan.task_names)
        try:
            while True:
                wake.clear()
                now = time.monotonic()
                action = decider.next_action(now)
                if isinstance(action, Stop):
                    break
                if isinstance(action, Wait):
                    await _wait(wake, action.seconds)
                    continue
                if isinstance(action, Start):
                    for running in action.jobs:
                        self._dispatch(decider, running, runner, pool)
                    continue
                try:
                    if connection is None:
                        # Autocommit, each unit with its own BEGIN (see the sync face).
                        connection = await engine.connect()
                        await connection.execution_options(isolation_level="AUTOCOMMIT")
                    await self._perform(
                        connection, decider, action, now, make_context, runner, pool
                    )
                except DBAPIError as exc:
                    await _discard(connection)
                    connection = None
                    delay = decider.database_error(action, exc, now)
                    if delay > 0:
                        await _wait(wake, delay)
        finally:
            self._stop_background(pool, heartbeater, listener)
            for task in list(self._tasks):
                task.cancel()
            if connection is not None:
                await _discard(connection)
            heartbeat_engine.dispose()

    async def _background_engine(self, engine: AsyncEngine) -> Engine:
        """The sync engine of this worker's threads, connecting as ``engine`` does.

        One connection, made at start on a pool apart from the run loop's, shows the
        keywords ``engine`` passes its driver (see :func:`background_engine`). Like the
        schema check, it is tried again only when the connection is lost under it.
        """
        given = self.settings.background_engine
        keywords = {} if given is not None else await self._connect_keywords(engine)
        return background_engine(
            engine.sync_engine, keywords, given=given, pool_size=self._background_pool_size()
        )

    async def _connect_keywords(self, engine: AsyncEngine) -> dict[str, Any]:
        probe = AsyncEngine(own_pool_engine(engine.sync_engine, 1))
        try:
            for attempt in itertools.count(1):
                try:
                    with capturing_connect_keywords(engine.sync_engine) as keywords:
                        async with probe.connect():
                            return keywords
                except DBAPIError as exc:
                    delay = self._verify_retry_delay(exc, attempt)
                    if delay is None:
                        raise
                    await asyncio.sleep(delay)
            raise AssertionError("unreachable: the loop returns or raises")
        finally:
            await probe.dispose()

    async def _perform(
        self,
        connection: AsyncConnection,
        decider: Decider,
        action: Claim | Flush | Maintain,
        now: float,
        make_context: ContextFactory,
        runner: HandlerRunner,
        pool: HandlerPool,
    ) -> None:
        work = decider.prepare(action, now, make_context)
        try:
            if self._raw is not None:
                results = await _execute_raw(connection, self._raw, work)
            else:
                results = []
                if work.atomic:
                    await connection.exec_driver_sql("BEGIN")
                for stmt, params in work.steps:
                    results.append((await connection.execute(stmt, params)).all())
                if work.atomic and work.follow is None:
                    await connection.exec_driver_sql("COMMIT")
            if work.follow is not None:
                flow = work.follow(results)
                if flow is not None:
                    await drive_async(connection, flow)
                await connection.exec_driver_sql("COMMIT")
        except BaseException:
            work.failed()
            raise
        for running in work.done(results):
            self._dispatch(decider, running, runner, pool)

    def _dispatch(
        self, decider: Decider, running: RunningJob, runner: HandlerRunner, pool: HandlerPool
    ) -> None:
        if running.runtime.is_async:
            chain = in_turn_async(runner.run_async, decider.follow_on, running)
            task = asyncio.ensure_future(chain)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            pool.submit(lambda: in_turn(runner.run_sync, decider.follow_on, running))


async def _execute_raw(
    connection: AsyncConnection, raw: RawStatements, work: Work
) -> list[Sequence[Any]]:
    """Run ``work`` on the psycopg connection under ``connection`` (see worker/raw.py)."""
    from psycopg import AsyncRawCursor
    from psycopg.rows import namedtuple_row

    dialect = connection.dialect
    results: list[Sequence[Any]] = []
    driver = (await connection.get_raw_connection()).driver_connection
    assert driver is not None, "the worker's connection is open"
    steps = raw.render_steps(work.steps, atomic=work.atomic, commit=work.follow is None)
    if raw.sends_together(steps, atomic=work.atomic):
        # BEGIN, the ack, the claim and COMMIT in one round trip instead of four.
        cursors = [AsyncRawCursor(driver, row_factory=namedtuple_row) for _ in steps]
        try:
            async with driver.pipeline():
                for cursor, (rendered, _) in zip(cursors, steps, strict=True):
                    await cursor.execute(rendered.sql, rendered.args)
            for cursor, (_, wanted) in zip(cursors, steps, strict=True):
                if wanted:
                    rows = await cursor.fetchall() if cursor.description is not None else []
                    results.append(rows)
        except dialect.loaded_dbapi.Error as exc:
            raise driver_error(exc, unit_statement(steps), dialect) from exc
        finally:
            for cursor in cursors:
                await cursor.close()
        return results
    async with AsyncRawCursor(driver, row_factory=namedtuple_row) as cursor:
        for rendered, wanted in steps:
            try:
                await cursor.execute(rendered.sql, rendered.args)
            except dialect.loaded_dbapi.Error as exc:
                raise driver_error(exc, rendered, dialect) from exc
            if wanted:
                rows = await cursor.fetchall() if cursor.description is not None else []
                results.append(rows)
    return results


async def _wait(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


async def _discard(connection: AsyncConnection | None) -> None:
    if connection is None:
        return
    try:
        await connection.invalidate()
        await connection.close()
    except Exception:  # already broken; nothing more to release
        log.debug("closing a broken connection failed", exc_info=True)
