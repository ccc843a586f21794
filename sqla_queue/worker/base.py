"""What both worker faces share beyond the core: wiring of threads, contexts and races."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import URL

from sqla_queue._sqlstate import is_unique_violation_of
from sqla_queue.core.outcomes import ClaimedJob
from sqla_queue.instrumentation import combine_observers
from sqla_queue.worker.background import Heartbeater, Listener, libpq_url
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.core import ContextFactory, WorkerCore
from sqla_queue.worker.handlers import HandlerPool, HandlerRunner, InTransaction
from sqla_queue.worker.plan import WorkerPlan
from sqla_queue.worker.services import ServiceEnv, WorkerService
from sqla_queue.worker.settings import WorkerSettings

__all__ = ["RunStats", "WorkerBase", "bound_engine"]

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


def bound_engine(session_factory: Any) -> Any:
    """The engine a ``sessionmaker`` or ``async_sessionmaker`` is bound to."""
    bind = getattr(session_factory, "kw", {}).get("bind")
    if bind is None:
        raise TypeError(
            "the worker needs a session factory bound to an engine: "
            "sessionmaker(bind=engine) or async_sessionmaker(bind=async_engine)"
        )
    return bind


class WorkerBase:
    """Setup and teardown common to :class:`Worker` and :class:`AsyncWorker`."""

    def __init__(self, plan: WorkerPlan, session_factory: Any, settings: WorkerSettings) -> None:
        self.plan = plan
        self.session_factory = session_factory
        self.settings = settings
        self.core: WorkerCore | None = None
        self._stop_before_start = False
        self._race_indexes = {str(ix.name) for ix in plan.tables.executions.indexes if ix.unique}
        self._services: list[WorkerService] = []

    def stop(self) -> None:
        """Ask a running ``run()`` to shut down gracefully. Safe from any thread.

        Called before ``run()`` starts, it makes that run stop at once.
        """
        core = self.core
        if core is None:
            self._stop_before_start = True
        else:
            core.request_stop(time.monotonic())

    def _new_core(self, burst: bool) -> WorkerCore:
        core = WorkerCore(self.plan, self.settings, burst=burst)
        self.core = core
        if self._stop_before_start:
            core.request_stop(time.monotonic())
        return core

    def _runner(self, core: WorkerCore) -> HandlerRunner:
        return HandlerRunner(
            worker_id=core.worker_id,
            clock=core.clock,
            record=core.record,
            stop=lambda exc: core.handler_raised(exc, time.monotonic()),
            transaction=InTransaction(core.guard, core.complete_statement, core.worker_id),
            settle=core.settled,
            observer=combine_observers(self.settings.observers)
            if self.settings.observers
            else None,
        )

    @staticmethod
    def _raise_if_stopped_by(core: WorkerCore) -> None:
        """After a graceful stop the worker made on its own, raise why it stopped.

        A handler's ``KeyboardInterrupt``/``SystemExit`` is raised as it is (the process
        exits as the handler asked); a :class:`WorkerStoppedError` says what the worker
        could not do and how to fix it.
        """
        error = core.stopped_by
        if error is not None:
            raise error

    def _make_context(self, core: WorkerCore) -> ContextFactory:
        tasks = self.plan.tasks

        def make(job: ClaimedJob) -> JobContext[Any] | None:
            if not tasks[job.task].pass_context:
                return None
            return JobContext(
                job_id=job.id,
                task=job.task,
                attempt=job.attempt,
                max_attempts=job.max_attempts,
                queue_id=job.queue_id,
                worker_id=core.worker_id,
                session_factory=self.session_factory,
                stop_flag=core.stop_flag,
            )

        return make

    @staticmethod
    def _verify_retry_delay(exc: BaseException, attempt: int) -> float | None:
        """How long to wait before checking the schema again, or None to give up.

        Only a connection lost under the check is worth another try (a pooled connection
        the server has meanwhile closed, a restart): a schema that does not match stays
        an error at once.
        """
        lost = bool(getattr(exc, "connection_invalidated", False))
        if not lost or attempt >= VERIFY_ATTEMPTS:
            return None
        log.warning("schema check lost its connection (%s); trying again", exc)
        return min(0.1 * 2.0**attempt, 2.0)

    def _is_lost_race(self, exc: BaseException) -> bool:
        """A claim that lost a uniqueness race on one of the queue's own guard indexes."""
        return is_unique_violation_of(exc, self._race_indexes)

    def _start_background(
        self, core: WorkerCore, engine: Engine, url: URL
    ) -> tuple[HandlerPool, Heartbeater, Listener | None]:
        pool = HandlerPool(self.settings.concurrency)
        heartbeater = Heartbeater(core, engine, core.heartbeat_interval)
        heartbeater.start()
        self._services = [] if core.burst else self._new_services(core, engine)
        for service in self._services:
            service.start()
        listener = None
        if core.listen:
            listener = Listener(libpq_url(url), self.plan.tables.notify_channel, core.notified)
            listener.start()
        return pool, heartbeater, listener

    def _new_services(self, core: WorkerCore, engine: Engine) -> list[WorkerService]:
        """The background services of this worker: its entry in the workers registry, the
        scheduler of the queue's periodic jobs and the supervisor of its daemons (these two
        only when there is something to run).

        A burst run (``run(burst=True)``, a drain) starts none: it runs what is due.
        """
        from sqla_queue.worker.registry import WorkerRegistry

        env = ServiceEnv(
            tables=self.plan.tables,
            engine=engine,
            worker_id=core.worker_id,
            session_factory=self.session_factory,
            maintenance_interval=core.reclaim_interval,
            lease=self.plan.default_lease,
            shutdown_timeout=self.settings.shutdown_timeout,
            stop_flag=core.stop_flag,
            tasks=tuple(self.plan.task_names),
            concurrency=self.settings.concurrency,
            running_count=lambda: core.running_count,
            worker_stats=lambda: core.stats,
        )
        services: list[WorkerService] = [WorkerRegistry(env)]
        if self.plan.schedules:
            from sqla_queue.worker.scheduler import Scheduler

            services.append(Scheduler(env, self.plan.schedules))
        if self.plan.daemons:
            from sqla_queue.worker.daemons import DaemonSupervisor

            services.append(DaemonSupervisor(env, self.plan.daemons))
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
        heartbeater.halt.set()
        if listener is not None:
            listener.halt.set()
        pool.close()
        heartbeater.join(THREAD_JOIN_TIMEOUT)
        if listener is not None:
            listener.join(THREAD_JOIN_TIMEOUT)
        pool.join(THREAD_JOIN_TIMEOUT)

    @staticmethod
    def _stats(core: WorkerCore) -> RunStats:
        return RunStats(**core.stats)
