"""The Queue: a façade over the queue's tables, its task registry and the feature modules.

Each method hands over to the module that does the work (registration to
:mod:`sqla_queue.registry`, enqueue to :mod:`sqla_queue.enqueue`, ...); no SQL here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Literal,
    ParamSpec,
    TypeAlias,
    TypeVar,
    Unpack,
    overload,
)

from sqlalchemy import Engine, MetaData
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm import registry as Registry

from sqla_queue import admin, controls, history, lifecycle
from sqla_queue.controls import RateLimit, TaskControl
from sqla_queue.daemons import DaemonBackoff, DaemonSpec, DaemonStatus, read_daemon_status
from sqla_queue.enqueue import by_name
from sqla_queue.errors import UnknownTaskError
from sqla_queue.history import HistoryPartition, MaintainReport
from sqla_queue.logic.backoff import RetryPolicy
from sqla_queue.models import DEFAULT_PREFIX, build_tables, map_classes
from sqla_queue.models.mapped import map_workflow_class
from sqla_queue.models.tables import HistoryLayout, QueueTables
from sqla_queue.periodic import Schedule, ScheduleState, read_schedules
from sqla_queue.queue_durable import DurableMethods
from sqla_queue.queue_links import RowLinks
from sqla_queue.queue_workflows import WorkflowMethods
from sqla_queue.registry import DaemonFn, QueueDefaults, TaskLimit, TaskRegistry
from sqla_queue.schema.ddl import create_queue_schema
from sqla_queue.schema.verify import verify_schema
from sqla_queue.spec import EnqueueKwargs, JobSpec
from sqla_queue.status import DEFAULT_SCAN_CAP, QueueStatus, read_status
from sqla_queue.task import Task, TaskKwargs
from sqla_queue.worker.aio import AsyncWorker
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.plan import TaskRuntime, WorkerPlan
from sqla_queue.worker.settings import WorkerSettings
from sqla_queue.worker.sync import Worker

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["AsyncSource", "JSONValue", "Queue", "SyncSource", "TaskLimit"]

P = ParamSpec("P")
R = TypeVar("R")
Bind = Session | Connection | AsyncSession | AsyncConnection
#: What ``cancel`` and ``result`` open a connection of their own from.
SyncSource = Engine | Connection | Session | sessionmaker[Session]
#: The async twins of :data:`SyncSource`: ``cancel`` and ``result`` return a coroutine.
AsyncSource = AsyncEngine | AsyncConnection | AsyncSession | async_sessionmaker[AsyncSession]
#: A value stored as JSON, as it comes back: a handler's result, say.
JSONValue: TypeAlias = bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"] | None


def _mapper_registry(base: Any, metadata: MetaData | None) -> tuple[Registry, MetaData]:
    """The ORM registry to map the queue's classes in, and the metadata of its tables."""
    if (base is None) == (metadata is None):
        raise TypeError("Queue() needs exactly one of a declarative base or metadata=")
    if base is None:
        assert metadata is not None
        return Registry(metadata=metadata), metadata
    if not hasattr(base, "registry") or not hasattr(base, "metadata"):
        raise TypeError(
            f"{base!r} is not a declarative base: pass a class built with "
            "DeclarativeBase/declarative_base(), or use Queue(metadata=...)"
        )
    return base.registry, base.metadata


def _runtime(task: Task[Any, Any]) -> TaskRuntime:
    """What a worker needs of ``task``: its handler and its settled defaults."""
    opts = task.task_options
    return TaskRuntime(
        name=task.name,
        handler=task.fn,
        is_async=task.is_async,
        pass_context=opts.pass_context,
        max_attempts=opts.max_attempts,
        retry=opts.retry,
        lease=opts.lost_interval,
        max_reclaims=opts.max_reclaims,
        declared_limit=opts.concurrency_limit,
        transactional=opts.transactional,
    )


async def _jobs_of(report: Coroutine[Any, Any, history.PruneReport]) -> admin.Pruned:
    return (await report).pruned


def _prune_partitions(
    session: Bind, tables: QueueTables, older_than: dt.timedelta, include_failed: bool
) -> admin.Pruned | Coroutine[Any, Any, admin.Pruned]:
    """Prune a partitioned history by dropping partitions; what went, jobs and rows."""
    report = history.prune_history(
        session, tables, older_than=older_than, include_failed=include_failed
    )
    return _jobs_of(report) if isinstance(report, Coroutine) else report.pruned


def _paused(session: Session | Connection, tables: QueueTables) -> list[str]:
    """The tasks stored as paused."""
    return [c.task for c in controls.stored_controls(session, tables) if c.paused]


