"""Tasks: named handlers, and the handles that enqueue calls to them."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypedDict, TypeVar, Unpack, overload

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from sqla_queue.checks import INT4_MIN, check_seconds, check_whole_number
from sqla_queue.enqueue import Enqueuer
from sqla_queue.logic.backoff import RetryPolicy
from sqla_queue.logic.times import MAX_LOST_INTERVAL
from sqla_queue.spec import (
    OPTION_NAMES,
    EnqueueKwargs,
    EnqueueOptions,
    JobSpec,
    check_keywords,
    make_enqueue_options,
)

__all__ = [
    "MAX_LOST_INTERVAL",
    "SETTING_CHECKS",
    "Task",
    "TaskKwargs",
    "TaskOptions",
    "check_settings",
]


def _check_retry(value: object) -> RetryPolicy:
    if not isinstance(value, RetryPolicy):
        raise TypeError(f"retry must be a RetryPolicy, got {value!r} ({type(value).__name__})")
    return value


def _check_flag(option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{option} must be True or False, got {value!r}")
    return value


#: How each task setting is checked (and normalized); shared by ``@queue.task``,
#: ``queue.declare_task`` and ``Queue(...)``, whose defaults follow the same rules.
SETTING_CHECKS: dict[str, Callable[[object], Any]] = {
    # The priority column is a PostgreSQL integer.
    "priority": lambda value: check_whole_number("priority", value, INT4_MIN),
    "max_attempts": lambda value: check_whole_number("max_attempts", value, 1),
    "lost_interval": lambda value: check_seconds(
        "lost_interval", value, maximum=MAX_LOST_INTERVAL, positive=True
    ),
    # 0: a job whose worker dies is failed at once instead of run again.
    "max_reclaims": lambda value: check_whole_number("max_reclaims", value, 0),
    "retry": _check_retry,
    "transactional": lambda value: _check_flag("transactional", value),
    # Counted against a bound this big on every enqueue: the count stops at the bound.
    "max_pending": lambda value: check_whole_number("max_pending", value, 1),
}


def check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with every value that :data:`SETTING_CHECKS` knows checked and normalized.

    ``None`` stays ``None`` (the default applies). Raises ``TypeError`` for a wrong type
    and ``ValueError`` for a value out of range, naming the setting and the rule.
    """
    return {
        name: value if value is None or name not in SETTING_CHECKS else SETTING_CHECKS[name](value)
        for name, value in settings.items()
    }


P = ParamSpec("P")
R = TypeVar("R")

#: Anything enqueue can write through: it joins that object's transaction.
SyncBind = Session | Connection
AsyncBind = AsyncSession | AsyncConnection


@dataclass(frozen=True)
class TaskOptions:
    """How a task runs. Set with ``@queue.task(...)``; the queue's defaults fill the rest.

    Every default is resolved at registration: a value the task does not give is the
    queue's.
    """

    name: str
    priority: int = 0
    max_attempts: int = 1
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: Seconds without a heartbeat after which a running execution counts as lost.
    lost_interval: float = 30.0
    #: How often a job may be lost (its worker died) before it is failed instead.
    max_reclaims: int = 3
    #: Pass a :class:`~sqla_queue.JobContext` as the handler's first argument.
    pass_context: bool = False
    #: At most this many executions of the task run at once, across all workers. The
    #: value stored with ``queue.set_limit`` wins over this default.
    concurrency_limit: int | None = None
    #: Run the handler in ``ctx.session``'s transaction and commit the job's completion
    #: in it: the handler's writes and the job's success land together or not at all.
    transactional: bool = False
    #: At most this many of the task's jobs wait to run (pending or waiting behind their
    #: ``queue_id``); an enqueue past it raises :class:`~sqla_queue.QueueFull` or waits
    #: for room (``wait_if_full``). None: unbounded, and its enqueues pay nothing for it.
    max_pending: int | None = None


