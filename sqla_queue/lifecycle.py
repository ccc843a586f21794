"""Cancelling jobs and waiting for their results: the logic once, a face per I/O style.

``queue.cancel`` is one statement (see :mod:`sqla_queue.statements.lifecycle`), committed
at once on a connection of its own, never in the caller's transaction (see :func:`cancel`).
``queue.result`` waits on a connection of its own too (a transaction's snapshot would never
see the job finish): it marks the job awaited, so that its completion sends a NOTIFY, and
then reads the job each time a notification for it arrives, or when a poll interval passes
without one. A driver that cannot LISTEN (asyncpg through SQLAlchemy) only polls. The
conversation is :func:`result_flow`, a :data:`~sqla_queue.conversation.Flow`: without I/O,
it yields its statements and its waits. :func:`wait_sync` and :func:`wait_async` run it
with the conversation's drivers, and spend each wait listening for the job's notification.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql import Executable

from sqla_queue._binds import (
    check_async_source,
    check_source,
    own_async_connection,
    own_connection,
    tables_for,
)
from sqla_queue._durations import format_duration
from sqla_queue._sqlstate import LOCK_NOT_AVAILABLE, SERIALIZATION_FAILURE, sqlstate_of
from sqla_queue.admin import check_job_ids
from sqla_queue.conversation import Flow, Wait, drive, drive_async
from sqla_queue.errors import (
    CancelBlockedError,
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    ResultTimeoutError,
)
from sqla_queue.logic.times import check_delay
from sqla_queue.models.tables import HistoryLayout, JobStatus, QueueTables
from sqla_queue.statements.lifecycle import (
    UNLISTEN_ALL,
    CancelOutcome,
    JobParams,
    await_statement,
    cancel_lock_timeout_sql,
    job_outcome_statement,
    listen_sql,
)
from sqla_queue.workflows.admin import cancel_jobs_flow
from sqla_queue.workflows.advance import ReleaseStatements

__all__ = [
    "CancelOutcome",
    "ResultSource",
    "cancel",
    "check_timeout",
    "is_async_source",
    "result_flow",
    "wait_async",
    "wait_for",
    "wait_sync",
]

#: What ``queue.result`` can open its own connection from.
ResultSource = (
    Engine
    | Connection
    | Session
    | sessionmaker[Any]
    | AsyncEngine
    | AsyncConnection
    | AsyncSession
    | async_sessionmaker[Any]
)

#: Longest wait between two reads of a job when notifications arrive (a missed one, say
#: across a reconnect, costs at most this), and the poll ceiling without them.
LISTEN_POLL = 5.0
POLL_FIRST, POLL_MAX = 0.05, 1.0


def cancel(source: Any, tables: QueueTables, job_ids: Iterable[int], *, notify: bool = True) -> Any:
    """Cancel ``job_ids`` in a short transaction of its own; ``{id: CancelOutcome value}``.

    ``source`` is what :func:`wait_for` takes (a connection of its engine is opened, with
    its execution options, so a tenant's ``schema_translate_map`` cancels in the tenant's
    schema; a coroutine for the async kinds). Ids are checked before anything runs (whole
    numbers that fit ``bigint``).

    The cancel commits at once, on its own connection, rather than in the caller's
    transaction: it locks the executions it changes, and a worker must never wait for an
    application's transaction (a running job's heartbeat and completion, or the promotion
    of a key's next job, would wait for that lock until the caller committed). It does wait
    for a transaction that has locked or changed those jobs' rows itself (a claim, a
    completion, an app's ``UPDATE``), but at most :data:`CANCEL_LOCK_TIMEOUT`: called from
    inside such a transaction, it would otherwise wait for its own caller forever. It then
    raises :class:`~sqla_queue.CancelBlockedError` and changes nothing. An enqueue behind a
    job of the same ``queue_id`` locks nothing it needs.
    """
    ids = check_job_ids(job_ids)
    if is_async_source(source):
        return _cancel_async(source, tables, ids, notify)
    if not ids:
        check_source(source, "queue.cancel")  # a wrong source raises, ids or not
        return {}
    try:
        with own_connection(source, "queue.cancel") as connection, connection.begin():
            connection.exec_driver_sql(cancel_lock_timeout_sql(CANCEL_LOCK_TIMEOUT))
            return drive(connection, _cancel_flow(tables_for(tables, connection), ids, notify))
    except DBAPIError as exc:
        raise _blocked(exc, ids) from exc


async def _cancel_async(
    source: Any, tables: QueueTables, ids: list[int], notify: bool
) -> dict[int, str]:
    if not ids:
        await check_async_source(source, "queue.cancel")
        return {}
    try:
        async with (
            own_async_connection(source, "queue.cancel") as connection,
            connection.begin(),
        ):
            await connection.exec_driver_sql(cancel_lock_timeout_sql(CANCEL_LOCK_TIMEOUT))
            flow = _cancel_flow(tables_for(tables, connection), ids, notify)
            return await drive_async(connection, flow)
    except DBAPIError as exc:
        raise _blocked(exc, ids) from exc


def _cancel_flow(tables: QueueTables, ids: list[int], notify: bool) -> Flow[dict[int, str]]:
    """The cancel's statements: the jobs, the workflow nodes waiting for their parents, and
    the release of the workflows they belong to (see
    :func:`~sqla_queue.workflows.admin.cancel_jobs_flow`)."""
    return cancel_jobs_flow(tables, ReleaseStatements(tables, notify=notify), ids)


#: Longest wait, in seconds, of a cancel for a row lock (workers hold theirs for
#: milliseconds; only a transaction of the caller's own would hold one for good).
CANCEL_LOCK_TIMEOUT = 10


def _blocked(exc: DBAPIError, ids: list[int]) -> Exception:
    if sqlstate_of(exc) != LOCK_NOT_AVAILABLE:
        return exc
    return CancelBlockedError(
        f"cancel of jobs {ids} waited {CANCEL_LOCK_TIMEOUT:g}s for a row lock and gave up; "
        "nothing was cancelled. A transaction holds those jobs' rows: if it is the caller's "
        "own (it claimed, completed or updated them), commit it first."
    )


def check_timeout(timeout: object) -> float | None:
    """``timeout`` in seconds (``None``: wait as long as it takes)."""
    if timeout is None:
        return None
    return check_delay("timeout", timeout)


def result_flow(
    tables: QueueTables,
    job_id: int,
    *,
    timeout: float | None,
    listening: bool,
    clock: Callable[[], float] = time.monotonic,
) -> Flow[Any]:
    """Wait for job ``job_id`` to finish; its result, or the exception that says why not.

    Without I/O: yields statements (and is sent their rows) and
    :class:`~sqla_queue.conversation.Wait` steps, after each of which it reads the job
    again, whether a notification ended the wait or its time ran out. ``listening`` says
    whether the driver LISTENs on the queue's ``finished_channel``; without it, the reads
    back off from 50 ms to a second.
    """
    deadline = None if timeout is None else clock() + timeout
    # How a timeout reads in its error ("30 s"); without a timeout there is no such error.
    waited = "" if timeout is None else format_duration(timeout)
    params: JobParams = {"job_id": job_id}
    yield from _tolerant(await_statement(tables), params)
    poll = LISTEN_POLL if listening else POLL_FIRST
    while True:
        rows = yield from _tolerant(job_outcome_statement(tables), params)
        if not rows:
            raise JobNotFoundError(_not_found(tables, job_id), job_id=job_id)
        row = rows[0]
        if row.status != JobStatus.QUEUED:
            return _settled(job_id, row)
        wait = poll
        if deadline is not None:
            left = deadline - clock()
            if left <= 0:
                state = "running" if row.state == "running" else "queued"
                raise ResultTimeoutError(
                    f"job {job_id} did not finish within {waited}; it is still {state}",
                    job_id=job_id,
                )
            wait = min(wait, left)
        yield Wait(wait)
        if not listening:
            poll = min(poll * 2, POLL_MAX)


def _not_found(tables: QueueTables, job_id: int) -> str:
    """Why job ``job_id`` has no row, as far as the queue's history layout can tell."""
    reasons = "never enqueued, pruned, or enqueued in a transaction that has not committed yet"
    if tables.history == HistoryLayout.NONE:
        # Only a job awaited before it finished keeps its row: a later waiter comes too late.
        reasons = (
            "it succeeded before result() was called and, as the queue keeps no history "
            "(history='none'), its row was deleted; or it was " + reasons
        )
    return (
        f"no job has id {job_id}: {reasons} (result() reads on its own connection, so "
        "commit the enqueue first)"
    )


