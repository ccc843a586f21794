"""Tasks: named handlers, and the handles that enqueue calls to them."""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from sqla_queue.core.backoff import RetryPolicy

if TYPE_CHECKING:
    from sqla_queue.queue import Queue

__all__ = ["EnqueueOptions", "JobSpec", "Task", "TaskOptions"]

P = ParamSpec("P")
R = TypeVar("R")

#: Anything enqueue can write through: it joins that object's transaction.
SyncBind = Session | Connection
AsyncBind = AsyncSession | AsyncConnection


@dataclass(frozen=True)
class TaskOptions:
    """How a task runs. Set with ``@queue.task(...)``; the queue's defaults fill the rest."""

    name: str
    priority: int = 0
    max_attempts: int = 1
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: Seconds without a heartbeat after which a running execution counts as lost.
    lost_interval: float | None = None
    #: How often a job may be lost (its worker died) before it is failed instead.
    max_reclaims: int | None = None
    #: Pass a :class:`~sqla_queue.JobContext` as the handler's first argument.
    pass_context: bool = False
    #: At most this many executions of the task run at once, across all workers. The
    #: value stored with ``queue.set_limit`` wins over this default.
    concurrency_limit: int | None = None


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-call options. They live apart from the task's arguments so names never collide.

    ``run_at`` is an aware datetime; ``delay`` is seconds (or a timedelta) counted on the
    database clock from the enqueueing statement. Give at most one of them.
    """

    run_at: dt.datetime | None = None
    delay: float | None = None
    priority: int | None = None
    queue_id: str | None = None
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")
        if self.run_at is not None and self.run_at.tzinfo is None:
            raise ValueError("run_at must be timezone-aware (for example datetime.now(UTC))")
        if self.delay is not None and self.delay < 0:
            raise ValueError("delay cannot be negative")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.queue_id is not None and (not isinstance(self.queue_id, str) or not self.queue_id):
            raise ValueError("queue_id must be a non-empty string")

    def merged(self, other: EnqueueOptions) -> EnqueueOptions:
        """These options with every field that ``other`` sets taken from ``other``."""
        changes = {k: v for k, v in vars(other).items() if v is not None}
        # run_at and delay are two spellings of one setting: the newer one replaces both.
        if other.run_at is not None:
            changes["delay"] = None
        elif other.delay is not None:
            changes["run_at"] = None
        return replace(self, **changes)


def make_enqueue_options(
    *,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    priority: int | None = None,
    queue_id: str | None = None,
    max_attempts: int | None = None,
) -> EnqueueOptions:
    """Validate per-call options, accepting a ``timedelta`` for ``delay``."""
    seconds = delay.total_seconds() if isinstance(delay, dt.timedelta) else delay
    return EnqueueOptions(run_at, seconds, priority, queue_id, max_attempts)


@dataclass(frozen=True)
class JobSpec:
    """One call to enqueue: a task name, its arguments and per-call options.

    Build them with :meth:`Task.call` (or directly, by name) for
    :meth:`~sqla_queue.Queue.enqueue_many`.
    """

    task: str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: EnqueueOptions = field(default_factory=EnqueueOptions)


class Task(Generic[P, R]):
    """A registered handler. Call ``.enqueue(session, ...)`` to run it in a worker.

    Calling the task object itself runs the function directly, in this process, which is
    handy in tests.
    """

    def __init__(
        self,
        queue: Queue,
        fn: Callable[..., Any],
        options: TaskOptions,
        call_options: EnqueueOptions | None = None,
    ) -> None:
        self.queue = queue
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

    def options(
        self,
        *,
        run_at: dt.datetime | None = None,
        delay: float | dt.timedelta | None = None,
        priority: int | None = None,
        queue_id: str | None = None,
        max_attempts: int | None = None,
    ) -> Task[P, R]:
        """A copy of this handle whose enqueues use these per-call options.

        ``send_email.options(delay=60, queue_id="account-42").enqueue(session, to=...)``.
        The original handle is unchanged; calls chain and later values win.
        """
        extra = make_enqueue_options(
            run_at=run_at,
            delay=delay,
            priority=priority,
            queue_id=queue_id,
            max_attempts=max_attempts,
        )
        return Task(self.queue, self.fn, self.task_options, self.call_options.merged(extra))

    def call(self, *args: P.args, **kwargs: P.kwargs) -> JobSpec:
        """Describe one call for :meth:`~sqla_queue.Queue.enqueue_many`, without writing it."""
        return JobSpec(self.name, args, kwargs, self.call_options)

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
        return self.queue._enqueue_call(session, self.name, args, kwargs, self.call_options)
