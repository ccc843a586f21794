"""The queue's administrative SQL, run in one place: requeue, prune, limits, failed jobs.

:class:`~sqla_queue.Queue` (``requeue``, ``prune``, ``set_limit``, ``limits``) and the
``sqla-queue`` command line call these functions; none of them executes these statements
itself. Each function takes what the caller holds (a ``Session`` or ``Connection``, and for
requeue and prune their async twins too) and the queue's
:class:`~sqla_queue.models.QueueTables`. Every call joins the caller's transaction: nothing
here commits. Async binds get a coroutine of the result.

Values are checked here, before anything is executed, by the ``check_*`` functions
(a negative age, a limit or an id that the column cannot hold: :class:`ValueError` naming
the argument and the rule). ``Queue`` checks task names against its own registry before it
calls in. A role without the privilege to change limits gets
:class:`~sqla_queue.InsufficientPrivilegeError` naming the ``GRANT`` that fixes it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, overload

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from sqla_queue._binds import AnyBind, scalars_each
from sqla_queue._sqlstate import INSUFFICIENT_PRIVILEGE, sqlstate_of
from sqla_queue.errors import InsufficientPrivilegeError
from sqla_queue.models.tables import QueueTables
from sqla_queue.schema.manifest import ADMIN_LIMIT_PRIVILEGES, RequiredPrivilege
from sqla_queue.schema.verify import GRANTS_GUIDE, grant_statements
from sqla_queue.spec import INT4_MAX
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
    "BIGINT_MAX",
    "INTEGER_MAX",
    "FailedJob",
    "check_age",
    "check_failed_limit",
    "check_job_ids",
    "check_limit",
    "failed_jobs",
    "operator_write_refused",
    "prune",
    "requeue",
    "set_limit",
    "stored_limits",
]

SyncBind = Session | Connection
AsyncBind = AsyncSession | AsyncConnection

#: The largest value of PostgreSQL's ``integer`` (the stored concurrency limit).
INTEGER_MAX = INT4_MAX
#: The largest value of PostgreSQL's ``bigint`` (job ids).
BIGINT_MAX = 2**63 - 1
# Ages beyond this prune what they would prune at any larger age (nothing finished before
# 1000 BC), and keep now() - age inside PostgreSQL's timestamp range (4713 BC on).
_PRUNE_HORIZON_SECONDS = 3000 * 365.25 * 86400


def check_limit(limit: object) -> int | None:
    """``limit`` as a concurrency limit to store, or ``None`` (remove the stored one).

    A limit is a whole number from 1 to :data:`INTEGER_MAX` (the limits table's column is
    an ``integer``); anything else raises :class:`ValueError` naming it.
    """
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= INTEGER_MAX:
        raise ValueError(
            f"a concurrency limit must be a whole number from 1 to {INTEGER_MAX}, got {limit!r}"
        )
    return limit


def check_job_ids(job_ids: Iterable[int]) -> list[int]:
    """The job ids of an iterable, each a whole number that a ``bigint`` holds.

    Strings of digits are converted with ``int`` (ids often come from forms and command
    lines); a string or bytes given for the whole iterable, a float, a bool, or an id
    beyond ``bigint`` raises :class:`TypeError` or :class:`ValueError` naming it.
    """
    if isinstance(job_ids, str | bytes) or not isinstance(job_ids, Iterable):
        raise TypeError(f"job_ids must be an iterable of job ids, got {job_ids!r}")
    ids: list[int] = []
    for raw in job_ids:
        if isinstance(raw, bool | float):
            raise TypeError(f"a job id must be a whole number, got {raw!r}")
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise TypeError(f"a job id must be a whole number, got {raw!r}") from None
        if not -BIGINT_MAX - 1 <= value <= BIGINT_MAX:
            raise ValueError(
                f"job id {value} is out of range: ids are bigint, at most {BIGINT_MAX}"
            )
        ids.append(value)
    return ids


def check_age(older_than: object) -> float:
    """``older_than`` (a ``timedelta`` of zero or more) in seconds, for :func:`prune`.

    A negative age would select jobs that finish in the future, that is every finished
    job: it raises :class:`ValueError`. Ages beyond 3,000 years select what 3,000 years
    selects (nothing), and are capped so the database can compute ``now() - age``.
    """
    if not isinstance(older_than, dt.timedelta):
        raise TypeError(f"older_than must be a datetime.timedelta, got {older_than!r}")
    seconds = older_than.total_seconds()
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(
            f"older_than must not be negative, got {older_than!r}: a negative age "
            "would delete every finished job, including those that finished just now"
        )
    return min(seconds, _PRUNE_HORIZON_SECONDS)


def check_failed_limit(limit: object) -> int:
    """How many failed jobs :func:`failed_jobs` may list: a whole number from 1."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"the number of failed jobs to list must be at least 1, got {limit!r}")
    return min(limit, BIGINT_MAX)


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

    The ids are read and checked (:func:`check_job_ids`) before anything is executed, also
    for an async bind. See :func:`~sqla_queue.statements.requeue_statement`.
    """
    params: RequeueParams = {"ids": check_job_ids(job_ids)}
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

    Failed jobs go only with ``include_failed``. A negative age raises :class:`ValueError`
    before anything is executed (see :func:`check_age`). See
    :func:`~sqla_queue.statements.prune_statement`.
    """
    params: PruneParams = {
        "older_than": check_age(older_than),
        "include_failed": bool(include_failed),
    }
    ids = scalars_each(bind, prune_statement(tables), [params])
    if isinstance(ids, list):
        return len(ids)
    return _count(ids)