def _settled(job_id: int, row: Any) -> Any:
    if row.status == JobStatus.SUCCEEDED:
        return row.result
    if row.status == JobStatus.CANCELLED:
        raise JobCancelledError(f"job {job_id} was cancelled", job_id=job_id)
    errors = list(row.errors or [])
    last = errors[-1] if errors else None
    what = (
        f"{last.get('type', 'error')}: {last.get('message', '')}" if last else "no error recorded"
    )
    raise JobFailedError(f"job {job_id} failed: {what}", job_id=job_id, error=last, errors=errors)


def is_async_source(source: object) -> bool:
    """Whether ``source`` is one of the async kinds (the call returns a coroutine)."""
    return isinstance(source, AsyncEngine | AsyncConnection | AsyncSession | async_sessionmaker)


def _tolerant(statement: Executable, params: Mapping[str, Any]) -> Flow[Sequence[Any]]:
    """The rows of one statement of :func:`result_flow`; none if it failed because the
    job's row moved meanwhile (see :func:`_moved_meanwhile`), any other error raised."""
    try:
        rows = yield statement, dict(params)
    except DBAPIError as exc:
        return _moved_meanwhile(exc)
    return rows


def _moved_meanwhile(exc: DBAPIError) -> list[Any]:
    """No rows, for the mark of an awaited job whose row moved to another partition.

    On a partitioned history (:mod:`sqla_queue.history`) the completion that finishes a
    job moves its row; an UPDATE that waited for that row then fails with a serialization
    error instead of finding it finished. The mark is moot then, and the next read of the
    job sees how it ended. Every other step of the flow reads (it never fails so), and any
    other error is raised as it is.
    """
    if sqlstate_of(exc) != SERIALIZATION_FAILURE:
        raise exc
    return []


