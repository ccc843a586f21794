"""The synchronous worker: a run loop on one connection, handlers in threads."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.conversation import drive
from sqla_queue.schema.verify import verify_schema
from sqla_queue.worker.actions import Claim, Flush, Maintain, Start, Stop, Wait, Work
from sqla_queue.worker.base import RunStats, WorkerBase, bound_engine
from sqla_queue.worker.decider import ContextFactory, Decider
from sqla_queue.worker.executors import HandlerPool, PrivateLoop, in_turn, in_turn_async
from sqla_queue.worker.handlers import HandlerRunner, RunningJob
from sqla_queue.worker.plan import WorkerPlan
from sqla_queue.worker.raw import (
    RawStatements,
    driver_error,
    raw_statements_for,
    unit_statement,
)
from sqla_queue.worker.settings import WorkerSettings
from sqla_queue.worker.signals import graceful_signals

__all__ = ["Worker"]

log = logging.getLogger("sqla_queue.worker")


class Worker(WorkerBase):
    """Runs jobs with ``def`` handlers in threads and ``async def`` ones on a private loop.

    Build it with :meth:`Queue.worker`; call :meth:`run`. Claims, acks and reclaims go
    through one connection, heartbeats and services through others, all of the worker's
    own pool (``WorkerSettings.pool_size``), derived from the session factory's engine but
    apart from the handlers' pool; LISTEN has its own connection. ``read_session_factory``
    (a ``sessionmaker`` on a read replica) gives handlers ``ctx.read_session``.
    """

    def __init__(
        self,
        plan: WorkerPlan,
        session_factory: sessionmaker[Session],
        settings: WorkerSettings,
        read_session_factory: sessionmaker[Session] | None = None,
    ) -> None:
        super().__init__(plan, session_factory, settings, read_session_factory)
        self.engine: Engine = bound_engine(session_factory)
        self._wake = threading.Event()
        self._raw = raw_statements_for(
            self.engine.dialect,
            enabled=settings.raw_statements,
            execution_options=self.engine.get_execution_options(),
        )

    def run(self, *, burst: bool = False) -> RunStats:
        """Process jobs until SIGINT/SIGTERM (or :meth:`stop`); with ``burst``, until idle.

        Refuses to start (:class:`~sqla_queue.SchemaMismatchError`) when the database
        lacks anything this version needs. Stops on its own, as on SIGTERM, and then
        raises, when a handler raises ``KeyboardInterrupt`` or ``SystemExit`` (raised again
        as it is) or when the worker cannot do its job
        (:class:`~sqla_queue.WorkerStoppedError`: a missing privilege or
        table, an outcome the database refuses even as a failure).
        """
        decider = self._new_decider(burst)
        decider.set_waker(self._wake.set)
        engine = self._own_engine(self.engine)
        try:
            # Handlers go in first: a deploy's SIGTERM during start-up is a clean stop too.
            with graceful_signals(
                lambda: decider.request_stop(time.monotonic()),
                enabled=self.settings.install_signal_handlers,
            ):
                if self.settings.verify_schema:
                    self._verify(engine)
                self._loop(decider, engine)
        finally:
            engine.dispose()
        log.info("worker %s stopped: %s", decider.worker_id, decider.stats)
        self._raise_if_stopped_by(decider)
        return self._stats(decider)

    def _verify(self, engine: Engine) -> None:
        for attempt in itertools.count(1):
            try:
                with engine.connect() as check:
                    verify_schema(check, self.plan.tables)
                return
            except DBAPIError as exc:
                delay = self._verify_retry_delay(exc, attempt)
                if delay is None:
                    raise
                time.sleep(delay)

    def _loop(self, decider: Decider, engine: Engine) -> None:
        wake = self._wake
        pool, heartbeater, listener = self._start_background(decider, engine)
        private_loop = PrivateLoop() if self.plan.has_async else None
        make_context = self._make_context(decider)
        runner = self._runner(decider)
        connection: Connection | None = None
        log.info("worker %s started: tasks %s", decider.worker_id, self.plan.task_names)
        try:
            while True:
                wake.clear()
                now = time.monotonic()
                action = decider.next_action(now)
                if isinstance(action, Stop):
                    break
                if isinstance(action, Wait):
                    wake.wait(action.seconds)
                    continue
                if isinstance(action, Start):
                    for running in action.jobs:
                        self._dispatch(decider, running, runner, pool, private_loop)
                    continue
                try:
                    if connection is None:
                        # Autocommit: each unit sends its own BEGIN and COMMIT, in the
                        # same round trip as its statements where libpq pipelines.
                        connection = engine.connect().execution_options(
                            isolation_level="AUTOCOMMIT"
                        )
                    self._perform(
                        connection, decider, action, now, make_context, runner, pool, private_loop
                    )
                except DBAPIError as exc:
                    _discard(connection)
                    connection = None
                    delay = decider.database_error(action, exc, now)
                    if delay > 0:
                        wake.wait(delay)
        finally:
            self._stop_background(pool, heartbeater, listener)
            if private_loop is not None:
                private_loop.close()
            if connection is not None:
                _discard(connection)

    def _perform(
        self,
        connection: Connection,
        decider: Decider,
        action: Claim | Flush | Maintain,
        now: float,
        make_context: ContextFactory,
        runner: HandlerRunner,
        pool: HandlerPool,
        private_loop: PrivateLoop | None,
    ) -> None:
        work = decider.prepare(action, now, make_context)
        try:
            if self._raw is not None:
                results = _execute_raw(connection, self._raw, work)
            else:
                if work.atomic:
                    connection.exec_driver_sql("BEGIN")
                results = [connection.execute(stmt, params).all() for stmt, params in work.steps]
                if work.atomic and work.follow is None:
                    connection.exec_driver_sql("COMMIT")
            if work.follow is not None:
                flow = work.follow(results)
                if flow is not None:
                    drive(connection, flow)
                connection.exec_driver_sql("COMMIT")
        except BaseException:
            work.failed()
            raise
        for running in work.done(results):
            self._dispatch(decider, running, runner, pool, private_loop)

    @staticmethod
    def _dispatch(
        decider: Decider,
        running: RunningJob,
        runner: HandlerRunner,
        pool: HandlerPool,
        private_loop: PrivateLoop | None,
    ) -> None:
        if running.runtime.is_async:
            assert private_loop is not None
            private_loop.submit(in_turn_async(runner.run_async, decider.follow_on, running))
        else:
            pool.submit(lambda: in_turn(runner.run_sync, decider.follow_on, running))


def _execute_raw(connection: Connection, raw: RawStatements, work: Work) -> list[Sequence[Any]]:
    """Run ``work`` on the psycopg connection under ``connection`` (see worker/raw.py)."""
    from psycopg import RawCursor
    from psycopg.rows import namedtuple_row

    dialect = connection.dialect
    results: list[Sequence[Any]] = []
    driver = connection.connection.driver_connection
    assert driver is not None, "the worker's connection is open"
    steps = raw.render_steps(work.steps, atomic=work.atomic, commit=work.follow is None)
    if raw.sends_together(steps, atomic=work.atomic):
        # BEGIN, the ack, the claim and COMMIT in one round trip instead of four.
        cursors = [RawCursor(driver, row_factory=namedtuple_row) for _ in steps]
        try:
            with driver.pipeline():
                for cursor, (rendered, _) in zip(cursors, steps, strict=True):
                    cursor.execute(rendered.sql, rendered.args)
            for cursor, (_, wanted) in zip(cursors, steps, strict=True):
                if wanted:
                    results.append(cursor.fetchall() if cursor.description is not None else [])
        except dialect.loaded_dbapi.Error as exc:
            raise driver_error(exc, unit_statement(steps), dialect) from exc
        finally:
            for cursor in cursors:
                cursor.close()
        return results
    with RawCursor(driver, row_factory=namedtuple_row) as cursor:
        for rendered, wanted in steps:
            try:
                cursor.execute(rendered.sql, rendered.args)
            except dialect.loaded_dbapi.Error as exc:
                raise driver_error(exc, rendered, dialect) from exc
            if wanted:
                results.append(cursor.fetchall() if cursor.description is not None else [])
    return results


def _discard(connection: Connection | None) -> None:
    if connection is None:
        return
    try:
        connection.invalidate()
        connection.close()
    except Exception:  # the connection is already broken; nothing more to release
        log.debug("closing a broken connection failed", exc_info=True)