class TaskKwargs(TypedDict, total=False):
    """The registration keywords of ``@queue.task(...)``, apart from ``pass_context``.

    ``None`` (or leaving one out) takes the queue's default; see :class:`TaskOptions`.
    Each is checked at registration (see :data:`SETTING_CHECKS`): ``TypeError`` for a
    wrong type, ``ValueError`` for a value out of range.
    """

    #: The stored name; ``module.qualname`` of the function when not given (an empty
    #: name is refused, not replaced).
    name: str | None
    #: A whole number that fits a PostgreSQL integer; 0 when not given.
    priority: int | None
    #: A whole number, at least 1.
    max_attempts: int | None
    retry: RetryPolicy | None
    #: Seconds: a finite number above 0, at most :data:`MAX_LOST_INTERVAL`.
    lost_interval: float | None
    #: A whole number, at least 0.
    max_reclaims: int | None
    #: A whole number, at least 1.
    concurrency_limit: int | None
    #: True to commit the handler's ``ctx.session`` writes and the job's success in one
    #: transaction (needs ``pass_context=True``). See the exactly-once guide.
    transactional: bool | None
    #: A whole number, at least 1: the most jobs of the task that may wait to run. See
    #: the bounded queues guide. None (the default): unbounded.
    max_pending: int | None


class Task(Generic[P, R]):
    """A registered handler. Call ``.enqueue(session, ...)`` to run it in a worker.

    Calling the task object itself runs the function directly, in this process, which is
    handy in tests.
    """

    def __init__(
        self,
        enqueuer: Enqueuer,
        fn: Callable[..., Any],
        options: TaskOptions,
        call_options: EnqueueOptions | None = None,
    ) -> None:
        #: Writes this task's jobs (the queue's one :class:`~sqla_queue.enqueue.Enqueuer`).
        self.enqueuer = enqueuer
        self.fn = fn
        self.task_options = options
        self.call_options = call_options or EnqueueOptions()
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    @property
    def name(self) -> str:
        """The task's registered name, stored on each job."""
        return self.task_options.name

    def __repr__(self) -> str:
        return f"<Task {self.name!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the handler directly, outside any worker.

        A ``pass_context=True`` handler needs its context: call ``task.fn(ctx, ...)``.
        """
        if self.task_options.pass_context:
            raise TypeError(
                f"task {self.name!r} takes a JobContext first: call {self.name}.fn(ctx, ...) "
                "to run it directly"
            )
        result: R = self.fn(*args, **kwargs)
        return result

    def options(self, **options: Unpack[EnqueueKwargs]) -> Task[P, R]:
        """A copy of this handle whose enqueues use these per-call options.

        ``send_email.options(delay=60, queue_id="account-42").enqueue(session, to=...)``.
        The options are those of :class:`~sqla_queue.spec.EnqueueKwargs`. The original
        handle is unchanged; calls chain and later values win.
        """
        check_keywords("Task.options", options, OPTION_NAMES)
        extra = make_enqueue_options(**options)
        return Task(self.enqueuer, self.fn, self.task_options, self.call_options.merged(extra))

    def call(self, *args: P.args, **kwargs: P.kwargs) -> JobSpec:
        """Describe one call for :meth:`~sqla_queue.Queue.enqueue_many`, without writing it."""
        return JobSpec(self.name, args, kwargs, self.call_options, origin=self.enqueuer)

    @overload
    def enqueue(self, session: SyncBind, /, *args: P.args, **kwargs: P.kwargs) -> int: ...

    @overload
    def enqueue(
        self, session: AsyncBind, /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, int]: ...

    def enqueue(
        self, session: SyncBind | AsyncBind, /, *args: P.args, **kwargs: P.kwargs
    ) -> int | Coroutine[Any, Any, int]:
        """Enqueue a call inside ``session``'s transaction and return the new job's id.

        With a ``Session`` or ``Connection`` it returns the id; with an ``AsyncSession`` or
        ``AsyncConnection`` it returns a coroutine to await. The job exists only if that
        transaction commits. Arguments must be JSON-serializable.
        """
        # The call's parts go straight to the single-job path: no JobSpec in between.
        return self.enqueuer.enqueue_call(session, self.name, args, kwargs, self.call_options)
