"""What both worker faces share beyond the decider: wiring of threads, contexts and races."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine

from sqla_queue._sqlstate import is_unique_violation_of, sqlstate_of
from sqla_queue.durable.context import DurableSupport
from sqla_queue.instrumentation import combine_observers
from sqla_queue.logic.outcomes import ClaimedJob
from sqla_queue.models.tables import HistoryLayout
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.daemons import DaemonSupervisor
from sqla_queue.worker.decider import ContextFactory, Decider
from sqla_queue.worker.executors import HandlerPool
from sqla_queue.worker.handlers import HandlerRunner
from sqla_queue.worker.heartbeat import Heartbeater
from sqla_queue.worker.history import HistoryMaintainer
from sqla_queue.worker.listener import Listener, listen_connector
from sqla_queue.worker.plan import WorkerPlan
from sqla_queue.worker.pools import own_pool_engine, refuse_connection_bind, split_pool_size
from sqla_queue.worker.registry import WorkerRegistry
from sqla_queue.worker.scheduler import Scheduler
from sqla_queue.worker.services import ServiceEnv
from sqla_queue.worker.sessions import InTransaction, check_transactional_binds
from sqla_queue.worker.settings import WorkerSettings
from sqla_queue.worker.threads import WorkerThread

__all__ = [
    "RunStats",
    "WorkerBase",
    "bound_engine",
    "check_read_session_factory",
    "tenant_plan",
]

log = logging.getLogger("sqla_queue.worker")

#: Tries of the start-up schema check when its connection is lost under it.
VERIFY_ATTEMPTS = 5
#: Longest wait, in seconds, for each background thread to end when the worker stops.
THREAD_JOIN_TIMEOUT = 5.0


@dataclass(frozen=True)
class RunStats:
    """Counts of one ``run()``: what this worker claimed and how the attempts ended."""

    claimed: int
    succeeded: int
    failed: int
    retried: int
    fenced: int
    #: Handlers that stopped after their job was cancelled while they ran.
    cancelled: int = 0
    #: Durable handlers that suspended their job (a sleep, a wait for a signal or a row).
    suspended: int = 0


def bound_engine(session_factory: Any) -> Any:
    """The engine a ``sessionmaker`` or ``async_sessionmaker`` is bound to."""
    bind = getattr(session_factory, "kw", {}).get("bind")
    if bind is None:
        raise TypeError(
            "the worker needs a session factory bound to an engine: "
            "sessionmaker(bind=engine) or async_sessionmaker(bind=async_engine)"
        )
    return bind


def tenant_plan(plan: WorkerPlan, session_factory: Any) -> WorkerPlan:
    """``plan`` with its tables as the session factory's engine sees them.

    An engine with a ``schema_translate_map`` (a tenant's) moves the statements to the
    tenant's schema; the channels the worker LISTENs and NOTIFYs on move with them (see
    :meth:`~sqla_queue.models.tables.QueueTables.translated`).
    """
    bind = getattr(session_factory, "kw", {}).get("bind")
    options = bind.get_execution_options() if bind is not None else {}
    tables = plan.tables.translated(options.get("schema_translate_map"))
    return plan if tables is plan.tables else replace(plan, tables=tables)


def check_read_session_factory(factory: Any, *, asynchronous: bool) -> Any:
    """``factory``, checked as a worker's ``read_session_factory``: None, or a callable
    that makes sessions of the worker's kind (``Session`` for :class:`Worker`,
    ``AsyncSession`` for :class:`AsyncWorker`).

    Raises:
        TypeError: if it is not callable, or a ``sessionmaker`` of the other kind.
    """
    if factory is None:
        return None
    if not callable(factory):
        raise TypeError(
            f"read_session_factory must be a session factory (a sessionmaker), got {factory!r}"
        )
    from sqlalchemy.ext.asyncio import async_sessionmaker
    from sqlalchemy.orm import sessionmaker

    if asynchronous and isinstance(factory, sessionmaker):
        raise TypeError(
            "an async worker's read_session_factory must make AsyncSessions: "
            "pass an async_sessionmaker, not a sessionmaker"
        )
    if not asynchronous and isinstance(factory, async_sessionmaker):
        raise TypeError(
            "a sync worker's read_session_factory must make Sessions: "
            "pass a sessionmaker, not an async_sessionmaker"
        )
    return factory


class WorkerBase:
    """Setup and teardown common to :class:`Worker` and :class:`AsyncWorker`."""

    #: True for the asyncio face (:class:`AsyncWorker`).
    asynchronous = False

    def __init__(
        self,
        plan: WorkerPlan,
        session_factory: Any,
        settings: WorkerSettings,
        read_session_factory: Any = None,
    ) -> None:
        # A worker opens connections of its own: one connection cannot be its bind.
        refuse_connection_bind(getattr(session_factory, "kw", {}).get("bind"))
        # Handlers run side by side: they cannot share one connection to the replica.
        refuse_connection_bind(
            getattr(read_session_factory, "kw", {}).get("bind"), "read_session_factory"
        )
        check_transactional_binds(plan, session_factory)
        self.plan = tenant_plan(plan, session_factory)
        self.session_factory = session_factory
        self.settings = settings
        #: Where handlers' ``ctx.read_session`` comes from (a read replica), or None.
        self.read_session_factory = check_read_session_factory(
            read_session_factory, asynchronous=self.asynchronous
        )
        #: The engine of the worker's own pool while ``run()`` runs (see worker/pools.py).
        self.worker_engine: Any = None
        self.decider: Decider | None = None
        self._stop_before_start = False
        self._race_indexes = {str(ix.name) for ix in plan.tables.executions.indexes if ix.unique}
        self._services: list[WorkerThread] = []

    @property
    def worker_id(self) -> uuid.UUID | None:
        """This run's id: on the jobs it claims, the daemons it holds and in the workers
        registry. None until ``run()`` starts; each run has a new one."""
        return None if self.decider is None else self.decider.worker_id

    def stop(self) -> None:
        """Ask a running ``run()`` to shut down gracefully. Safe from any thread.

        Called before ``run()`` starts, it makes that run stop at once.
        """
        decider = self.decider
        if decider is None:
            self._stop_before_start = True
        else:
            decider.request_stop(time.monotonic())

    def _new_decider(self, burst: bool) -> Decider:
        decider = Decider(self.plan, self.settings, burst=burst)
        self.decider = decider
        if self._stop_before_start:
            decider.request_stop(time.monotonic())
        return decider

    def _runner(self, decider: Decider) -> HandlerRunner:
        return HandlerRunner(
            worker_id=decider.worker_id,
            clock=decider.clock,
            record=decider.record,
            stop=lambda exc: decider.handler_raised(exc, time.monotonic()),
            transaction=InTransaction(
                decider.guard,
                decider.complete_statement,
                decider.worker_id,
                self.plan.workflows,
                self.plan.tables,
            ),
            settle=decider.settled,
            observer=combine_observers(self.settings.observers)
            if self.settings.observers
            else None,
        )

    @staticmethod
    def _raise_if_stopped_by(decider: Decider) -> None:
        """After a graceful stop the worker made on its own, raise why it stopped.

        A handler's ``KeyboardInterrupt``/``SystemExit`` is raised as it is (the process
        exits as the handler asked); a :class:`WorkerStoppedError` says what the worker
        could not do and how to fix it.
        """
        error = decider.stopped_by
        if error is not None:
            raise error

    def _make_context(self, decider: Decider) -> ContextFactory:
        tasks = self.plan.tasks
        writer = self.plan.workflows
        durable = DurableSupport(self.plan.tables, writer.defaults) if writer is not None else None

        def make(job: ClaimedJob) -> JobContext[Any] | None:
            if not tasks[job.task].pass_context:
                return None
            return JobContext(
                job_id=job.id,
                task=job.task,
                attempt=job.attempt,
                max_attempts=job.max_attempts,
                queue_id=job.queue_id,
                worker_id=decider.worker_id,
                session_factory=self.session_factory,
                stop_flag=decider.stop_flag,
                read_session_factory=self.read_session_factory,
                workflows=self.plan.workflows if job.workflow else None,
                durable=durable,
            )

        return make

    def _own_engine(self, engine: Engine) -> Engine:
        """The run loop's engine: ``engine`` (the handlers') with a pool of the worker's own.

        It keeps ``settings.pool_size`` connections in a sync worker, one in an async
        worker, whose threads have another pool (see :mod:`sqla_queue.worker.pools`).
        """
        size, _ = split_pool_size(self.settings.pool_size, asynchronous=engine.dialect.is_async)
        own = own_pool_engine(engine, size)
        self.worker_engine = own
        return own

    def _background_pool_size(self) -> int:
        """Connections the pool of an async worker's heartbeater and services keeps."""
        return split_pool_size(self.settings.pool_size, asynchronous=True)[1]

    @staticmethod
    def _verify_retry_delay(exc: BaseException, attempt: int) -> float | None:
        """How long to wait before checking the schema again, or None to give up.

        Only a connection lost under the check is worth another try (a pooled connection
        the server has meanwhile closed, a restart): a schema that does not match stays
        an error at once.
        """
        # A server that ended the connection as it was made (an operator's
        # pg_terminate_backend, a restart: SQLSTATE class 57P or 08) is a lost connection
        # too, though no Connection existed yet to be invalidated.
        state = sqlstate_of(exc) or ""
        lost = bool(getattr(exc, "connection_invalidated", False)) or state.startswith(
            ("57P", "08")
        )
        # A backend terminated while the connection was being set up: libpq reports it
        # without a SQLSTATE, in these words (a refused or unknown host reads otherwise).
        lost = lost or "server closed the connection unexpectedly" in str(exc)
        if not lost or attempt >= VERIFY_ATTEMPTS:
            return None
        log.warning("schema check lost its connection (%s); trying again", exc)
        return min(0.1 * 2.0**attempt, 2.0)

    def _is_lost_race(self, exc: BaseException) -> bool:
        """A claim that lost a uniqueness race on one of the queue's own guard indexes."""
        return is_unique_violation_of(exc, self._race_indexes)

    def _start_background(
        self, decider: Decider, engine: Engine
    ) -> tuple[HandlerPool, Heartbeater, Listener | None]:
        pool = HandlerPool(self.settings.concurrency)
        farewell = (decider.statements.unregister, {"worker_id": decider.worker_id})
        heartbeater = Heartbeater(decider, engine, decider.heartbeat_interval, farewell=farewell)
        heartbeater.start()
        self._services = [] if decider.burst else self._new_services(decider, engine)
        for service in self._services:
            service.start()
        listener = None
        if decider.listen:
            # settings.listen_url: a direct connection, when ``engine`` goes through a
            # pooler in transaction mode, where a LISTEN would hear nothing.
            connect = listen_connector(engine, self.settings.listen_url)
            listener = Listener(connect, self.plan.tables.notify_channel, decider.notified)
            listener.start()
        return pool, heartbeater, listener

    def _new_services(self, decider: Decider, engine: Engine) -> list[WorkerThread]:
        """The background services of this worker: its entry in the workers registry, the
        scheduler of the queue's periodic jobs and the supervisor of its daemons (these two
        only when there is something to run), and the maintainer of a partitioned history.

        A burst run (``run(burst=True)``, a drain) starts none: it runs what is due.
        """
        env = ServiceEnv(
            tables=self.plan.tables,
            engine=engine,
            worker_id=decider.worker_id,
            session_factory=self.session_factory,
            maintenance_interval=decider.reclaim_interval,
            lease=self.plan.default_lease,
            shutdown_timeout=self.settings.shutdown_timeout,
            stop_flag=decider.stop_flag,
            tasks=tuple(self.plan.task_names),
            concurrency=self.settings.concurrency,
            running_count=lambda: decider.running_count,
            worker_stats=lambda: decider.stats,
        )
        services: list[WorkerThread] = [WorkerRegistry(env)]
        if self.plan.schedules:
            services.append(Scheduler(env, self.plan.schedules))
        if self.plan.daemons:
            services.append(DaemonSupervisor(env, self.plan.daemons))
        if self.plan.tables.history == HistoryLayout.PARTITIONED:
            services.append(HistoryMaintainer(env))
        return services

    def _stop_background(
        self, pool: HandlerPool, heartbeater: Heartbeater, listener: Listener | None
    ) -> None:
        """Halt the worker's threads and wait (boundedly) until they have ended.

        Idle handler threads end at once; one still running a handler past the shutdown
        timeout is left behind (a daemon: its job was handed back already). Services were
        told to stop with the worker's stop flag; each gets the shutdown timeout to end.
        """
        for service in self._services:
            service.request_stop()
        for service in self._services:
            service.join(self.settings.shutdown_timeout + THREAD_JOIN_TIMEOUT)
        heartbeater.request_stop()
        if listener is not None:
            listener.request_stop()
        pool.close()
        heartbeater.join(THREAD_JOIN_TIMEOUT)
        if listener is not None:
            listener.join(THREAD_JOIN_TIMEOUT)
        pool.join(THREAD_JOIN_TIMEOUT)

    @staticmethod
    def _stats(decider: Decider) -> RunStats:
        return RunStats(**decider.stats)
