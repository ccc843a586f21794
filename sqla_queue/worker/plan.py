"""The worker plan: everything a worker needs from a :class:`~sqla_queue.Queue`, resolved once.

A worker never sees the ``Queue``. The queue builds a frozen :class:`WorkerPlan` for the
tasks a worker serves: its tables, whether enqueues notify, and per task a
:class:`TaskRuntime` with the handler and every default already settled (retry policy,
attempts, lease, reclaims, declared limit). The decider's unit tests build plans by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqla_queue.checks import check_seconds, check_whole_number
from sqla_queue.logic.backoff import RetryPolicy
from sqla_queue.logic.times import MAX_LOST_INTERVAL
from sqla_queue.models.tables import QueueTables

__all__ = ["TaskRuntime", "WorkerPlan"]


def _whole(where: str, name: str, value: object, *, low: int) -> None:
    check_whole_number(f"{where}: {name}", value, low)


def _lease(what: str, value: object) -> None:
    """A lost interval, as for task options. A NaN or a zero would make the heartbeat and
    the reclaimer spin."""
    check_seconds(what, value, maximum=MAX_LOST_INTERVAL, positive=True)


@dataclass(frozen=True)
class TaskRuntime:
    """One task as a worker runs it: the handler and its resolved defaults."""

    name: str
    handler: Callable[..., Any]
    #: ``async def`` handlers run on an event loop, ``def`` ones in threads.
    is_async: bool
    #: Pass a :class:`~sqla_queue.JobContext` as the handler's first argument.
    pass_context: bool
    max_attempts: int
    retry: RetryPolicy
    #: Seconds without a heartbeat after which a running execution counts as lost.
    lease: float
    #: How often a job may be lost before it is failed instead of run again.
    max_reclaims: int
    #: The limit declared in code; a stored limit wins over it.
    declared_limit: int | None = None
    #: Commit the completion in the handler's ``ctx.session`` transaction.
    transactional: bool = False

    def __post_init__(self) -> None:
        where = f"task {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a task's name must be a non-empty string, got {self.name!r}")
        if not callable(self.handler):
            raise TypeError(f"{where}: the handler must be callable, got {self.handler!r}")
        for flag in ("is_async", "pass_context", "transactional"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{where}: {flag} must be True or False")
        _whole(where, "max_attempts", self.max_attempts, low=1)
        _whole(where, "max_reclaims", self.max_reclaims, low=0)
        if self.declared_limit is not None:
            _whole(where, "concurrency_limit", self.declared_limit, low=1)
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"{where}: retry must be a RetryPolicy, got {self.retry!r}")
        _lease(f"{where}: lost_interval", self.lease)


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker serves, fixed before its first claim."""

    tables: QueueTables
    #: Enqueues send a NOTIFY: the worker listens unless its settings say otherwise.
    notify: bool
    #: The queue-wide lost interval: the claim's fallback for tasks without their own.
    default_lease: float
    #: The tasks this worker claims, by name (never empty).
    tasks: Mapping[str, TaskRuntime]
    #: The queue's periodic schedules (:class:`sqla_queue.periodic.Schedule`): every
    #: worker may fire them; the database lets one enqueue each tick.
    schedules: tuple[Any, ...] = ()
    #: The queue's daemons (:class:`sqla_queue.daemons.DaemonSpec`), run beside the jobs.
    daemons: tuple[Any, ...] = ()
    #: The queue's :class:`~sqla_queue.workflows.WorkflowWriter`: a workflow node's
    #: completion releases its dependents and writes its expansion through it.
    workflows: Any = None

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("a worker plan needs at least one task")
        if not isinstance(self.notify, bool):
            raise TypeError(f"notify must be True or False, got {self.notify!r}")
        _lease("the queue's lost_interval", self.default_lease)
        for name, runtime in self.tasks.items():
            if not isinstance(runtime, TaskRuntime) or runtime.name != name:
                raise ValueError(f"the plan's task {name!r} must be a TaskRuntime of that name")

    @property
    def task_names(self) -> list[str]:
        """The served task names, sorted (the claim's ``tasks`` parameter)."""
        return sorted(self.tasks)

    @property
    def declared_limits(self) -> dict[str, int]:
        """Limits declared in code for the served tasks."""
        return {
            name: runtime.declared_limit
            for name, runtime in self.tasks.items()
            if runtime.declared_limit is not None
        }

    @property
    def shortest_lease(self) -> float:
        """The shortest lease of any served task (or the queue's, if shorter)."""
        return min([self.default_lease, *(t.lease for t in self.tasks.values())])

    @property
    def has_async(self) -> bool:
        """Whether any served task has an ``async def`` handler."""
        return any(t.is_async for t in self.tasks.values())