def _rate_limited(session: Session | Connection, tables: QueueTables) -> list[str]:
    """The tasks with a stored rate limit."""
    return [c.task for c in controls.stored_controls(session, tables) if c.rate_limit is not None]


class Queue(WorkflowMethods, RowLinks, DurableMethods):
    """A job queue whose tables live in your application's own metadata.

    ``queue = Queue(Base)`` puts the queue's models in a declarative ``Base``'s metadata (so
    Alembic sees them); ``Queue(metadata=md)`` does the same for a Core-only application.

    Args:
        base: the host's declarative base class.
        metadata: a ``MetaData``, for hosts without a declarative base.
        schema: PostgreSQL schema of the tables (default: the metadata's, else the search
            path; one that differs from the metadata's raises an error).
        prefix: table-name prefix (default ``sqla_queue_``).
        notify: send a NOTIFY per transaction that enqueued work, so idle workers wake at once.
        lost_interval: seconds without a heartbeat after which a running job is lost.
        max_reclaims: how often a job may be lost before it is failed instead of rerun.
        max_attempts: default attempts per job (1: a failure is final).
        retry: default backoff between attempts.
        history: ``"plain"`` (the default), ``"partitioned"`` (:mod:`sqla_queue.history`) or
            ``"none"`` (succeeded jobs deleted at completion), as the database has it.
    """

    def __init__(
        self,
        base: Any = None,
        *,
        metadata: MetaData | None = None,
        schema: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        notify: bool = True,
        lost_interval: float = 30.0,
        max_reclaims: int = 3,
        max_attempts: int = 1,
        retry: RetryPolicy | None = None,
        history: str = "plain",
    ) -> None:
        reg, self.metadata = _mapper_registry(base, metadata)
        defaults = QueueDefaults.checked(max_attempts, retry, lost_interval, max_reclaims)
        if not isinstance(notify, bool):
            raise TypeError(f"notify must be True or False, got {notify!r}")
        self.tables = build_tables(self.metadata, schema=schema, prefix=prefix, history=history)
        self.Job, self.JobExecution = map_classes(reg, self.tables)
        self.WorkflowRecord = map_workflow_class(reg, self.tables)
        self.notify = notify
        self.lost_interval, self.max_reclaims = defaults.lost_interval, defaults.max_reclaims
        self.max_attempts, self.retry = defaults.max_attempts, defaults.retry
        self._registry = TaskRegistry.build(self.tables, notify, defaults)
        # Writes every enqueue of this queue; each Task holds it, never the Queue.
        self._enqueuer = self._registry.enqueuer

    def __repr__(self) -> str:
        where = f"{self.tables.schema}." if self.tables.schema else ""
        return f"<Queue {where}{self.tables.prefix}* tasks={sorted(self._registry.tasks)}>"

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        pass_context: Literal[False] = False,
        **options: Unpack[TaskKwargs],
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    @overload
    def task(
        self, fn: None = None, /, *, pass_context: Literal[True], **options: Unpack[TaskKwargs]
    ) -> Callable[[Callable[Concatenate[JobContext[Any], P], R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        pass_context: bool = False,
        **options: Unpack[TaskKwargs],
    ) -> Task[Any, Any] | Callable[[Callable[..., Any]], Task[Any, Any]]:
        """Register a handler as a task, ``@queue.task`` or ``@queue.task(name="x", ...)``, whose
        options are :class:`~sqla_queue.task.TaskKwargs`; the queue's defaults fill the rest."""
        register = self._registry.task_decorator(pass_context=pass_context, options=options)
        return register if fn is None else register(fn)

    def declare_task(
        self,
        name: str,
        *,
        priority: int = 0,
        max_attempts: int | None = None,
        max_pending: int | None = None,
    ) -> None:
        """Let this process enqueue ``name`` by name, without its handler. See :meth:`task`."""
        self._registry.declare(name, priority, max_attempts, max_pending)

    @property
    def tasks(self) -> Mapping[str, Task[Any, Any]]:
        """The registered tasks, by name."""
        return self._registry.tasks

    def get_task(self, name: str) -> Task[Any, Any]:
        """The registered task called ``name``, or :class:`UnknownTaskError`."""
        return self._registry.get_task(name)

    def periodic(
        self,
        cron: str | None = None,
        /,
        *,
        every: dt.timedelta | None = None,
        name: str | None = None,
        timezone: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        catch_up: str = "one",
        catch_up_limit: int | None = None,
        pass_context: bool = False,
        **options: Any,
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """A task run on a schedule, ``@queue.periodic("*/5 * * * *")``: the schedule's options
        are :class:`~sqla_queue.periodic.Schedule`'s, the others :meth:`task`'s."""
        rule = (every, name, timezone, args, kwargs, catch_up, catch_up_limit)
        return self._registry.periodic_decorator(cron, *rule, pass_context, options)

    def schedule(
        self,
        task: Task[Any, Any] | str,
        cron: str | None = None,
        /,
        *,
        every: dt.timedelta | None = None,
        name: str | None = None,
        timezone: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        catch_up: str = "one",
        catch_up_limit: int | None = None,
    ) -> Schedule:
        """Run a registered task (handle or name) on a schedule; see :meth:`periodic`."""
        rule = (every, name, timezone, args, kwargs, catch_up, catch_up_limit)
        return self._registry.schedule(task, cron, *rule)

    def schedules(self, session: Session | Connection) -> list[ScheduleState]:
        """Every schedule's last and next tick. See :func:`sqla_queue.periodic.read_schedules`."""
        return read_schedules(session, self.tables, self._registry.schedules)

    @overload
    def daemon(self, fn: DaemonFn, /) -> DaemonFn: ...

    @overload
    def daemon(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        instances: int = 1,
        lost_interval: float | None = None,
        backoff: DaemonBackoff | None = None,
    ) -> Callable[[DaemonFn], DaemonFn]: ...

    def daemon(
        self,
        fn: DaemonFn | None = None,
        /,
        *,
        name: str | None = None,
        instances: int = 1,
        lost_interval: float | None = None,
        backoff: DaemonBackoff | None = None,
    ) -> DaemonFn | Callable[[DaemonFn], DaemonFn]:
        """Register a long-running loop, taking a :class:`~sqla_queue.daemons.DaemonContext`,
        that workers keep alive. See :class:`~sqla_queue.daemons.DaemonSpec` for the options."""
        register = self._registry.daemon_decorator(name, instances, lost_interval, backoff)
        return register if fn is None else register(fn)

    @property
    def daemons(self) -> Mapping[str, DaemonSpec]:
        """The registered daemons, by name."""
        return self._registry.daemons

    def daemon_status(self, session: Session | Connection) -> list[DaemonStatus]:
        """Every daemon instance. See :func:`sqla_queue.daemons.read_daemon_status`."""
        return read_daemon_status(session, self.tables)

    @overload
    def enqueue(
        self,
        session: Session | Connection,
        task: str,
        kwargs: Mapping[str, Any] | None = None,
        *,
        args: Sequence[Any] = (),
        **options: Unpack[EnqueueKwargs],
    ) -> int: ...

    @overload
    def enqueue(
        self,
        session: AsyncSession | AsyncConnection,
        task: str,
        kwargs: Mapping[str, Any] | None = None,
        *,
        args: Sequence[Any] = (),
        **options: Unpack[EnqueueKwargs],
    ) -> Coroutine[Any, Any, int]: ...

    def enqueue(
        self,
        session: Bind,
        task: str,
        kwargs: Mapping[str, Any] | None = None,
        *,
        args: Sequence[Any] = (),
        **options: Unpack[EnqueueKwargs],
    ) -> int | Coroutine[Any, Any, int]:
        """Enqueue ``task`` by name; the options are :class:`~sqla_queue.spec.EnqueueKwargs`."""
        return self._enqueuer.enqueue_spec(session, by_name(task, kwargs, args, options))

    @overload
    def enqueue_many(
        self, session: Session | Connection, specs: Iterable[JobSpec]
    ) -> list[int]: ...

    @overload
    def enqueue_many(
        self, session: AsyncSession | AsyncConnection, specs: Iterable[JobSpec]
    ) -> Coroutine[Any, Any, list[int]]: ...

    def enqueue_many(
        self, session: Bind, specs: Iterable[JobSpec]
    ) -> list[int] | Coroutine[Any, Any, list[int]]:
        """Enqueue many calls (``task.call(...)``), all or nothing; the ids in input order."""
        return self._enqueuer.enqueue_specs(session, specs)

    def enqueue_specs(
        self, session: Bind, specs: Iterable[JobSpec]
    ) -> list[int] | Coroutine[Any, Any, list[int]]:
        """Shared path of every bulk enqueue (see :meth:`enqueue_many`)."""
        return self._enqueuer.enqueue_specs(session, specs)

    def enqueue_spec(self, session: Bind, spec: JobSpec) -> int | Coroutine[Any, Any, int]:
        """Enqueue one call; the id, or a coroutine of it for async sessions."""
        return self._enqueuer.enqueue_spec(session, spec)

    def create_all(self, connection: Connection) -> None:
        """Create the tables without Alembic. See :mod:`sqla_queue.schema.ddl`."""
        create_queue_schema(connection, self.tables)

    def verify(self, connection: Connection) -> None:
        """Check the schema and privileges. See :func:`~sqla_queue.schema.verify.verify_schema`."""
        verify_schema(connection, self.tables)

    @overload
    def requeue(
        self, session: Session | Connection, job_ids: Iterable[int]
    ) -> admin.RequeueReport: ...

    @overload
    def requeue(
        self, session: AsyncSession | AsyncConnection, job_ids: Iterable[int]
    ) -> Coroutine[Any, Any, admin.RequeueReport]: ...

    def requeue(
        self, session: Bind, job_ids: Iterable[int]
    ) -> admin.RequeueReport | Coroutine[Any, Any, admin.RequeueReport]:
        """Put failed or cancelled jobs back in the queue. See :func:`sqla_queue.admin.requeue`."""
        return admin.requeue(session, self.tables, job_ids)

    @overload
    def prune(
        self,
        session: Session | Connection,
        *,
        older_than: dt.timedelta,
        include_failed: bool = False,
    ) -> admin.Pruned: ...

    @overload
    def prune(
        self,
        session: AsyncSession | AsyncConnection,
        *,
        older_than: dt.timedelta,
        include_failed: bool = False,
    ) -> Coroutine[Any, Any, admin.Pruned]: ...

    def prune(
        self, session: Bind, *, older_than: dt.timedelta, include_failed: bool = False
    ) -> admin.Pruned | Coroutine[Any, Any, admin.Pruned]:
        """Delete finished jobs older than ``older_than``, and what they leave behind in
        every table; a :class:`~sqla_queue.admin.Pruned` (the number of jobs, with the rows
        removed per table). See :func:`sqla_queue.admin.prune`."""
        if self.tables.history == HistoryLayout.PARTITIONED:
            return _prune_partitions(session, self.tables, older_than, include_failed)
        return admin.prune(
            session, self.tables, older_than=older_than, include_failed=include_failed
        )

    def maintain_history(
        self, session: Bind, *, ahead: int = 3, backfill: bool = False
    ) -> MaintainReport | Coroutine[Any, Any, MaintainReport]:
        """Create history partitions ahead. See :func:`sqla_queue.history.maintain_history`."""
        return history.maintain_history(session, self.tables, ahead=ahead, backfill=backfill)

    def history_partitions(
        self, session: Bind
    ) -> list[HistoryPartition] | Coroutine[Any, Any, list[HistoryPartition]]:
        """The history partitions. See :func:`sqla_queue.history.history_partitions`."""
        return history.history_partitions(session, self.tables)

    @overload
    def cancel(
        self, source: AsyncSource, job_ids: Iterable[int]
    ) -> Coroutine[Any, Any, dict[int, str]]: ...

    @overload
    def cancel(self, source: SyncSource, job_ids: Iterable[int]) -> dict[int, str]: ...

    def cancel(
        self, source: SyncSource | AsyncSource, job_ids: Iterable[int]
    ) -> dict[int, str] | Coroutine[Any, Any, dict[int, str]]:
        """Cancel jobs; a :class:`~sqla_queue.CancelOutcome` value per id (a coroutine of it
        for an async ``source``). See :func:`sqla_queue.lifecycle.cancel`."""
        outcomes: dict[int, str] | Coroutine[Any, Any, dict[int, str]]
        outcomes = lifecycle.cancel(source, self.tables, job_ids, notify=self.notify)
        return outcomes

    @overload
    def result(
        self, source: AsyncSource, job_id: int, *, timeout: float | dt.timedelta | None = 30.0
    ) -> Coroutine[Any, Any, JSONValue]: ...

    @overload
    def result(
        self, source: SyncSource, job_id: int, *, timeout: float | dt.timedelta | None = 30.0
    ) -> JSONValue: ...

    def result(
        self,
        source: SyncSource | AsyncSource,
        job_id: int,
        *,
        timeout: float | dt.timedelta | None = 30.0,
    ) -> JSONValue | Coroutine[Any, Any, JSONValue]:
        """Wait for ``job_id`` to finish; its handler's value. See :mod:`sqla_queue.lifecycle`."""
        (checked,) = admin.check_job_ids([job_id])
        value: JSONValue | Coroutine[Any, Any, JSONValue]
        value = lifecycle.wait_for(source, self.tables, checked, lifecycle.check_timeout(timeout))
        return value

    def set_limit(self, session: Session | Connection, task: str, limit: int | None) -> None:
        """Store (``None``: remove) ``task``'s concurrency limit. See :mod:`sqla_queue.admin`."""
        admin.check_limit(limit)
        stored = None if limit is not None else lambda: admin.stored_limits(session, self.tables)
        doing = "remove a" if limit is None else "store a"
        self._registry.check_known(f"{doing} concurrency limit", task, stored=stored)
        admin.set_limit(session, self.tables, task, limit)

    def limits(self, session: Session | Connection) -> dict[str, TaskLimit]:
        """Every limit that applies: declared in code, stored in the database, or both."""
        return self._registry.limits(admin.stored_limits(session, self.tables))

    def pause(self, session: Session | Connection, task: str) -> None:
        """Pause ``task`` for every worker. See :func:`sqla_queue.controls.set_paused`."""
        self._registry.check_known("pause", task)
        controls.set_paused(session, self.tables, task, True)

    def resume(self, session: Session | Connection, task: str) -> None:
        """Undo :meth:`pause`. See :func:`sqla_queue.controls.set_paused`."""
        self._registry.check_known("resume", task, stored=lambda: _paused(session, self.tables))
        controls.set_paused(session, self.tables, task, False)

    def set_rate_limit(
        self,
        session: Session | Connection,
        task: str,
        max_starts: int | None,
        per: float | dt.timedelta = 1.0,
    ) -> None:
        """Limit ``task``'s starts per ``per`` seconds. See :mod:`sqla_queue.controls`."""
        limit = (
            None if max_starts is None else RateLimit(*controls.check_rate_limit(max_starts, per))
        )
        stored = None if limit is not None else lambda: _rate_limited(session, self.tables)
        doing = "remove a" if limit is None else "store a"
        self._registry.check_known(f"{doing} rate limit", task, stored=stored)
        controls.set_rate_limit(session, self.tables, task, limit)

    def controls(self, session: Session | Connection) -> dict[str, TaskControl]:
        """Every task that is paused or rate-limited, by name."""
        return {c.task: c for c in controls.stored_controls(session, self.tables)}

    def status(self, session: Session | Connection, *, scan_cap: int | None = None) -> QueueStatus:
        """What the queue is doing now. See :func:`sqla_queue.status.read_status`."""
        cap = DEFAULT_SCAN_CAP if scan_cap is None else scan_cap
        names, declared = self._registry.known.names(), self._registry.declared_limits()
        return read_status(
            session, self.tables, tasks=names, declared_limits=declared, scan_cap=cap
        )

    def dashboard(
        self, bind: Any, *, auth: Callable[[Any], Any] | None = None, **options: Any
    ) -> Starlette:
        """The web dashboard, an ASGI app. See :func:`sqla_queue.dashboard.create_dashboard`."""
        # Imported here: the dashboard needs Starlette, an optional extra.
        from sqla_queue.dashboard import create_dashboard

        return create_dashboard(self, bind, auth=auth, **options)

    def worker_plan(self, tasks: Sequence[str] | None = None) -> WorkerPlan:
        """What a worker serving ``tasks`` (default: every registered task) needs."""
        names = self._registry.task_names() if tasks is None else list(tasks)
        if not names:
            raise UnknownTaskError("this worker has no tasks: register one with @queue.task")
        runtimes = {name: _runtime(self.get_task(name)) for name in names}
        schedules, daemons = self._registry.schedules.values(), self._registry.daemons.values()
        return WorkerPlan(
            self.tables,
            self.notify,
            self.lost_interval,
            runtimes,
            (*schedules,),
            (*daemons,),
            self._enqueuer.workflows,
        )

    def worker(
        self,
        session_factory: sessionmaker[Session],
        *,
        read_session_factory: sessionmaker[Session] | None = None,
        **settings: Any,
    ) -> Worker:
        """A worker running handlers in threads. See :class:`~sqla_queue.WorkerSettings`."""
        ws = WorkerSettings(**settings)
        return Worker(self.worker_plan(ws.tasks), session_factory, ws, read_session_factory)

    def async_worker(
        self,
        session_factory: async_sessionmaker[AsyncSession],
        *,
        read_session_factory: async_sessionmaker[AsyncSession] | None = None,
        **settings: Any,
    ) -> AsyncWorker:
        """An asyncio worker; ``await worker.run()``. Takes :meth:`worker`'s arguments."""
        ws = WorkerSettings(**settings)
        return AsyncWorker(self.worker_plan(ws.tasks), session_factory, ws, read_session_factory)
