"""The Queue: tables in the host's metadata, a task registry, enqueue and workers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar, overload

from sqlalchemy import MetaData, Select, select
from sqlalchemy.engine import Connection, CursorResult, Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.orm import registry as Registry

from sqla_queue import statements
from sqla_queue._binds import scalars_each
from sqla_queue._identifiers import validate_task_name
from sqla_queue.core.backoff import RetryPolicy
from sqla_queue.enqueue import (
    DriverStatement,
    TaskDefaults,
    driver_statement_for,
    encode_one,
    prepare_rows,
)
from sqla_queue.errors import TaskAlreadyRegisteredError, UnknownTaskError
from sqla_queue.models import DEFAULT_PREFIX, Job, JobExecution, build_tables, map_classes
from sqla_queue.task import EnqueueOptions, JobSpec, Task, TaskOptions, make_enqueue_options

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import async_sessionmaker
    from sqlalchemy.orm import sessionmaker

    from sqla_queue.worker.aio import AsyncWorker
    from sqla_queue.worker.context import JobContext
    from sqla_queue.worker.sync import Worker

__all__ = ["Queue", "TaskLimit"]

P = ParamSpec("P")
R = TypeVar("R")
Bind = Session | Connection | AsyncSession | AsyncConnection


@dataclass(frozen=True)
class TaskLimit:
    """A task's concurrency limit: the default declared in code, the stored override."""

    task: str
    declared: int | None
    stored: int | None

    @property
    def effective(self) -> int | None:
        """The limit workers apply: the stored value, else the declared one."""
        return self.stored if self.stored is not None else self.declared