def wait_sync(source: Any, tables: QueueTables, job_id: int, timeout: float | None) -> Any:
    """Drive :func:`result_flow` on a connection of ``source``'s engine, in AUTOCOMMIT.

    The connection carries ``source``'s execution options (see
    :func:`~sqla_queue._binds.own_connection`): a tenant's ``schema_translate_map`` reads
    the tenant's job, and LISTENs on the tenant's channel.
    """
    with own_connection(source, "queue.result") as opened:
        connection = opened.execution_options(isolation_level="AUTOCOMMIT")
        tables = tables_for(tables, connection)
        driver = connection.connection.driver_connection
        listening = hasattr(driver, "notifies")
        if listening:
            connection.exec_driver_sql(listen_sql(tables))
        try:
            flow = result_flow(tables, job_id, timeout=timeout, listening=listening)
            return drive(
                connection,
                flow,
                wait=functools.partial(_notified_sync, driver, job_id, listening=listening),
            )
        finally:
            if listening:
                connection.exec_driver_sql(UNLISTEN_ALL)


def _notified_sync(driver: Any, job_id: int, seconds: float, *, listening: bool) -> bool:
    """Wait up to ``seconds`` for a notification of ``job_id`` (or just sleep, without
    LISTEN); whether one came."""
    if not listening:
        time.sleep(seconds)
        return False
    deadline = time.monotonic() + seconds
    wanted = str(job_id)
    while (left := deadline - time.monotonic()) > 0:
        for note in driver.notifies(timeout=left, stop_after=1):
            if note.payload == wanted:
                return True
    return False


async def wait_async(source: Any, tables: QueueTables, job_id: int, timeout: float | None) -> Any:
    """:func:`wait_sync` for the async kinds of ``source``."""
    async with own_async_connection(source, "queue.result") as opened:
        connection = await opened.execution_options(isolation_level="AUTOCOMMIT")
        tables = tables_for(tables, connection)
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        listening = hasattr(driver, "notifies")
        if listening:
            await connection.exec_driver_sql(listen_sql(tables))
        try:
            flow = result_flow(tables, job_id, timeout=timeout, listening=listening)
            return await drive_async(
                connection,
                flow,
                wait=functools.partial(_notified_async, driver, job_id, listening=listening),
            )
        finally:
            if listening:
                await connection.exec_driver_sql(UNLISTEN_ALL)


async def _notified_async(driver: Any, job_id: int, seconds: float, *, listening: bool) -> bool:
    """:func:`_notified_sync`, awaiting."""
    if not listening:
        await asyncio.sleep(seconds)
        return False
    deadline = time.monotonic() + seconds
    wanted = str(job_id)
    while (left := deadline - time.monotonic()) > 0:
        async for note in driver.notifies(timeout=left, stop_after=1):
            if note.payload == wanted:
                return True
    return False


def wait_for(source: Any, tables: QueueTables, job_id: int, timeout: float | None) -> Any:
    """:func:`wait_sync` or (for async sources) a coroutine of :func:`wait_async`."""
    if is_async_source(source):
        return wait_async(source, tables, job_id, timeout)
    return wait_sync(source, tables, job_id, timeout)
