"""The queue's administrative SQL, run in one place: requeue, prune, limits, failed jobs.

:class:`~sqla_queue.Queue` (``requeue``, ``prune``, ``set_limit``, ``limits``) and the
``sqla-queue`` command line call these functions; none of them executes these statements
itself. Each function takes what the caller holds (a ``Session`` or ``Connection``, and for
requeue and prune their async twins too) and the queue's
:class:`~sqla_queue.models.QueueTables`. Every call joins the caller's transaction: nothing
here commits. Async binds get a coroutine of the result.

Arguments are taken as already checked: ``Queue`` validates task names and limits before
it calls in, so that its error messages stay its own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, overload

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from sqla_queue._binds import AnyBind, scalars_each
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.admin import (
    FailedJobsParams,
    PruneParams,
    RequeueParams,
    failed_jobs_statement,
    prune_statement,
    requeue_statement,
)
from sqla_queue.statements.limits import (
    DeleteLimitParams,
    SetLimitParams,
    delete_limit_statement,
    set_limit_statement,
    stored_limits_statement,
)

__all__ = [
    "FailedJob",
    "failed_jobs",
    "prune",
    "requeue",
    "set_limit",
    "stored_limits",
]

SyncBind = Session | Connection
AsyncBind = AsyncSession | AsyncConnection


@dataclass(frozen=True)
class FailedJob:
    """One failed job as :func:`failed_jobs` lists it."""

    id: int
    task: str
    attempts: int
    finished_at: dt.datetime | None
    #: The last entry of the job's error history (``type``, ``message``, ...), if any.
    last_error: dict[str, Any] | None


def _connection(bind: SyncBind) -> Connection:
    return bind.connection() if isinstance(bind, Session) else bind


@overload
def requeue(bind: SyncBind, tables: QueueTables, job_ids: Iterable[int]) -> list[int]: ...


@overload
def requeue(
    bind: AsyncBind, tables: QueueTables, job_ids: Iterable[int]
) -> Coroutine[Any, Any, list[int]]: ...


def requeue(
    bind: AnyBind, tables: QueueTables, job_ids: Iterable[int]
) -> list[int] | Coroutine[Any, Any, list[int]]:
    """Put failed or cancelled jobs back in the queue; the ids requeued, in id order.

    The ids are read (and converted with ``int``) before anything is executed, also for an
    async bind. See :func:`~sqla_queue.statements.requeue_statement`.
    """
    params: RequeueParams = {"ids": [int(i) for i in job_ids]}
    return scalars_each(bind, requeue_statement(tables), [params])


@overload
def prune(
    bind: SyncBind, tables: QueueTables, *, older_than: dt.timedelta, include_failed: bool
) -> int: ...


@overload
def prune(
    bind: AsyncBind, tables: QueueTables, *, older_than: dt.timedelta, include_failed: bool
) -> Coroutine[Any, Any, int]: ...


def prune(
    bind: AnyBind, tables: QueueTables, *, older_than: dt.timedelta, include_failed: bool
) -> int | Coroutine[Any, Any, int]:
    """Delete finished jobs older than ``older_than``; how many were deleted.

    Failed jobs go only with ``include_failed``. See
    :func:`~sqla_queue.statements.prune_statement`.
    """
    params: PruneParams = {
        "older_than": older_than.total_seconds(),
        "include_failed": include_failed,
    }
    ids = scalars_each(bind, prune_statement(tables), [params])
    if isinstance(ids, list):
        return len(ids)
    return _count(ids)


async def _count(ids: Coroutine[Any, Any, list[Any]]) -> int:
    return len(await ids)


def set_limit(bind: SyncBind, tables: QueueTables, task: str, limit: int | None) -> None:
    """Store ``limit`` as the concurrency limit of ``task``; ``None`` deletes the stored one."""
    connection = _connection(bind)
    if limit is None:
        deleted: DeleteLimitParams = {"task": task}
        connection.execute(delete_limit_statement(tables), deleted)
    else:
        stored: SetLimitParams = {"task": task, "concurrency_limit": limit}
        connection.execute(set_limit_statement(tables), stored)


def stored_limits(bind: SyncBind, tables: QueueTables) -> dict[str, int]:
    """Every limit stored in the database, by task name (the values in code not included)."""
    rows = _connection(bind).execute(stored_limits_statement(tables)).all()
    return dict(rows)


def failed_jobs(bind: SyncBind, tables: QueueTables, *, limit: int) -> list[FailedJob]:
    """The ``limit`` most recently failed jobs, newest first."""
    params: FailedJobsParams = {"limit": limit}
    rows = _connection(bind).execute(failed_jobs_statement(tables), params).all()
    return [
        FailedJob(
            id=row.id,
            task=row.task,
            attempts=row.attempts,
            finished_at=row.finished_at,
            last_error=row.last_error,
        )
        for row in rows
    ]