class Queue:
    """A job queue whose tables live in your application's own metadata.

    ``queue = Queue(Base)`` attaches the queue's models to a declarative ``Base`` (they
    appear in ``Base.metadata``, so Alembic sees them); ``Queue(metadata=md)`` does the same
    for a Core-only application.

    Args:
        base: the host's declarative base class.
        metadata: a ``MetaData``, for hosts without a declarative base.
        schema: PostgreSQL schema of the queue's tables (default: the search path).
        prefix: table-name prefix (default ``sqla_queue_``).
        notify: send one NOTIFY per committing transaction that enqueued work, so idle
            workers wake at once. Polling remains the fallback either way.
        lost_interval: seconds without a heartbeat after which a running job is lost and
            returned to pending. Tasks may override it.
        max_reclaims: how often a job may be lost before it is failed instead of rerun.
        max_attempts: default attempts per job (1: a failure is final).
        retry: default backoff between attempts.
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
    ) -> None:
        if (base is None) == (metadata is None):
            raise TypeError("Queue() needs exactly one of a declarative base or metadata=")
        if base is not None:
            if not hasattr(base, "registry") or not hasattr(base, "metadata"):
                raise TypeError(
                    f"{base!r} is not a declarative base: pass a class built with "
                    "DeclarativeBase/declarative_base(), or use Queue(metadata=...)"
                )
            reg: Registry = base.registry
            metadata = base.metadata
        else:
            assert metadata is not None
            reg = Registry(metadata=metadata)
        if lost_interval <= 0:
            raise ValueError("lost_interval must be positive")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.metadata: MetaData = metadata
        self.tables = build_tables(metadata, schema=schema, prefix=prefix)
        self.Job: type[Job]
        self.JobExecution: type[JobExecution]
        self.Job, self.JobExecution = map_classes(reg, self.tables)
        self.notify = notify
        self.lost_interval = lost_interval
        self.max_reclaims = max_reclaims
        self.max_attempts = max_attempts
        self.retry = retry or RetryPolicy()
        self._tasks: dict[str, Task[Any, Any]] = {}
        self._declared: dict[str, TaskDefaults] = {}
        # The enqueue statement compiled for each dialect seen and each shape (None: not
        # served that way).
        self._driver_enqueue: dict[tuple[Dialect, bool], DriverStatement | None] = {}

    def __repr__(self) -> str:
        where = f"{self.tables.schema}." if self.tables.schema else ""
        return f"<Queue {where}{self.tables.prefix}* tasks={sorted(self._tasks)}>"

    # -- tasks -----------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        lost_interval: float | None = None,
        max_reclaims: int | None = None,
        concurrency_limit: int | None = None,
        pass_context: Literal[False] = False,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        lost_interval: float | None = None,
        max_reclaims: int | None = None,
        concurrency_limit: int | None = None,
        pass_context: Literal[True],
    ) -> Callable[[Callable[Concatenate[JobContext[Any], P], R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        lost_interval: float | None = None,
        max_reclaims: int | None = None,
        concurrency_limit: int | None = None,
        pass_context: bool = False,
    ) -> Any:
        """Register a ``def`` or ``async def`` handler as a task.

        Use bare (``@queue.task``) or with options (``@queue.task(max_attempts=5)``). The
        name defaults to ``module.qualname`` of the function; give ``name=`` to keep it
        stable across refactors, since stored jobs refer to it. With ``pass_context=True``
        the handler receives a :class:`~sqla_queue.JobContext` as its first argument.
        ``concurrency_limit=N`` caps the executions running at once across all workers
        (see :meth:`set_limit` to change it at runtime).
        """

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            task_name = validate_task_name(name or f"{func.__module__}.{func.__qualname__}")
            if task_name in self._tasks:
                raise TaskAlreadyRegisteredError(
                    f"task {task_name!r} is already registered to "
                    f"{self._tasks[task_name].fn!r}; give one of them another name="
                )
            if max_attempts is not None and max_attempts < 1:
                raise ValueError("max_attempts must be at least 1")
            if lost_interval is not None and lost_interval <= 0:
                raise ValueError("lost_interval must be positive")
            _check_limit(concurrency_limit, allow_none=True)
            options = TaskOptions(
                name=task_name,
                priority=priority,
                max_attempts=max_attempts or self.max_attempts,
                retry=retry or self.retry,
                lost_interval=lost_interval,
                max_reclaims=max_reclaims,
                pass_context=pass_context,
                concurrency_limit=concurrency_limit,
            )
            handle: Task[Any, Any] = Task(self, func, options)
            self._tasks[task_name] = handle
            return handle

        if fn is not None:
            return register(fn)
        return register

    def declare_task(
        self, name: str, *, priority: int = 0, max_attempts: int | None = None
    ) -> None:
        """Let this process enqueue ``name`` by name without importing its handler.

        Producers that live apart from the workers declare the names they send, so a typo
        still fails at enqueue time instead of leaving a job no worker will ever claim.
        """
        validate_task_name(name)
        self._declared[name] = TaskDefaults(priority, max_attempts or self.max_attempts)

    @property
    def tasks(self) -> Mapping[str, Task[Any, Any]]:
        """The registered tasks, by name."""
        return dict(self._tasks)

    def get_task(self, name: str) -> Task[Any, Any]:
        """The registered task called ``name``, or :class:`UnknownTaskError`."""
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTaskError(self._unknown_message(name)) from None

    def _unknown_message(self, name: str) -> str:
        known = sorted(set(self._tasks) | set(self._declared))
        return (
            f"unknown task {name!r}: it is neither registered with @queue.task nor declared "
            f"with queue.declare_task(); known tasks: {known or 'none'}"
        )

    def _defaults_for(self, name: str) -> TaskDefaults:
        task = self._tasks.get(name)
        if task is not None:
            opts = task.task_options
            return TaskDefaults(opts.priority, opts.max_attempts)
        if name in self._declared:
            return self._declared[name]
        raise UnknownTaskError(self._unknown_message(name))

    def _checked_defaults(self, name: str) -> TaskDefaults:
        """``validate_task_name`` then ``_defaults_for``, with the check only when needed.

        Registered and declared names were validated when they were added, so a known name
        skips the pattern match; any other value raises what the two calls would raise.
        """
        if not isinstance(name, str) or (name not in self._tasks and name not in self._declared):
            validate_task_name(name)
        return self._defaults_for(name)

    # -- statements ------------------------------------------------------------------------

    @cached_property
    def _enqueue_statements(self) -> dict[bool, Select[int]]:
        """The enqueue statement by shape: for calls with a ``queue_id`` (True) or none."""
        return {
            keyed: statements.enqueue_statement(self.tables, notify=self.notify, keyed=keyed)
            for keyed in (True, False)
        }

    def _driver_statement(self, connection: Connection, keyed: bool) -> DriverStatement | None:
        """The enqueue statement as driver SQL for ``connection``, or None to use execute.

        A ``schema_translate_map`` execution option changes the compiled text, so such a
        connection keeps SQLAlchemy's own execution, which applies it.
        """
        if "schema_translate_map" in connection.get_execution_options():
            return None
        key = (connection.dialect, keyed)
        try:
            return self._driver_enqueue[key]
        except KeyError:
            found = driver_statement_for(self._enqueue_statements[keyed], connection.dialect)
            self._driver_enqueue[key] = found
            return found

    def _execute_enqueue(self, connection: Connection, rows: str, keyed: bool) -> CursorResult[Any]:
        driver = self._driver_statement(connection, keyed)
        if driver is None:
            return connection.execute(self._enqueue_statements[keyed], {"rows": rows})
        return connection.exec_driver_sql(driver.text, driver.params({"rows": rows}))

    async def _execute_enqueue_async(
        self, bind: AsyncSession | AsyncConnection, rows: str, keyed: bool
    ) -> int:
        connection = await bind.connection() if isinstance(bind, AsyncSession) else bind
        sync = connection.sync_connection
        driver = None if sync is None else self._driver_statement(sync, keyed)
        if driver is None:
            result = await connection.execute(self._enqueue_statements[keyed], {"rows": rows})
        else:
            result = await connection.exec_driver_sql(driver.text, driver.params({"rows": rows}))
        return int(result.scalar_one())

    # -- enqueue ---------------------------------------------------------------------------

    @overload
    def enqueue(
        self,
        session: Session | Connection,
        task: str,
        kwargs: Mapping[str, Any] | None = None,
        *,
        args: Sequence[Any] = (),
        run_at: dt.datetime | None = None,
        delay: float | dt.timedelta | None = None,
        priority: int | None = None,
        queue_id: str | None = None,
        max_attempts: int | None = None,
    ) -> int: ...

    @overload
    def enqueue(
        self,
        session: AsyncSession | AsyncConnection,
        task: str,
        kwargs: Mapping[str, Any] | None = None,
        *,
        args: Sequence[Any] = (),
        run_at: dt.datetime | None = None,
        delay: float | dt.timedelta | None = None,
        priority: int | None = None,
        queue_id: str | None = None,
        max_attempts: int | None = None,
    ) -> Coroutine[Any, Any, int]: ...

    def enqueue(
        self,
        session: Bind,
        task: str,
        kwargs: Mapping[str, Any] | None = None,
        *,
        args: Sequence[Any] = (),
        run_at: dt.datetime | None = None,
        delay: float | dt.timedelta | None = None,
        priority: int | None = None,
        queue_id: str | None = None,
        max_attempts: int | None = None,
    ) -> int | Coroutine[Any, Any, int]:
        """Enqueue task ``task`` by name, with keyword arguments ``kwargs``.

        For producers that do not import the handler (see :meth:`declare_task`). The
        per-call options are keyword-only and separate from the task's own arguments.
        Returns the job id (or a coroutine of it for async sessions).
        """
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(
                f"kwargs must be a mapping of the task's keyword arguments, got {kwargs!r}"
            )
        options = make_enqueue_options(
            run_at=run_at,
            delay=delay,
            priority=priority,
            queue_id=queue_id,
            max_attempts=max_attempts,
        )
        spec = JobSpec(task, tuple(args), dict(kwargs or {}), options)
        return self.enqueue_spec(session, spec)

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
        """Enqueue many calls in ``session``'s transaction, a few thousand per statement.

        ``queue.enqueue_many(session, (send_email.call(to=a) for a in addresses))``. All
        specs are validated before the first row is written. Returns ids in input order.
        """
        return self.enqueue_specs(session, specs)

    def enqueue_specs(
        self, session: Bind, specs: Iterable[JobSpec]
    ) -> list[int] | Coroutine[Any, Any, list[int]]:
        """Shared path of every enqueue call: validate, serialize, write (see enqueue_many)."""
        specs = specs if isinstance(specs, Sequence) else list(specs)
        chunks = prepare_rows(specs, self._defaults_for)
        keyed = any(spec.options.queue_id is not None for spec in specs)
        statement = self._enqueue_statements[keyed]
        return scalars_each(session, statement, [{"rows": c} for c in chunks])

    def enqueue_spec(self, session: Bind, spec: JobSpec) -> int | Coroutine[Any, Any, int]:
        """Enqueue one call; the id, or a coroutine of it for async sessions."""
        return self._enqueue_call(session, spec.task, spec.args, spec.kwargs, spec.options)

    def _enqueue_call(
        self,
        session: Bind,
        task: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        options: EnqueueOptions,
    ) -> int | Coroutine[Any, Any, int]:
        """One job, as ``enqueue_specs`` would write it, on the single-job fast path.

        Same checks in the same order (task name, then the arguments' JSON), same row, same
        statement; only the statement's execution skips SQLAlchemy's compile-cache lookup
        where the driver allows (see :class:`~sqla_queue.enqueue.DriverStatement`).
        """
        rows = encode_one(task, args, kwargs, options, self._checked_defaults(task))
        keyed = options.queue_id is not None
        if isinstance(session, AsyncSession | AsyncConnection):
            return self._execute_enqueue_async(session, rows, keyed)
        connection = session.connection() if isinstance(session, Session) else session
        return int(self._execute_enqueue(connection, rows, keyed).scalar_one())

    # -- operations ------------------------------------------------------------------------

    def create_all(self, connection: Connection) -> None:
        """Create the queue's tables (and schema) on ``connection``, without Alembic.

        Produces exactly the schema the migration operations produce. Other tables of the
        metadata are left alone.
        """
        from sqla_queue.schema.ddl import create_queue_schema

        create_queue_schema(connection, self.tables)

    def verify(self, connection: Connection) -> None:
        """Check in one catalog query that every object this version needs exists.

        Raises :class:`~sqla_queue.SchemaMismatchError` naming each missing object, the
        database's schema version, the library's, and the command that fixes it.
        """
        from sqla_queue.schema.verify import verify_schema

        verify_schema(connection, self.tables)

    @overload
    def requeue(self, session: Session | Connection, job_ids: Iterable[int]) -> list[int]: ...

    @overload
    def requeue(
        self, session: AsyncSession | AsyncConnection, job_ids: Iterable[int]
    ) -> Coroutine[Any, Any, list[int]]: ...

    def requeue(
        self, session: Bind, job_ids: Iterable[int]
    ) -> list[int] | Coroutine[Any, Any, list[int]]:
        """Put failed or cancelled jobs back in the queue; returns the ids requeued.

        Attempts start over; the error history is kept. Jobs in any other state are left
        alone. Runs in ``session``'s transaction: commit it for the jobs to run.
        """
        ids = [int(i) for i in job_ids]
        return scalars_each(session, statements.requeue_statement(self.tables), [{"ids": ids}])

    @overload
    def prune(
        self,
        session: Session | Connection,
        *,
        older_than: dt.timedelta,
        include_failed: bool = False,
    ) -> int: ...

    @overload
    def prune(
        self,
        session: AsyncSession | AsyncConnection,
        *,
        older_than: dt.timedelta,
        include_failed: bool = False,
    ) -> Coroutine[Any, Any, int]: ...

    def prune(
        self, session: Bind, *, older_than: dt.timedelta, include_failed: bool = False
    ) -> int | Coroutine[Any, Any, int]:
        """Delete finished jobs older than ``older_than``; returns how many went.

        Succeeded and cancelled jobs are deleted; failed ones only with
        ``include_failed=True``, since they wait for inspection and requeue.
        """
        params = {"older_than": older_than.total_seconds(), "include_failed": include_failed}
        ids = scalars_each(session, statements.prune_statement(self.tables), [params])
        if isinstance(ids, list):
            return len(ids)
        return _count(ids)

    def set_limit(self, session: Session | Connection, task: str, limit: int | None) -> None:
        """Store the concurrency limit of ``task``, for every worker, without a restart.

        The stored value wins over the one declared with ``@queue.task(concurrency_limit=)``;
        ``None`` removes it, so the declared value (or no limit) applies again. Runs in
        ``session``'s transaction. A changed value applies at the next claim; a limit on a
        task that had none reaches running workers within their maintenance interval (5 s
        by default).
        """
        validate_task_name(task)
        _check_limit(limit, allow_none=True)
        connection = session.connection() if isinstance(session, Session) else session
        if limit is None:
            connection.execute(statements.delete_limit_statement(self.tables), {"task": task})
        else:
            connection.execute(
                statements.set_limit_statement(self.tables),
                {"task": task, "concurrency_limit": limit},
            )

    def limits(self, session: Session | Connection) -> dict[str, TaskLimit]:
        """Every limit that applies: declared in code, stored in the database, or both."""
        connection = session.connection() if isinstance(session, Session) else session
        stored = dict(
            connection.execute(
                select(self.tables.limits.c.task, self.tables.limits.c.concurrency_limit)
            ).all()
        )
        declared = {
            name: t.task_options.concurrency_limit
            for name, t in self._tasks.items()
            if t.task_options.concurrency_limit is not None
        }
        return {
            name: TaskLimit(name, declared.get(name), stored.get(name))
            for name in sorted(set(stored) | set(declared))
        }

    def worker(self, session_factory: sessionmaker[Session], **settings: Any) -> Worker:
        """A worker that runs handlers in threads, from the app's own ``sessionmaker``.

        See :class:`~sqla_queue.WorkerSettings` for the settings (``concurrency``,
        ``batch_size``, ``tasks``, ``poll_interval``, ``shutdown_timeout``, ...).
        """
        from sqla_queue.worker.settings import WorkerSettings
        from sqla_queue.worker.sync import Worker

        return Worker(self, session_factory, WorkerSettings(**settings))

    def async_worker(
        self, session_factory: async_sessionmaker[AsyncSession], **settings: Any
    ) -> AsyncWorker:
        """An asyncio worker from the app's ``async_sessionmaker``; ``await worker.run()``."""
        from sqla_queue.worker.aio import AsyncWorker
        from sqla_queue.worker.settings import WorkerSettings

        return AsyncWorker(self, session_factory, WorkerSettings(**settings))


def _check_limit(limit: int | None, *, allow_none: bool) -> None:
    if limit is None and allow_none:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"a concurrency limit must be a whole number >= 1, got {limit!r}")


async def _count(ids: Coroutine[Any, Any, list[int]]) -> int:
    return len(await ids)
