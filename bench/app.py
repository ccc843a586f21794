"""The benchmark's host application: a business table, a queue beside it, no-op handlers.

Worker processes import this module, so the handlers and the queue are the same objects
in the producer and in every worker.
"""

from __future__ import annotations

import inspect
import time
from typing import Any, cast

from sqlalchemy import Integer, MetaData
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_queue import Queue

__all__ = [
    "ANOOP",
    "NOOP",
    "STAMP",
    "STARTS",
    "Base",
    "Order",
    "limit_task",
    "limits_supported",
    "nohistory_queue",
    "queue",
    "quiet_queue",
]

NOOP = "bench.noop"
ANOOP = "bench.anoop"
STAMP = "bench.stamp"
#: Concurrency limits of the limit-scaling scenario; each gets its own no-op task.
LIMITS = (10, 5000)

#: Handler start times (``time.monotonic()``, one clock for every process on the machine)
#: of the latency scenario, by the job's ``seq`` argument.
STARTS: dict[int, float] = {}


class Base(DeclarativeBase):
    """The host application's declarative base."""


class Order(Base):
    """A business row: the single-enqueue scenario writes one per transaction."""

    __tablename__ = "bench_orders"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    total: Mapped[int] = mapped_column(Integer)


def _noop(n: int = 0) -> None:
    """A handler that does nothing: the benchmark measures the queue, not the work."""


async def _anoop(n: int = 0) -> None:
    """The ``async def`` twin of the no-op handler, for the async worker."""


def _stamp(seq: int) -> None:
    """Record when the handler of job number ``seq`` started."""
    STARTS[seq] = time.monotonic()


def _register(target: Queue) -> None:
    target.task(name=NOOP)(_noop)
    target.task(name=ANOOP)(_anoop)
    target.task(name=STAMP)(_stamp)


def limit_task(limit: int) -> str:
    """The name of the no-op task limited to ``limit`` running executions (0: unlimited)."""
    return f"bench.limit{limit}" if limit else NOOP


def limits_supported() -> bool:
    """Whether the installed sqla_queue has ``@queue.task(concurrency_limit=N)``."""
    if "concurrency_limit" in inspect.signature(Queue.task).parameters:
        return True
    # Since the task options became a TypedDict (``**options: Unpack[TaskKwargs]``).
    from sqla_queue import task as task_module

    kwargs = getattr(task_module, "TaskKwargs", None)
    return kwargs is not None and "concurrency_limit" in getattr(kwargs, "__annotations__", {})


#: The queue as an application would declare it: NOTIFY on enqueue.
queue = Queue(Base)
_register(queue)
if limits_supported():
    for _limit in LIMITS:
        # Through Any: the keyword exists only in versions with concurrency limits.
        cast(Any, queue.task)(name=limit_task(_limit), concurrency_limit=_limit)(_noop)

#: The same tables seen through a queue that never sends NOTIFY (the poll-only runs).
quiet_queue = Queue(metadata=MetaData(), notify=False)
_register(quiet_queue)

#: The same tables as a queue without history (``history="none"``: a succeeded job's rows
#: are deleted at its completion); the schema is the same, so no other table is needed.
nohistory_queue = Queue(metadata=MetaData(), history="none")
_register(nohistory_queue)
