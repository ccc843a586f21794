"""The task registry: a queue's tasks, periodic schedules and daemons, and the names it knows.

:class:`TaskRegistry` holds what ``@queue.task``, ``queue.declare_task``,
``@queue.periodic``, ``queue.schedule`` and ``@queue.daemon`` register, each checked when
it is registered, so a bad option fails at the decorator's line rather than at the first
enqueue or in a worker. :class:`KnownTasks` is its lookup of the names enqueue accepts,
which the queue's :class:`~sqla_queue.enqueue.Enqueuer` calls on every enqueue. The
:class:`~sqla_queue.Queue` is a façade over it. Each option's rule is documented where it
is checked: :class:`~sqla_queue.task.TaskKwargs` (a task's),
:class:`~sqla_queue.periodic.Schedule` (a schedule's), :class:`~sqla_queue.daemons.DaemonSpec`
(a daemon's).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

from sqla_queue import admin
from sqla_queue._identifiers import validate_task_name
from sqla_queue.daemons import DaemonBackoff, DaemonSpec
from sqla_queue.enqueue import Enqueuer, TaskDefaults
from sqla_queue.errors import TaskAlreadyRegisteredError, UnknownTaskError
from sqla_queue.logic.backoff import RetryPolicy
from sqla_queue.models.tables import QueueTables
from sqla_queue.periodic import DEFAULT_CATCH_UP_LIMIT, Schedule
from sqla_queue.spec import check_keywords
from sqla_queue.task import Task, TaskKwargs, TaskOptions, check_settings
from sqla_queue.workflows.write import WorkflowWriter

__all__ = ["DaemonFn", "KnownTasks", "QueueDefaults", "TaskLimit", "TaskRegistry"]

#: A daemon's function, returned unchanged by ``@queue.daemon``.
DaemonFn = TypeVar("DaemonFn", bound=Callable[..., Any])


class KnownTasks:
    """The task names this process may enqueue, with the defaults of their rows.

    A name is known when a handler is registered under it, or when it is declared for
    producers that do not import the handler; a registered name's defaults win. Names are
    validated before they are added, so :meth:`lookup` proves a known name valid without
    matching it again.
    """

    __slots__ = ("_declared", "_registered")

    def __init__(self) -> None:
        self._registered: dict[str, TaskDefaults] = {}
        self._declared: dict[str, TaskDefaults] = {}

    def register(self, name: str, defaults: TaskDefaults) -> None:
        """Add the defaults of a registered handler (``name`` already validated)."""
        self._registered[name] = defaults

    def declare(self, name: str, defaults: TaskDefaults) -> None:
        """Add a name declared without its handler (``name`` already validated)."""
        self._declared[name] = defaults

    def names(self) -> list[str]:
        """Every known name, sorted."""
        return sorted(set(self._registered) | set(self._declared))

    def unknown_message(self, name: str) -> str:
        """The :class:`~sqla_queue.UnknownTaskError` message for ``name``."""
        known = self.names()
        return (
            f"unknown task {name!r}: it is neither registered with @queue.task nor declared "
            f"with queue.declare_task(); known tasks: {known or 'none'}"
        )

    def lookup(self, name: str) -> TaskDefaults:
        """The defaults of task ``name``; it is the only check a name needs.

        A known name returns at once. Any other value raises what validating it and then
        looking it up would: :class:`~sqla_queue.InvalidIdentifierError` for an invalid
        name, :class:`~sqla_queue.UnknownTaskError` for a valid unknown one.
        """
        if isinstance(name, str):
            found = self._registered.get(name)
            if found is None:
                found = self._declared.get(name)
            if found is not None:
                return found
        validate_task_name(name)
        raise UnknownTaskError(self.unknown_message(name))


@dataclasses.dataclass(frozen=True)
class TaskLimit:
    """A task's concurrency limit: the default declared in code, the stored override."""

    task: str
    declared: int | None
    stored: int | None

    @property
    def effective(self) -> int | None:
        """The limit workers apply: the stored value, else the declared one."""
        return self.stored if self.stored is not None else self.declared