async def _count(ids: Coroutine[Any, Any, list[Any]]) -> int:
    return len(await ids)


def set_limit(bind: SyncBind, tables: QueueTables, task: str, limit: int | None) -> None:
    """Store ``limit`` as the concurrency limit of ``task``; ``None`` deletes the stored one.

    ``limit`` is checked first (:func:`check_limit`). A role that may read the limits table
    but not write it (the application role of the deployment guide) gets
    :class:`~sqla_queue.InsufficientPrivilegeError` naming the ``GRANT`` that fixes it.
    """
    checked = check_limit(limit)
    connection = _connection(bind)
    try:
        if checked is None:
            deleted: DeleteLimitParams = {"task": task}
            connection.execute(delete_limit_statement(tables), deleted)
        else:
            stored: SetLimitParams = {"task": task, "concurrency_limit": checked}
            connection.execute(set_limit_statement(tables), stored)
    except DBAPIError as exc:
        if sqlstate_of(exc) != INSUFFICIENT_PRIVILEGE:
            raise
        raise operator_write_refused(
            connection,
            tables,
            exc,
            table=tables.limits.name,
            privileges=ADMIN_LIMIT_PRIVILEGES,
            doing="change a concurrency limit",
            needs=f"Changing limits needs {', '.join(ADMIN_LIMIT_PRIVILEGES)} on the limits "
            "table, beyond the application role's SELECT.",
        ) from exc


def operator_write_refused(
    connection: Connection,
    tables: QueueTables,
    exc: DBAPIError,
    *,
    table: str,
    privileges: tuple[str, ...],
    doing: str,
    needs: str,
) -> InsufficientPrivilegeError:
    """The error for a write that only the operator role may make (``doing``), refused for
    lack of ``privileges`` on ``table``: the cause, what is needed (``needs``), and the
    ``GRANT`` statements that fix it."""
    schema = tables.schema or "<schema>"
    lacking = [RequiredPrivilege("table", table, privilege) for privilege in privileges]
    role = connection.engine.url.username or "<role>"
    grants = " ".join(grant_statements(lacking, schema, role))
    cause = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
    return InsufficientPrivilegeError(
        f"cannot {doing}: {cause}. {needs} As the tables' owner, run: {grants} (the operator "
        f"role in {GRANTS_GUIDE}).",
        [need.describe(schema) for need in lacking],
    )


def stored_limits(bind: SyncBind, tables: QueueTables) -> dict[str, int]:
    """Every limit stored in the database, by task name (the values in code not included)."""
    rows = _connection(bind).execute(stored_limits_statement(tables)).all()
    return dict(rows)


def failed_jobs(bind: SyncBind, tables: QueueTables, *, limit: int) -> list[FailedJob]:
    """The ``limit`` most recently failed jobs, newest first (``limit``: 1 or more)."""
    params: FailedJobsParams = {"limit": check_failed_limit(limit)}
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
