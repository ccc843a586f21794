"""Bounded enqueue: the enqueue of a task with ``max_pending`` writes only if its rows fit.

Such an enqueue takes the task's lock, counts the task's pending jobs in a fresh
snapshot, and writes only if the call's rows fit (see :mod:`sqla_queue.statements.bounded`
for why that is exact). :func:`bounded_flow` wraps the flow that writes the jobs (a plain
or a unique enqueue's) with those steps; the :class:`~sqla_queue.enqueue.Enqueuer` routes a
call here only when one of its tasks is bounded, so an unbounded task's enqueue never
comes near it: same statements, same round trips as before bounds existed.

Everything here is an I/O-free flow (see :mod:`sqla_queue.conversation`): the caller's
connection runs it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import Select
from sqlalchemy.sql import Executable

from sqla_queue.conversation import Flow, Wait, before_first
from sqla_queue.errors import IsolationLevelError, QueueFull
from sqla_queue.models.tables import QueueTables
from sqla_queue.spec import JobSpec
from sqla_queue.statements.bounded import (
    BoundLockParams,
    PendingCountParams,
    bound_lock_key,
    bound_lock_statement,
    pending_count_statement,
)
from sqla_queue.statements.enqueue import EnqueueParams

__all__ = [
    "FULL_POLL_INTERVAL",
    "BoundedStatements",
    "bounded_flow",
    "wait_of",
    "write_flow",
]

#: Seconds between two counts of a full task by an enqueue that waits for room. Workers
#: free room without telling anyone, so it is polled; each count costs at most three index
#: walks of ``max_pending`` entries.
FULL_POLL_INTERVAL = 0.05

T = TypeVar("T")


@dataclass(frozen=True)
class BoundedStatements:
    """The statements of a bounded enqueue, built once per queue, and its lock names."""

    #: Takes a task's enqueue lock.
    lock: Select[tuple[object]]
    #: Counts a task's pending jobs, up to its bound.
    count: Select[tuple[int, str]]
    tables: QueueTables

    @classmethod
    def build(cls, tables: QueueTables) -> BoundedStatements:
        """Build them for ``tables``."""
        return cls(bound_lock_statement(tables), pending_count_statement(tables), tables)

    def lock_params(self, task: str) -> BoundLockParams:
        """The parameters that take ``task``'s enqueue lock."""
        return {"key": bound_lock_key(self.tables, task)}


def wait_of(specs: Sequence[JobSpec]) -> float:
    """How long a call may wait for room: the longest ``wait_if_full`` of its specs."""
    return max((spec.options.wait_if_full or 0.0 for spec in specs), default=0.0)


def write_flow(statement: Executable, chunks: Sequence[str]) -> Flow[list[int]]:
    """Write ``chunks`` with the enqueue ``statement``; the new ids, in order."""
    ids: list[int] = []
    for chunk in chunks:
        params: EnqueueParams = {"rows": chunk}
        rows = yield statement, params
        ids.extend(int(row[0]) for row in rows)
    return ids


def _full(
    task: str, bound: int, pending: int, requested: int, waited: float, wait: float
) -> QueueFull:
    pending = min(pending, bound)
    if requested > bound:
        why = f"this call adds {requested} jobs, more than the bound itself"
        fix = "enqueue them in batches of at most max_pending, or raise max_pending"
    else:
        why = f"{pending} of its jobs are pending and this call adds {requested}"
        if wait > 0:
            fix = (
                f"it waited {waited:.1f}s (wait_if_full={wait:g}) without room; wait longer, "
                "add workers, or raise max_pending"
            )
        else:
            fix = (
                "retry later, pass wait_if_full=seconds to wait for room, add workers, or "
                "raise max_pending"
            )
    return QueueFull(
        f"task {task!r} is full (max_pending={bound}): {why}; nothing was enqueued. To go "
        f"on: {fix}.",
        task=task,
        max_pending=bound,
        pending=pending,
        requested=requested,
        waited=round(waited, 3),
    )


def _room_flow(
    statements: BoundedStatements,
    bounds: Mapping[str, int],
    need: Mapping[str, int],
    wait: float,
) -> Flow[None]:
    """Count each bounded task that needs room until all have it; raise QueueFull at the
    deadline. Each count is a statement of its own, so each sees the latest commits."""
    started = time.monotonic()
    left = sorted(task for task, n in need.items() if n > 0 and task in bounds)
    for task in left:
        if need[task] > bounds[task]:
            raise _full(task, bounds[task], 0, need[task], 0.0, wait)
    while left:
        full: list[tuple[str, int]] = []
        for task in left:
            params: PendingCountParams = {"task": task, "cap": bounds[task]}
            rows = yield statements.count, params
            pending, isolation = int(rows[0][0]), str(rows[0][1])
            if isolation != "read committed":
                raise IsolationLevelError(
                    f"cannot enqueue bounded task {task!r} (max_pending={bounds[task]}) in a "
                    f"{isolation.upper()} transaction: its pending jobs are counted exactly "
                    "only in a READ COMMITTED one (PostgreSQL's default), whose count sees "
                    "every earlier enqueuer's commit. Nothing was enqueued; run the enqueue "
                    "in a READ COMMITTED transaction."
                )
            if pending + need[task] > bounds[task]:
                full.append((task, pending))
        if not full:
            return
        # Room found for a task stays: its lock keeps other enqueuers out, and workers
        # only take jobs away (a retry or a reclaim puts back a job already admitted).
        left = [task for task, _ in full]
        waited = time.monotonic() - started
        if waited >= wait:
            task, pending = full[0]
            raise _full(task, bounds[task], pending, need[task], waited if wait else 0.0, wait)
        yield Wait(min(FULL_POLL_INTERVAL, wait - waited))


def bounded_flow(
    inner: Flow[T],
    *,
    statements: BoundedStatements,
    enqueue: Executable,
    bounds: Mapping[str, int],
    need: Mapping[str, int],
    wait: float,
) -> Flow[T]:
    """Run ``inner`` (a flow that writes jobs with ``enqueue``) within the bounds.

    First the enqueue lock of every task in ``bounds`` is taken, in name order (so two
    calls that bound the same tasks never deadlock). ``inner`` then runs; before its first
    ``enqueue`` statement, each task with rows to write (``need``, read then: the unique
    flow fills it only when it knows which calls write) is counted until all have room,
    for up to ``wait`` seconds, or :class:`~sqla_queue.QueueFull` is raised before
    anything is written. The locks stay held until the caller's transaction ends, which
    is what keeps the next enqueuer's count exact.
    """
    for task in sorted(bounds):
        yield statements.lock, statements.lock_params(task)
    return (
        yield from before_first(inner, enqueue, lambda: _room_flow(statements, bounds, need, wait))
    )
