"""Cancelling jobs, and reading (or waiting for) a job's outcome.

A cancel is one statement. It locks each named execution first (``FOR NO KEY UPDATE``): a
claim that holds the row is waited for and then seen running, and a claim that comes after
the lock skips the row (``SKIP LOCKED``). An enqueue in flight that holds a keyed execution
as its key's predecessor (``KEY SHARE``) is not waited for, as for a claim or a completion:
``queue.cancel`` runs on a connection of its own, and the enqueue may be the caller's own
open transaction, which would otherwise wait for the cancel while the cancel waits for it.

A queued execution is removed and its job becomes ``cancelled``; a running one gets
``cancel_requested``, which its worker's next heartbeat returns, and which the completion
reads in the same row lock as every other fenced transition: a cancel racing a completion
ends in exactly one final state.

``queue.result`` LISTENs on the queue's ``finished_channel`` (:func:`listen_sql`) while it
waits; a completion (or a cancel) of an awaited job notifies there.
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import (
    BigInteger,
    Select,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal_column,
    null,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import ReturningUpdate

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import (
    CANCELLED,
    DONE,
    PENDING,
    QUEUED,
    RUNNING,
    SUSPENDED,
    WAITING,
    notify_waiters,
)

__all__ = [
    "UNLISTEN_ALL",
    "CancelOutcome",
    "CancelParams",
    "JobParams",
    "await_statement",
    "cancel_lock_timeout_sql",
    "cancel_statement",
    "job_outcome_statement",
    "listen_sql",
]

#: Driver SQL that ends every LISTEN of the connection, before it goes back to its pool.
UNLISTEN_ALL = "UNLISTEN *"


class CancelOutcome:
    """What a cancel did to each job it named."""

    #: It was queued; it is cancelled and will not run.
    CANCELLED = "cancelled"
    #: It was running; its worker is asked to stop it (see ``JobContext.cancel_requested``).
    REQUESTED = "requested"
    #: It had already finished (succeeded, failed or cancelled): nothing changed.
    FINISHED = "finished"
    #: No job has this id.
    NOT_FOUND = "not_found"


class CancelParams(TypedDict):
    """Parameters of :func:`cancel_statement`."""

    ids: list[int]


class JobParams(TypedDict):
    """Parameters of :func:`await_statement` and :func:`job_outcome_statement`."""

    job_id: int


def cancel_statement(tables: QueueTables) -> Select[Any]:
    """Cancel the queued jobs of ``ids`` and ask the running ones to stop.

    Returns ``(id, outcome)`` for each id asked (:class:`CancelOutcome` values). A keyed
    (``queue_id``) execution is parked as ``done`` rather than deleted, as a completion
    parks it: workers delete it and promote the key's next job. Its capacity seat, if
    any, is given up at once.
    """
    ex = tables.executions
    jobs = tables.jobs
    asked = (
        select(func.unnest(bindparam("ids", type_=ARRAY(BigInteger))).label("id"))
        .distinct()
        .cte("asked")
    )
    target = (
        select(ex.c.id, ex.c.state, ex.c.queue_id)
        .where(ex.c.id.in_(select(asked.c.id)))
        .order_by(ex.c.id)
        # NO KEY UPDATE: see the module's docstring. Only an unkeyed queued row is deleted
        # (a stronger lock, taken by the DELETE), and no enqueue ever holds such a row.
        .with_for_update(of=ex, key_share=True)
        .cte("target")
    )
    # A suspended durable job is held by no worker either: it goes at once.
    queued = target.c.state.in_([PENDING, WAITING, SUSPENDED])
    dropped = (
        delete(ex)
        .where(ex.c.id == target.c.id, queued, target.c.queue_id.is_(None))
        .returning(ex.c.id)
        .cte("dropped")
    )
    parked = (
        update(ex)
        .where(ex.c.id == target.c.id, queued, target.c.queue_id.is_not(None))
        .values(state=DONE, worker_id=null(), alive_at=null(), slot=null())
        .returning(ex.c.id)
        .cte("parked")
    )
    flagged = (
        update(ex)
        .where(ex.c.id == target.c.id, target.c.state == RUNNING)
        .values(cancel_requested=true())
        .returning(ex.c.id)
        .cte("flagged")
    )
    removed = union_all(select(dropped.c.id), select(parked.c.id)).subquery("removed")
    cancelled = (
        update(jobs)
        .where(jobs.c.id == removed.c.id, jobs.c.status == QUEUED)
        .values(status=CANCELLED, finished_at=func.now())
        # A job someone waits for (queue.result) tells them at once, as a completion does.
        .returning(
            jobs.c.id,
            notify_waiters(tables),
        )
        .cte("cancelled")
    )
    outcome = case(
        (cancelled.c.id.is_not(None), literal_column(f"'{CancelOutcome.CANCELLED}'")),
        (flagged.c.id.is_not(None), literal_column(f"'{CancelOutcome.REQUESTED}'")),
        (jobs.c.id.is_(None), literal_column(f"'{CancelOutcome.NOT_FOUND}'")),
        else_=literal_column(f"'{CancelOutcome.FINISHED}'"),
    )
    return (
        select(asked.c.id, outcome.label("outcome"))
        .select_from(
            asked.outerjoin(cancelled, cancelled.c.id == asked.c.id)
            .outerjoin(flagged, flagged.c.id == asked.c.id)
            .outerjoin(jobs, jobs.c.id == asked.c.id)
        )
        .order_by(asked.c.id)
    )


def await_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Mark a queued job as awaited, so that its completion sends a NOTIFY.

    Parameters: :class:`JobParams`. Returns the id if the job is still queued (and was
    not marked yet); nothing once it has finished. Run it after ``LISTEN``, and read the
    job after it: a completion either comes after this mark (and notifies) or before the
    read (which sees it).
    """
    jobs = tables.jobs
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("job_id", type_=BigInteger),
            jobs.c.status == QUEUED,
            jobs.c.awaited.is_(False),
        )
        .values(awaited=true())
        .returning(jobs.c.id)
    )


def job_outcome_statement(tables: QueueTables) -> Select[Any]:
    """A job's status, result and errors, with its execution's state when it has one.

    Parameters: :class:`JobParams`. No row when the job does not exist.
    """
    jobs = tables.jobs
    ex = tables.executions
    return (
        select(
            jobs.c.id,
            jobs.c.status,
            jobs.c.result,
            jobs.c.errors,
            ex.c.state,
            ex.c.cancel_requested,
        )
        .select_from(jobs.outerjoin(ex, and_(ex.c.id == jobs.c.id)))
        .where(jobs.c.id == bindparam("job_id", type_=BigInteger))
    )


def cancel_lock_timeout_sql(seconds: float) -> str:
    """Driver SQL that bounds a cancel's wait for a row lock to ``seconds``, in its
    transaction only (``SET LOCAL``)."""
    return f"SET LOCAL lock_timeout = '{float(seconds)}s'"


def listen_sql(tables: QueueTables) -> str:
    """Driver SQL to LISTEN on ``tables``' ``finished_channel``, quoted as an identifier."""
    channel = tables.finished_channel.replace('"', '""')
    return f'LISTEN "{channel}"'