@dataclasses.dataclass(frozen=True)
class QueueDefaults:
    """The queue-wide defaults of the task settings a registration leaves out."""

    max_attempts: int
    retry: RetryPolicy
    lost_interval: float
    max_reclaims: int

    @classmethod
    def checked(
        cls,
        max_attempts: int,
        retry: RetryPolicy | None,
        lost_interval: float,
        max_reclaims: int,
    ) -> QueueDefaults:
        """The defaults ``Queue(...)`` was given, checked by the rules of the task settings
        they stand for (``retry=None``: the default policy)."""
        settings = check_settings(
            {
                "lost_interval": lost_interval,
                "max_reclaims": max_reclaims,
                "max_attempts": max_attempts,
                "retry": retry,
            }
        )
        for name in ("lost_interval", "max_reclaims", "max_attempts"):
            if settings[name] is None:
                raise TypeError(f"Queue({name}=None): give a value, or leave it out")
        return cls(
            max_attempts=settings["max_attempts"],
            retry=settings["retry"] or RetryPolicy(),
            lost_interval=settings["lost_interval"],
            max_reclaims=settings["max_reclaims"],
        )


class TaskRegistry:
    """A queue's tasks, schedules and daemons by name, and the names enqueue accepts.

    Tasks write through ``enqueuer``, whose lookup of a task's defaults is ``known``'s.
    """

    def __init__(self, enqueuer: Enqueuer, known: KnownTasks, defaults: QueueDefaults) -> None:
        self.enqueuer = enqueuer
        self.known = known
        self.defaults = defaults
        self._tasks: dict[str, Task[Any, Any]] = {}
        # Every worker of the queue carries them in its plan.
        self._schedules: dict[str, Schedule] = {}
        self._daemons: dict[str, DaemonSpec] = {}

    @classmethod
    def build(cls, tables: QueueTables, notify: bool, defaults: QueueDefaults) -> TaskRegistry:
        """A registry for a new queue of ``tables``, with the queue's one enqueuer."""
        # The names enqueue accepts (registered or declared) and their rows' defaults.
        known = KnownTasks()
        enqueuer = Enqueuer(tables, notify=notify, defaults=known.lookup)
        enqueuer.workflows = WorkflowWriter(tables, notify=notify, defaults=known.lookup)
        return cls(enqueuer, known, defaults)

    @property
    def tasks(self) -> dict[str, Task[Any, Any]]:
        """The registered tasks, by name (a copy)."""
        return dict(self._tasks)

    @property
    def schedules(self) -> dict[str, Schedule]:
        """The registered schedules, by name (a copy)."""
        return dict(self._schedules)

    @property
    def daemons(self) -> dict[str, DaemonSpec]:
        """The registered daemons, by name (a copy)."""
        return dict(self._daemons)

    def task_names(self) -> list[str]:
        """The registered tasks' names, in registration order."""
        return list(self._tasks)

    def declared_limits(self) -> dict[str, int]:
        """The concurrency limits declared in code, by task (what a worker plan declares)."""
        return {
            name: task.task_options.concurrency_limit
            for name, task in self._tasks.items()
            if task.task_options.concurrency_limit is not None
        }

    def limits(self, stored: Mapping[str, int]) -> dict[str, TaskLimit]:
        """Every limit that applies, by task: declared in code, ``stored``, or both."""
        declared = self.declared_limits()
        return {
            name: TaskLimit(name, declared.get(name), stored.get(name))
            for name in sorted(set(stored) | set(declared))
        }

    # -- tasks -------------------------------------------------------------------------------

    def task_decorator(
        self, *, pass_context: bool, options: TaskKwargs, caller: str = "Queue.task"
    ) -> Callable[[Callable[..., Any]], Task[Any, Any]]:
        """The decorator ``@queue.task(...)`` builds; every option is checked here, first.

        The name defaults to the function's ``module.qualname`` (an empty one is refused);
        a declared ``concurrency_limit`` follows the rule of a stored one; and
        ``transactional=True`` needs ``pass_context=True``, since the handler writes through
        ``ctx.session``. The queue's defaults fill what the options leave out.
        """
        check_keywords(caller, options, TaskKwargs.__annotations__)
        settings = check_settings(dict(options))
        name = settings.get("name")
        if name is not None:
            validate_task_name(name)
        if not isinstance(pass_context, bool):
            raise TypeError(f"pass_context must be True or False, got {pass_context!r}")
        # The rule of a stored limit (queue.set_limit) holds for a declared one too.
        concurrency_limit = admin.check_limit(settings.get("concurrency_limit"))
        transactional = bool(settings.get("transactional"))
        if transactional and not pass_context:
            raise ValueError(
                "transactional=True runs the handler in ctx.session's transaction: register "
                "it with pass_context=True and write through ctx.session"
            )
        defaults = self.defaults

        def setting(key: str, default: Any) -> Any:
            value = settings.get(key)
            return default if value is None else value

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
                priority=setting("priority", 0),
                max_attempts=setting("max_attempts", defaults.max_attempts),
                retry=setting("retry", defaults.retry),
                lost_interval=setting("lost_interval", defaults.lost_interval),
                max_reclaims=setting("max_reclaims", defaults.max_reclaims),
                pass_context=pass_context,
                concurrency_limit=concurrency_limit,
                transactional=transactional,
                max_pending=settings.get("max_pending"),
            )
            handle: Task[Any, Any] = Task(self.enqueuer, func, task_options)
            self._tasks[task_name] = handle
            self.known.register(
                task_name,
                TaskDefaults(
                    task_options.priority, task_options.max_attempts, task_options.max_pending
                ),
            )
            return handle

        return register

    def declare(
        self, name: str, priority: int, max_attempts: int | None, max_pending: int | None
    ) -> None:
        """Let ``name`` be enqueued by name without its handler (``queue.declare_task``)."""
        validate_task_name(name)
        settings = check_settings(
            {"priority": priority, "max_attempts": max_attempts, "max_pending": max_pending}
        )
        if settings["priority"] is None:
            raise TypeError("declare_task(priority=None): give a whole number, or leave it out")
        if settings["max_attempts"] is None:
            settings["max_attempts"] = self.defaults.max_attempts
        self.known.declare(
            name,
            TaskDefaults(settings["priority"], settings["max_attempts"], settings["max_pending"]),
        )

    def get_task(self, name: str) -> Task[Any, Any]:
        """The registered task called ``name``, or :class:`~sqla_queue.UnknownTaskError`."""
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTaskError(self.known.unknown_message(name)) from None

    def check_known(
        self, doing: str, task: str, *, stored: Callable[[], Iterable[str]] | None = None
    ) -> None:
        """Refuse ``task`` for an operator's write unless it is registered or declared: a
        typo would store a setting that no worker reads, and show a task that does not
        exist. Every such write checks here, before it writes anything.

        ``stored`` (given by an undo: resume, removing a limit) reads the tasks that have
        something stored to undo: one of them is accepted too, so that what a task that is
        gone left behind can be cleared. An invalid name raises
        :class:`~sqla_queue.InvalidIdentifierError` before anything is read.
        """
        try:
            self.known.lookup(task)
        except UnknownTaskError as exc:
            if stored is not None and task in stored():
                return
            nothing = "" if stored is None else "; nothing is stored for it to undo either"
            raise UnknownTaskError(f"cannot {doing}: {exc}{nothing}") from None

    # -- periodic schedules --------------------------------------------------------------------

    def periodic_decorator(
        self,
        cron: str | None,
        every: dt.timedelta | None,
        name: str | None,
        timezone: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
        catch_up: str,
        catch_up_limit: int | None,
        pass_context: bool,
        options: Mapping[str, Any],
    ) -> Callable[[Callable[..., Any]], Task[Any, Any]]:
        """The decorator ``@queue.periodic(...)`` builds: a task, and its schedule."""
        check_keywords(
            "Queue.periodic", options, [k for k in TaskKwargs.__annotations__ if k != "name"]
        )
        if name is not None:
            validate_task_name(name)
        make_task = self.task_decorator(
            pass_context=pass_context, options=cast(TaskKwargs, {"name": name, **options})
        )

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
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
            handle = make_task(func)
            self._schedules[schedule.name] = dataclasses.replace(schedule, handle=handle)
            return handle

        return register

    def schedule(
        self,
        task: Task[Any, Any] | str,
        cron: str | None,
        every: dt.timedelta | None,
        name: str | None,
        timezone: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
        catch_up: str,
        catch_up_limit: int | None,
    ) -> Schedule:
        """Run a registered task on a schedule (``queue.schedule``); the schedule."""
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
        schedule = dataclasses.replace(schedule, handle=handle)
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

    # -- daemons -------------------------------------------------------------------------------

    def daemon_decorator(
        self,
        name: str | None,
        instances: int,
        lost_interval: float | None,
        backoff: DaemonBackoff | None,
    ) -> Callable[[DaemonFn], DaemonFn]:
        """The decorator ``@queue.daemon(...)`` builds; it returns the function unchanged."""
        if name is not None:
            validate_task_name(name)
        policy = DaemonBackoff() if backoff is None else backoff

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

        return register
