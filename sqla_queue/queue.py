"""The Queue: tables in the host's metadata, a task registry, enqueue and workers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar, Unpack, overload

from sqlalchemy import MetaData, Select
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.orm import registry as Registry

from sqla_queue import admin
from sqla_queue._identifiers import validate_task_name
from sqla_queue.controls import (
    RateLimit,
    TaskControl,
    check_rate_limit,
    set_paused,
    set_rate_limit,
    stored_controls,
)
from sqla_queue.enqueue import Enqueuer, KnownTasks, TaskDefaults
from sqla_queue.errors import TaskAlreadyRegisteredError, UnknownTaskError
from sqla_queue.logic.backoff import RetryPolicy
from sqla_queue.models import DEFAULT_PREFIX, Job, JobExecution, build_tables, map_classes
from sqla_queue.models.tables import HistoryLayout
from sqla_queue.spec import (
    OPTION_NAMES,
    EnqueueKwargs,
    JobSpec,
    check_keywords,
    make_enqueue_options,
)
from sqla_queue.task import Task, TaskKwargs, TaskOptions, check_settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import async_sessionmaker
    from sqlalchemy.orm import sessionmaker

    from sqla_queue.daemons import DaemonBackoff, DaemonSpec, DaemonStatus
    from sqla_queue.periodic import Schedule, ScheduleState
    from sqla_queue.status import QueueStatus
    from sqla_queue.worker.aio import AsyncWorker
    from sqla_queue.worker.context import JobContext
    from sqla_queue.worker.plan import WorkerPlan
    from sqla_queue.worker.sync import Worker

__all__ = ["Queue", "TaskLimit"]

P = ParamSpec("P")
R = TypeVar("R")
#: A daemon's function, returned unchanged by ``@queue.daemon``.
DaemonFn = TypeVar("DaemonFn", bound=Callable[..., Any])
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


async def _jobs_of(report: Coroutine[Any, Any, Any]) -> int:
    return int((await report).jobs)


class Queue:
    """A job queue whose tables live in your application's own metadata.

    ``queue = Queue(Base)`` attaches the queue's models to a declarative ``Base`` (they
    appear in ``Base.metadata``, so Alembic sees them); ``Queue(metadata=md)`` does the same
    for a Core-only application.

    Args:
        base: the host's declarative base class.
        metadata: a ``MetaData``, for hosts without a declarative base.
        schema: PostgreSQL schema of the queue's tables (default: the metadata's own
            ``schema``, else the search path; giving one that differs from the metadata's
            raises :class:`~sqla_queue.InvalidIdentifierError`).
        prefix: table-name prefix (default ``sqla_queue_``).
        notify: send one NOTIFY per committing transaction that enqueued work, so idle
            workers wake at once. Polling remains the fallback either way.
        lost_interval: seconds without a heartbeat after which a running job is lost and
            returned to pending. Tasks may override it.
        max_reclaims: how often a job may be lost before it is failed instead of rerun.
        max_attempts: default attempts per job (1: a failure is final).
        retry: default backoff between attempts.
        history: where finished jobs are kept: ``"plain"`` (the default: one jobs table,
            pruned by ``DELETE``) or ``"partitioned"`` (time partitions, created ahead by the
            workers and pruned by dropping them; see :mod:`sqla_queue.history`). It must
            match the database: ``op.create_queue(..., history="partitioned")`` or
            ``op.partition_history(...)``.
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
        # The queue's defaults follow the rules of the task settings they stand for.
        defaults = check_settings(
            {
                "lost_interval": lost_interval,
                "max_reclaims": max_reclaims,
                "max_attempts": max_attempts,
                "retry": retry,
            }
        )
        for name in ("lost_interval", "max_reclaims", "max_attempts"):
            if defaults[name] is None:
                raise TypeError(f"Queue({name}=None): give a value, or leave it out")
        if not isinstance(notify, bool):
            raise TypeError(f"notify must be True or False, got {notify!r}")
        self.metadata: MetaData = metadata
        self.tables = build_tables(metadata, schema=schema, prefix=prefix, history=history)
        self.Job: type[Job]
        self.JobExecution: type[JobExecution]
        self.Job, self.JobExecution = map_classes(reg, self.tables)
        self.notify = notify
        self.lost_interval: float = defaults["lost_interval"]
        self.max_reclaims: int = defaults["max_reclaims"]
        self.max_attempts: int = defaults["max_attempts"]
        self.retry: RetryPolicy = defaults["retry"] or RetryPolicy()
        self._tasks: dict[str, Task[Any, Any]] = {}
        # The names enqueue accepts (registered or declared) and their rows' defaults.
        self._known = KnownTasks()
        # Writes every enqueue of this queue; each Task holds it, never the Queue.
        self._enqueuer = Enqueuer(self.tables, notify=notify, defaults=self._known.lookup)
        # Periodic schedules and daemons by name (sqla_queue.periodic, sqla_queue.daemons):
        # every worker of this queue carries them in its plan.
        self._schedules: dict[str, Any] = {}
        self._daemons: dict[str, Any] = {}

    def __repr__(self) -> str:
        where = f"{self.tables.schema}." if self.tables.schema else ""
        return f"<Queue {where}{self.tables.prefix}* tasks={sorted(self._tasks)}>"

    # -- tasks -----------------------------------------------------------------------------

    # The registration keywords are spelled once, in TaskKwargs; only pass_context is
    # spelled out, because its Literal type selects the overload.
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
        self,
        fn: None = None,
        /,
        *,
        pass_context: Literal[True],
        **options: Unpack[TaskKwargs],
    ) -> Callable[[Callable[Concatenate[JobContext[Any], P], R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        pass_context: bool = False,
        **options: Unpack[TaskKwargs],
    ) -> Any:
        """Register a ``def`` or ``async def`` handler as a task.

        Use bare (``@queue.task``) or with options (``@queue.task(max_attempts=5)``). The
        name defaults to ``module.qualname`` of the function; give ``name=`` to keep it
        stable across refactors, since stored jobs refer to it. With ``pass_context=True``
        the handler receives a :class:`~sqla_queue.JobContext` as its first argument.
        ``concurrency_limit=N`` caps the executions running at once across all workers
        (see :meth:`set_limit` to change it at runtime). ``max_pending=N`` caps the jobs
        waiting to run: an enqueue past it raises :class:`~sqla_queue.QueueFull`, or waits
        for room with ``wait_if_full=seconds``.

        Args:
            fn: the handler, when used bare.
            pass_context: pass a :class:`~sqla_queue.JobContext` as the first argument.
            **options: the keywords of :class:`~sqla_queue.task.TaskKwargs`: ``name``,
                ``priority`` (default 0), and ``max_attempts``, ``retry``,
                ``lost_interval``, ``max_reclaims`` (the queue's when not given),
                ``concurrency_limit`` and ``max_pending`` (none by default).
        """
        check_keywords("Queue.task", options, TaskKwargs.__annotations__)
        # Every value is checked here, when the decorator is built, so a bad one fails at
        # the decorator's line, not at the first enqueue or in a worker.
        settings = check_settings(dict(options))
        name = settings.get("name")
        if name is not None:
            validate_task_name(name)
        if not isinstance(pass_context, bool):
            raise TypeError(f"pass_context must be True or False, got {pass_context!r}")
        # The rule of a stored limit (queue.set_limit) holds for a declared one too.
        concurrency_limit = admin.check_limit(settings.get("concurrency_limit"))
        priority = settings.get("priority")
        max_attempts = settings.get("max_attempts")
        retry = settings.get("retry")
        lost_interval = settings.get("lost_interval")
        max_reclaims = settings.get("max_reclaims")
        transactional = bool(settings.get("transactional"))
        max_pending = settings.get("max_pending")
        if transactional and not pass_context:
            raise ValueError(
                "transactional=True runs the handler in ctx.session's transaction: register "
                "it with pass_context=True and write through ctx.session"
            )

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            # An empty name is refused above, never replaced by the function's.
            task_name = validate_task_name(
                f"{func.__module__}.{func.__qualname__}" if name is None else name
            )
            if task_name in self._tasks:
                raise TaskAlreadyRegisteredError(
                    f"task {task_name!r} is already registered to "
                    f"{self._tasks[task_name].fn!r}; give one of them another name="
                )
            if task_name in self._daemons:
                raise TaskAlreadyRegisteredError(
                    f"{task_name!r} is already the name of a daemon; give the task another name="
                )
            # Every default is resolved here, once: workers read the task's own values.
            task_options = TaskOptions(
                name=task_name,
                priority=0 if priority is None else priority,
                max_attempts=self.max_attempts if max_attempts is None else max_attempts,
                retry=self.retry if retry is None else retry,
                lost_interval=self.lost_interval if lost_interval is None else lost_interval,
                max_reclaims=self.max_reclaims if max_reclaims is None else max_reclaims,
                pass_context=pass_context,
                concurrency_limit=concurrency_limit,
                transactional=transactional,
                max_pending=max_pending,
            )
            handle: Task[Any, Any] = Task(self._enqueuer, func, task_options)
            self._tasks[task_name] = handle
            self._known.register(
                task_name,
                TaskDefaults(
                    task_options.priority, task_options.max_attempts, task_options.max_pending
                ),
            )
            return handle

        if fn is not None:
            return register(fn)
        return register

    def declare_task(
        self,
        name: str,
        *,
        priority: int = 0,
        max_attempts: int | None = None,
        max_pending: int | None = None,
    ) -> None:
        """Let this process enqueue ``name`` by name without importing its handler.

        Producers that live apart from the workers declare the names they send, so a typo
        still fails at enqueue time instead of leaving a job no worker will ever claim.
        ``priority``, ``max_attempts`` and ``max_pending`` follow the rules of
        ``@queue.task``'s. The bound is enforced by the enqueuers that know it: give every
        process that enqueues the task the same ``max_pending``.
        """
        validate_task_name(name)
        settings = check_settings(
            {"priority": priority, "max_attempts": max_attempts, "max_pending": max_pending}
        )
        if settings["priority"] is None:
            raise TypeError("declare_task(priority=None): give a whole number, or leave it out")
        if settings["max_attempts"] is None:
            settings["max_attempts"] = self.max_attempts
        self._known.declare(
            name,
            TaskDefaults(settings["priority"], settings["max_attempts"], settings["max_pending"]),
        )

    # -- periodic schedules ------------------------------------------------------------------

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
        """Register a handler as a task and run it on a schedule: a decorator.

        ``@queue.periodic("*/5 * * * *", timezone="Europe/Riga")`` runs the function at
        every fifth minute of Riga's clock; ``@queue.periodic(every=timedelta(seconds=30))``
        every 30 seconds (at the multiples of the interval since the Unix epoch). Each tick
        is enqueued exactly once, whatever the number of workers: every worker runs a
        scheduler, and a compare-and-set on the schedule's row lets one of them enqueue it.
        See :class:`~sqla_queue.periodic.Schedule` for the rules of each option.

        Args:
            cron: a five-field cron expression, evaluated in ``timezone``.
            every: a fixed interval instead (a ``timedelta``, at least a second).
            name: the task's name, which is also the schedule's (default: the function's
                ``module.qualname``).
            timezone: an IANA zone name for ``cron`` (default ``"UTC"``).
            args: the positional arguments every tick's job gets (JSON-serializable).
            kwargs: the keyword arguments every tick's job gets (JSON-serializable).
            catch_up: what happens to ticks missed while no worker ran: ``"skip"``,
                ``"one"`` (default: the latest missed tick runs) or ``"all"``.
            catch_up_limit: with ``"all"``, at most this many missed ticks run (default 100).
            pass_context: pass a :class:`~sqla_queue.JobContext` first, as with ``task``.
            **options: the other keywords of ``@queue.task`` (``max_attempts``, ...).

        Raises ``TypeError``/``ValueError`` for a bad option (an invalid cron expression,
        an unknown time zone) and :class:`~sqla_queue.TaskAlreadyRegisteredError` for a
        schedule name already in use, all when the decorator is applied, before anything
        is registered.
        """
        from dataclasses import replace

        check_keywords(
            "Queue.periodic", options, [k for k in TaskKwargs.__annotations__ if k != "name"]
        )
        if name is not None:
            validate_task_name(name)
        make_task = self.task(name=name, pass_context=pass_context, **options)  # type: ignore[call-overload]

        def register(func: Callable[P, R]) -> Task[P, R]:
            task_name = (
                validate_task_name(f"{func.__module__}.{func.__qualname__}")
                if name is None
                else name
            )
            # Checked before the task is registered, so a bad schedule leaves nothing behind.
            schedule = self._new_schedule(
                task_name,
                cron,
                every=every,
                name=task_name,
                timezone=timezone,
                args=args,
                kwargs=kwargs,
                catch_up=catch_up,
                catch_up_limit=catch_up_limit,
            )
            handle: Task[P, R] = make_task(func)
            self._schedules[schedule.name] = replace(schedule, handle=handle)
            return handle

        return register

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
        """Run an existing task on a schedule; returns the :class:`~sqla_queue.periodic.Schedule`.

        ``queue.schedule(send_report, "0 6 * * MON", timezone="Europe/Riga",
        kwargs={"kind": "weekly"})``. ``task`` is a registered task's handle or its name; a
        handle with per-call options (``send_report.options(priority=5)``) gives them to
        every tick's job. ``name`` is the schedule's (default: the task's name): give one
        to schedule a task more than once. The other options are those of :meth:`periodic`.
        A schedule name already in use raises
        :class:`~sqla_queue.TaskAlreadyRegisteredError`.
        """
        from dataclasses import replace

        handle = self.get_task(task) if isinstance(task, str) else task
        if not isinstance(handle, Task) or self._tasks.get(handle.name) is None:
            raise TypeError(
                f"queue.schedule() needs a task registered on this queue (its handle or its "
                f"name), got {task!r}"
            )
        schedule = self._new_schedule(
            handle.name,
            cron,
            every=every,
            name=handle.name if name is None else name,
            timezone=timezone,
            args=args,
            kwargs=kwargs,
            catch_up=catch_up,
            catch_up_limit=catch_up_limit,
        )
        schedule = replace(schedule, handle=handle)
        self._schedules[schedule.name] = schedule
        return schedule

    def _new_schedule(
        self,
        task: str,
        cron: str | None,
        *,
        every: dt.timedelta | None,
        name: str,
        timezone: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
        catch_up: str,
        catch_up_limit: int | None,
    ) -> Schedule:
        """A checked :class:`~sqla_queue.periodic.Schedule` (no handle yet) with a free name."""
        from sqla_queue.periodic import DEFAULT_CATCH_UP_LIMIT, Schedule

        if name in self._schedules:
            raise TaskAlreadyRegisteredError(
                f"a schedule named {name!r} is already registered (for task "
                f"{self._schedules[name].task!r}); give this one another name="
            )
        return Schedule(
            name=name,
            task=task,
            cron=cron,
            every=every,
            timezone=timezone,
            args=tuple(args) if isinstance(args, list | tuple) else args,  # type: ignore[arg-type]
            kwargs={} if kwargs is None else kwargs,
            catch_up=catch_up,
            catch_up_limit=DEFAULT_CATCH_UP_LIMIT if catch_up_limit is None else catch_up_limit,
        )

    def schedules(self, session: Session | Connection) -> list[ScheduleState]:
        """Every schedule with its last tick (from the database) and its next one, by name.

        The registered schedules come first; a row stored by a schedule this code no
        longer registers follows, with ``registered=False`` (its row stays until deleted
        by hand; a schedule registered again under its name goes on from its last tick).
        A schedule no worker has run yet has ``last_tick=None`` and its next tick after now.
        Reads on ``session``'s transaction; writes nothing.
        """
        from sqla_queue.periodic import ScheduleState, next_tick
        from sqla_queue.statements.periodic import (
            all_schedules_statement,
            database_now_statement,
        )

        now = session.execute(database_now_statement()).scalar_one()
        stored = {
            row_name: (row_task, last)
            for row_name, row_task, last in session.execute(all_schedules_statement(self.tables))
        }
        states: list[ScheduleState] = []
        for schedule_name in sorted(self._schedules):
            entry = self._schedules[schedule_name]
            last = stored[schedule_name][1] if schedule_name in stored else None
            states.append(
                ScheduleState(
                    name=schedule_name,
                    task=entry.task,
                    schedule=entry.describe,
                    catch_up=entry.catch_up,
                    last_tick=last,
                    next_tick=next_tick(entry, last if last is not None else now),
                )
            )
        for row_name, (row_task, last) in stored.items():
            if row_name not in self._schedules:
                states.append(
                    ScheduleState(
                        name=row_name,
                        task=row_task,
                        schedule="-",
                        catch_up="-",
                        last_tick=last,
                        next_tick=None,
                        registered=False,
                    )
                )
        return states

    @property
    def tasks(self) -> Mapping[str, Task[Any, Any]]:
        """The registered tasks, by name."""
        return dict(self._tasks)

    def get_task(self, name: str) -> Task[Any, Any]:
        """The registered task called ``name``, or :class:`UnknownTaskError`."""
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTaskError(self._known.unknown_message(name)) from None

    def _defaults_for(self, name: str) -> TaskDefaults:
        """The row defaults of task ``name``; the name's one check (see ``KnownTasks``)."""
        return self._known.lookup(name)

    # -- daemons ---------------------------------------------------------------------------

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
    ) -> Any:
        """Register a long-running ``def`` or ``async def`` loop that workers keep alive.

        The function takes one :class:`~sqla_queue.daemons.DaemonContext` and runs until
        ``ctx.shutdown_requested``. Every worker of the queue supervises it; the database
        lets exactly ``instances`` copies run at once across all of them. A daemon runs
        outside the worker's ``concurrency`` (a thread or an event loop of its own). If its
        worker dies, another worker starts it once ``lost_interval`` (the queue's by
        default) has passed; if it raises, it restarts after ``backoff`` (1 s, doubling,
        at most 60 s); if it returns, it restarts after ``backoff.min_delay``. The function
        is returned unchanged.

        Args:
            fn: the function, when used bare (``@queue.daemon``).
            name: the daemon's name, stored in the ``daemons`` table (default:
                ``module.qualname``); unique among the queue's daemons and tasks.
            instances: copies to run at once across all workers, 1 to 1000.
            lost_interval: seconds after its worker stops renewing an instance before
                another worker may start it (at least 1).
            backoff: the restart policy after a crash.
        """
        from sqla_queue.daemons import DaemonBackoff as Backoff
        from sqla_queue.daemons import DaemonSpec

        if name is not None:
            validate_task_name(name)
        policy = Backoff() if backoff is None else backoff

        def register(func: DaemonFn) -> DaemonFn:
            daemon_name = f"{func.__module__}.{func.__qualname__}" if name is None else name
            spec = DaemonSpec(
                name=daemon_name,
                function=func,
                instances=instances,
                lost_interval=lost_interval,
                backoff=policy,
            )
            if daemon_name in self._daemons:
                raise TaskAlreadyRegisteredError(
                    f"daemon {daemon_name!r} is already registered to "
                    f"{self._daemons[daemon_name].function!r}; give one of them another name="
                )
            if daemon_name in self._tasks:
                raise TaskAlreadyRegisteredError(
                    f"{daemon_name!r} is already the name of a task; give the daemon another name="
                )
            self._daemons[daemon_name] = spec
            return func

        if fn is not None:
            return register(fn)
        return register

    @property
    def daemons(self) -> Mapping[str, DaemonSpec]:
        """The registered daemons, by name."""
        return dict(self._daemons)

    def daemon_status(self, session: Session | Connection) -> list[DaemonStatus]:
        """Every daemon instance the database knows: its worker, lease, restarts, error.

        One row per (name, instance), created by the first worker that supervises the
        daemon; ``running`` says whether a worker holds it under an unexpired lease now.
        """
        from sqla_queue.daemons import DaemonStatus as Status
        from sqla_queue.statements.daemons import daemon_status_statement

        rows = session.execute(daemon_status_statement(self.tables)).all()
        return [
            Status(
                name=row.name,
                instance=row.instance,
                worker_id=row.worker_id,
                lease_until=row.lease_until,
                started_at=row.started_at,
                restarts=row.restarts,
                last_error=row.last_error,
                running=bool(row.running),
            )
            for row in rows
        ]

    # -- enqueue ---------------------------------------------------------------------------

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
        """Enqueue task ``task`` by name, with keyword arguments ``kwargs``.

        For producers that do not import the handler (see :meth:`declare_task`). The
        per-call options (those of :class:`~sqla_queue.spec.EnqueueKwargs`: ``run_at``,
        ``delay``, ``priority``, ``queue_id``, ``max_attempts``, ``unique_key``,
        ``unique_scope``, ``on_duplicate`` and ``about``) are keyword-only and separate
        from the task's own arguments. Returns the job id (or a coroutine of it for async
        sessions); with a ``unique_key`` that another job holds, that job's id (or
        :class:`~sqla_queue.DuplicateJobError` with ``on_duplicate="raise"``).
        """
        check_keywords("Queue.enqueue", options, OPTION_NAMES)
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(
                f"kwargs must be a mapping of the task's keyword arguments, got {kwargs!r}"
            )
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise TypeError(
                f"args must be a list or tuple of the task's positional arguments, got {args!r}"
            )
        spec = JobSpec(task, tuple(args), dict(kwargs or {}), make_enqueue_options(**options))
        return self._enqueuer.enqueue_spec(session, spec)

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
        specs are validated before the first row is written, and the batch is written in
        one transaction (its own on an AUTOCOMMIT connection): all of it or nothing.
        Returns ids in input order.
        """
        return self._enqueuer.enqueue_specs(session, specs)

    def enqueue_specs(
        self, session: Bind, specs: Iterable[JobSpec]
    ) -> list[int] | Coroutine[Any, Any, list[int]]:
        """Shared path of every bulk enqueue: validate, serialize, write (see enqueue_many)."""
        return self._enqueuer.enqueue_specs(session, specs)

    def enqueue_spec(self, session: Bind, spec: JobSpec) -> int | Coroutine[Any, Any, int]:
        """Enqueue one call; the id, or a coroutine of it for async sessions."""
        return self._enqueuer.enqueue_spec(session, spec)

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
        database's schema version, the library's, and the command that fixes it. The same
        query reads the connected role's privileges: without one that workers and producers
        need (``USAGE`` on the schema, ``SELECT``, ``INSERT``, ``UPDATE``, ``DELETE`` on the
        jobs, executions and unique keys tables, ``SELECT`` on the limits table), it raises
        :class:`~sqla_queue.InsufficientPrivilegeError` naming each one and the ``GRANT``
        that fixes it.
        """
        from sqla_queue.schema.verify import verify_schema

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
        """Put failed or cancelled jobs back in the queue; returns the ids requeued.

        Attempts start over; the error history is kept. Jobs in any other state are left
        alone. Runs in ``session``'s transaction: commit it for the jobs to run. An id that
        is not a whole number, or is beyond ``bigint``, raises before anything is executed.

        A unique job takes its key again, as an enqueue would; while another job holds
        it, the job is left as it is. A keyed job (``queue_id``) goes back in line behind
        its key's queued jobs. The answer is a :class:`~sqla_queue.admin.RequeueReport`:
        the list of ids requeued, whose ``refused`` attribute names each job left alone
        for its unique key, with the reason (``held_by``: the job holding the key).
        """
        return admin.requeue(session, self.tables, job_ids)

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
        ``include_failed=True``, since they wait for inspection and requeue. A negative
        ``older_than`` raises :class:`ValueError` (it would delete every finished job).

        On a queue with partitioned history (``Queue(history="partitioned")``) whole
        partitions are dropped instead (:func:`sqla_queue.history.prune_history`): a job
        may then outlive ``older_than`` by up to one partition interval.
        """
        if self.tables.history == HistoryLayout.PARTITIONED:
            from sqla_queue.history import prune_history

            report = prune_history(
                session, self.tables, older_than=older_than, include_failed=include_failed
            )
            if isinstance(report, Coroutine):
                return _jobs_of(report)
            return report.jobs
        return admin.prune(
            session, self.tables, older_than=older_than, include_failed=include_failed
        )

    def maintain_history(self, session: Bind, *, ahead: int = 3, backfill: bool = False) -> Any:
        """Create the partitions of finished jobs ahead of time (partitioned history only).

        Workers do this in the background; ``sqla-queue maintain`` does it from cron or a
        deploy step. Returns a :class:`~sqla_queue.history.MaintainReport` (a coroutine of
        it for async sessions). See :func:`sqla_queue.history.maintain_history`.
        """
        from sqla_queue.history import maintain_history

        return maintain_history(session, self.tables, ahead=ahead, backfill=backfill)

    def history_partitions(self, session: Bind) -> Any:
        """The partitions of finished jobs, oldest first (partitioned history only): a list
        of :class:`~sqla_queue.history.HistoryPartition` (a coroutine of it for async
        sessions)."""
        from sqla_queue.history import history_partitions

        return history_partitions(session, self.tables)

    # -- lifecycle ---------------------------------------------------------------------------

    def cancel(self, source: Any, job_ids: Iterable[int]) -> Any:
        """Cancel jobs: a queued one never starts, a running one is asked to stop.

        Returns, per id, a :class:`~sqla_queue.CancelOutcome` value: ``"cancelled"`` (it
        was queued; it is now ``cancelled``), ``"requested"`` (it is running; its worker
        learns it within a heartbeat interval, and the job ends ``cancelled`` when its
        handler returns or raises after that; a handler that succeeds before it learns of
        the request ends ``succeeded``), ``"finished"`` (it had already ended; nothing
        changed) or ``"not_found"``.

        ``source`` is what a connection can be opened from, as for :meth:`result`: an
        ``Engine``, ``Session``, ``Connection`` or ``sessionmaker`` (a dict is returned), or
        an async twin (a coroutine of it). The cancel commits at once, in a short
        transaction of its own, not in the caller's, on a connection that carries the
        caller's execution options (a ``schema_translate_map`` cancels in the tenant it
        chooses): it locks the executions it changes, and a worker must never wait on an
        application's open transaction. A job enqueued in a transaction that has not
        committed yet is ``"not_found"``. It waits for a
        transaction that holds those jobs' rows (a claim, a completion), at most 10 seconds:
        called from one of your own that has locked or updated them, it would wait for
        itself, and raises :class:`~sqla_queue.CancelBlockedError` instead, having changed
        nothing. A cancelled job can be run again with :meth:`requeue`.
        """
        from sqla_queue.lifecycle import cancel

        return cancel(source, self.tables, job_ids)

    def result(
        self, source: Any, job_id: int, *, timeout: float | dt.timedelta | None = 30.0
    ) -> Any:
        """Wait for job ``job_id`` to finish and return its handler's return value.

        ``source`` is what a connection can be opened from: an ``Engine``, a ``Session``
        or ``Connection`` (a new connection of their engine is used, not their
        transaction, which would never see the job finish; it carries their execution
        options, so a ``schema_translate_map`` reads the tenant it chooses), a
        ``sessionmaker``, or the async twin of any of these, for which this returns a
        coroutine. The wait LISTENs for the job's completion (and polls every few seconds
        besides); it never spins.

        Raises :class:`~sqla_queue.JobFailedError` (with the job's last error) if the job
        failed, :class:`~sqla_queue.JobCancelledError` if it was cancelled,
        :class:`~sqla_queue.JobNotFoundError` for an unknown id, and
        :class:`~sqla_queue.ResultTimeoutError` (a ``TimeoutError``) if it is still
        queued or running after ``timeout`` seconds (``None``: no limit).
        """
        from sqla_queue.lifecycle import check_timeout, wait_for

        (checked,) = admin.check_job_ids([job_id])
        return wait_for(source, self.tables, checked, check_timeout(timeout))

    def jobs_about(self, about: object) -> Select[Any]:
        """``select(queue.Job)`` of the jobs linked to ``about`` (``task.options(about=)``).

        ``about`` is a mapped instance, a ``(mapped class, primary key)`` pair, or a
        mapped class alone (every job about any of its rows). Add filters and order as
        with any select: ``session.scalars(queue.jobs_about(order).where(...))``.
        """
        from sqlalchemy import select

        from sqla_queue.links import about_condition

        return select(self.Job).where(about_condition(self.Job, about))

    def about_relationship(self, mapped: type, **kwargs: Any) -> Any:
        """A read-only ``relationship()`` from the app's class ``mapped`` to its jobs.

        ``Order.jobs = queue.about_relationship(Order, order_by=queue.Job.id)`` after the
        class is declared; then ``order.jobs`` lists the jobs enqueued with
        ``about=order``. Needs a single-column primary key. See
        :func:`sqla_queue.links.about_relationship`.
        """
        from sqla_queue.links import about_relationship

        return about_relationship(self.Job, mapped, **kwargs)

    def set_limit(self, session: Session | Connection, task: str, limit: int | None) -> None:
        """Store the concurrency limit of ``task``, for every worker, without a restart.

        The stored value wins over the one declared with ``@queue.task(concurrency_limit=)``;
        ``None`` removes it, so the declared value (or no limit) applies again. Runs in
        ``session``'s transaction. A changed value applies at the next claim; a limit on a
        task that had none reaches running workers within their maintenance interval (5 s
        by default).

        ``limit`` is a whole number from 1 to 2,147,483,647, else :class:`ValueError`. A
        limit is stored only for a task registered or declared (:meth:`declare_task`) on
        this queue, else :class:`~sqla_queue.UnknownTaskError` lists the known ones: a typo
        would store a limit that no worker reads. Removing one (``None``) also takes a task
        that is gone but still has a stored limit, so that it can be cleared; any other
        name raises, and nothing is written.
        """
        admin.check_limit(limit)
        if limit is None:
            self._known_for(
                "remove a concurrency limit",
                task,
                stored=lambda: admin.stored_limits(session, self.tables),
            )
        else:
            self._known_for("store a concurrency limit", task)
        admin.set_limit(session, self.tables, task, limit)

    def limits(self, session: Session | Connection) -> dict[str, TaskLimit]:
        """Every limit that applies: declared in code, stored in the database, or both."""
        stored = admin.stored_limits(session, self.tables)
        declared = self.worker_plan().declared_limits if self._tasks else {}
        return {
            name: TaskLimit(name, declared.get(name), stored.get(name))
            for name in sorted(set(stored) | set(declared))
        }

    def pause(self, session: Session | Connection, task: str) -> None:
        """Pause ``task`` for every worker: none claims it within its maintenance interval
        (5 s by default); running jobs finish; enqueues go on and wait for :meth:`resume`.

        Runs in ``session``'s transaction. ``task`` must be registered or declared on this
        queue (:class:`~sqla_queue.UnknownTaskError` otherwise). Costs nothing to the tasks
        that are not paused: their claim does not change.
        """
        self._known_for("pause", task)
        set_paused(session, self.tables, task, True)

    def resume(self, session: Session | Connection, task: str) -> None:
        """Undo :meth:`pause`: workers claim ``task`` again within their maintenance
        interval. Runs in ``session``'s transaction.

        ``task`` is registered or declared on this queue, or a task that is gone but is
        still stored as paused (so that it can be cleared); any other name raises
        :class:`~sqla_queue.UnknownTaskError`, as :meth:`pause` does, and writes nothing.
        """
        self._known_for(
            "resume",
            task,
            stored=lambda: [c.task for c in stored_controls(session, self.tables) if c.paused],
        )
        set_paused(session, self.tables, task, False)

    def set_rate_limit(
        self,
        session: Session | Connection,
        task: str,
        max_starts: int | None,
        per: float | dt.timedelta = 1.0,
    ) -> None:
        """Let ``task`` start at most ``max_starts`` times in any window of ``per`` seconds
        (or a ``timedelta``), across every worker; ``None`` removes the limit.

        Exact: each start is recorded by the database clock under the task's control row,
        so no window of ``per`` seconds ever holds more starts, whatever the number of
        workers. It combines with a concurrency limit. Runs in ``session``'s transaction; a
        new or removed limit reaches running workers within their maintenance interval (5 s
        by default), a changed one applies at the next claim.

        ``task`` is registered or declared on this queue, else
        :class:`~sqla_queue.UnknownTaskError`, and nothing is written. Removing a limit
        (``None``) also takes a task that is gone but still has a stored rate limit.
        """
        if max_starts is None:
            self._known_for(
                "remove a rate limit",
                task,
                stored=lambda: [
                    c.task
                    for c in stored_controls(session, self.tables)
                    if c.rate_limit is not None
                ],
            )
            set_rate_limit(session, self.tables, task, None)
            return
        checked = RateLimit(*check_rate_limit(max_starts, per))
        self._known_for("store a rate limit", task)
        set_rate_limit(session, self.tables, task, checked)

    def controls(self, session: Session | Connection) -> dict[str, TaskControl]:
        """Every task that is paused or rate-limited, by name (see :meth:`pause`,
        :meth:`set_rate_limit`)."""
        return {control.task: control for control in stored_controls(session, self.tables)}

    def status(self, session: Session | Connection, *, scan_cap: int | None = None) -> QueueStatus:
        """What the queue is doing now: per task counts, limits, pauses and throughput,
        and the live workers (see :mod:`sqla_queue.status`). Reads only, in ``session``'s
        transaction: use a fresh one, whose ``now()`` every time window is measured from.

        ``scan_cap`` bounds each walk over the history (default
        :data:`sqla_queue.status.DEFAULT_SCAN_CAP`); a window that holds more is reported
        as a lower bound (``capped``). A dashboard polling often passes a smaller one."""
        from sqla_queue.status import DEFAULT_SCAN_CAP, read_status

        declared = self.worker_plan().declared_limits if self._tasks else {}
        return read_status(
            session,
            self.tables,
            tasks=self._known.names(),
            declared_limits=declared,
            scan_cap=DEFAULT_SCAN_CAP if scan_cap is None else scan_cap,
        )

    def dashboard(
        self, bind: Any, *, auth: Callable[[Any], Any] | None = None, **options: Any
    ) -> Any:
        """The web dashboard of this queue: an ASGI app to mount in your own.

        ``app.mount("/queue", queue.dashboard(engine, auth=is_admin))``. ``bind`` is an
        ``Engine``, ``sessionmaker``, ``AsyncEngine`` or ``async_sessionmaker``; without
        ``auth`` the dashboard is read-only. Needs the ``dashboard`` extra. See
        :func:`sqla_queue.dashboard.create_dashboard` for ``auth`` and the ``options``.
        """
        # Imported here: the core library never imports Starlette.
        from sqla_queue.dashboard import create_dashboard

        return create_dashboard(self, bind, auth=auth, **options)

    def _known_for(
        self, doing: str, task: str, *, stored: Callable[[], Iterable[str]] | None = None
    ) -> None:
        """Refuse ``task`` for an operator's write unless this queue registers or declares
        it: a typo would store a setting that no worker reads, and show a task that does
        not exist. Every such write checks here, before it writes anything.

        ``stored`` (given by an undo: resume, removing a limit) reads the tasks that have
        something stored to undo: one of them is accepted too, so that what a task that is
        gone left behind can be cleared. An invalid name raises
        :class:`~sqla_queue.InvalidIdentifierError` before anything is read.
        """
        try:
            self._defaults_for(task)
        except UnknownTaskError as exc:
            if stored is not None and task in stored():
                return
            nothing = "" if stored is None else "; nothing is stored for it to undo either"
            raise UnknownTaskError(f"cannot {doing}: {exc}{nothing}") from None

    def worker_plan(self, tasks: Sequence[str] | None = None) -> WorkerPlan:
        """What a worker serving ``tasks`` (default: every registered task) needs, resolved.

        The plan holds the tables, the notify flag, the queue-wide defaults, and per task a
        :class:`~sqla_queue.worker.plan.TaskRuntime` with its handler and settled defaults.
        Raises :class:`UnknownTaskError` for a name that is not registered, or when there
        is no task to serve.
        """
        from sqla_queue.worker.plan import TaskRuntime, WorkerPlan

        names = list(self._tasks) if tasks is None else list(tasks)
        if not names:
            raise UnknownTaskError("this worker has no tasks: register one with @queue.task")
        runtimes: dict[str, TaskRuntime] = {}
        for name in names:
            task = self.get_task(name)
            opts = task.task_options
            runtimes[name] = TaskRuntime(
                name=name,
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
        return WorkerPlan(
            tables=self.tables,
            notify=self.notify,
            default_lease=self.lost_interval,
            tasks=runtimes,
            schedules=tuple(self._schedules.values()),
            daemons=tuple(self._daemons.values()),
        )

    def worker(
        self,
        session_factory: sessionmaker[Session],
        *,
        read_session_factory: sessionmaker[Session] | None = None,
        **settings: Any,
    ) -> Worker:
        """A worker that runs handlers in threads, from the app's own ``sessionmaker``.

        See :class:`~sqla_queue.WorkerSettings` for the settings (``concurrency``,
        ``batch_size``, ``tasks``, ``poll_interval``, ``shutdown_timeout``,
        ``pool_size``, ...). ``read_session_factory``, a ``sessionmaker`` bound to a read
        replica, gives handlers ``ctx.read_session`` (see
        :attr:`~sqla_queue.worker.context.JobContext.read_session`); the worker itself
        never uses it.
        """
        from sqla_queue.worker.settings import WorkerSettings
        from sqla_queue.worker.sync import Worker

        worker_settings = WorkerSettings(**settings)
        plan = self.worker_plan(worker_settings.tasks)
        return Worker(plan, session_factory, worker_settings, read_session_factory)

    def async_worker(
        self,
        session_factory: async_sessionmaker[AsyncSession],
        *,
        read_session_factory: async_sessionmaker[AsyncSession] | None = None,
        **settings: Any,
    ) -> AsyncWorker:
        """An asyncio worker from the app's ``async_sessionmaker``; ``await worker.run()``.

        Takes the settings of :meth:`worker`; ``read_session_factory`` is an
        ``async_sessionmaker`` on a read replica, for handlers' ``ctx.read_session``.
        """
        from sqla_queue.worker.aio import AsyncWorker
        from sqla_queue.worker.settings import WorkerSettings

        worker_settings = WorkerSettings(**settings)
        plan = self.worker_plan(worker_settings.tasks)
        return AsyncWorker(plan, session_factory, worker_settings, read_session_factory)
