"""Heartbeat and reclaim: how a worker proves it is alive, and how others notice it is not."""

from __future__ import annotations

import uuid
from typing import Any, TypedDict

from sqlalchemy import (
    BigInteger,
    CompoundSelect,
    Integer,
    Uuid,
    all_,
    bindparam,
    delete,
    false,
    func,
    null,
    select,
    true,
    tuple_,
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
    RUNNING,
    notify_waiters,
    seconds,
    still_running,
)

__all__ = ["HeartbeatParams", "ReclaimParams", "heartbeat_statement", "reclaim_statement"]


class HeartbeatParams(TypedDict):
    """Parameters of the heartbeat: the (id, attempt) pairs held, as two arrays."""

    worker: uuid.UUID
    ids: list[int]
    attempts: list[int]


class ReclaimParams(TypedDict):
    """Parameters of the reclaim sweep."""

    #: Executions the sweeping worker runs itself: never reclaimed by it.
    held: list[int]


def heartbeat_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Refresh ``alive_at`` of the executions this worker is actually running.

    Parameters: ``worker``, ``ids`` (bigint[]) and ``attempts`` (int[]), pairwise. The
    (id, attempt) fence means a heartbeat never revives an execution that was reclaimed and
    claimed again. Returns ``(id, cancel_requested)`` of those still held; the rest were
    lost. The flag is how a cancel reaches the worker: no statement of its own.
    """
    ex = tables.executions
    held = select(
        func.unnest(bindparam("ids", type_=ARRAY(BigInteger))),
        func.unnest(bindparam("attempts", type_=ARRAY(Integer))),
    )
    return (
        update(ex)
        .where(
            ex.c.worker_id == bindparam("worker", type_=Uuid),
            still_running(ex.c.state),
            tuple_(ex.c.id, ex.c.attempt).in_(held),
        )
        .values(alive_at=func.now())
        .returning(ex.c.id, ex.c.cancel_requested)
    )


def reclaim_statement(tables: QueueTables) -> CompoundSelect[Any]:
    """Return running executions whose heartbeat is older than their lease to pending.

    Parameter: ``held`` (bigint[]), the executions the calling worker runs right now: it
    never reclaims those, even if its own heartbeat is late. Its other rows are fair game:
    a claim whose reply was lost to a dropped connection leaves rows nobody runs. The
    attempt stays as it is: the next claim counts a new one. ``reclaims`` counts how often
    the job was lost. A lost execution whose job was asked to cancel is not run again: its
    job becomes ``cancelled`` (a keyed one is parked ``done`` for the key's promotion).
    Returns ``(id, task, attempt, reclaims, ended_node)`` of the executions put back to
    pending (``ended_node`` false), and ``(id, NULL, NULL, NULL, true)`` for each workflow
    node it cancelled, whose dependents the caller advances before it commits.

    The walk is ``running_ix``: running rows only, as many as the workers' concurrency,
    never the backlog. Rows are locked with SKIP LOCKED, so no reclaimer ever waits, and
    no lock order is needed: none of them can deadlock. The lock is NO KEY UPDATE, which an
    enqueue holding a running row as its key's predecessor (KEY SHARE) does not block.
    """
    ex = tables.executions
    jobs = tables.jobs
    stale = (
        select(ex.c.id, ex.c.cancel_requested, ex.c.queue_id)
        .where(
            ex.c.state == RUNNING,
            ex.c.alive_at < func.now() - seconds(ex.c.lease_seconds),
            ex.c.id != all_(bindparam("held", type_=ARRAY(BigInteger))),
        )
        .with_for_update(skip_locked=True, key_share=True)
        .cte("stale")
    )
    requeued = (
        update(ex)
        .where(ex.c.id == stale.c.id, stale.c.cancel_requested.is_(False))
        .values(state=PENDING, worker_id=null(), alive_at=null(), reclaims=ex.c.reclaims + 1)
        .returning(ex.c.id, ex.c.task, ex.c.attempt, ex.c.reclaims)
        .cte("requeued")
    )
    dropped = (
        delete(ex)
        .where(ex.c.id == stale.c.id, stale.c.cancel_requested, stale.c.queue_id.is_(None))
        .returning(ex.c.id, ex.c.attempt, ex.c.workflow)
        .cte("dropped")
    )
    parked = (
        update(ex)
        .where(ex.c.id == stale.c.id, stale.c.cancel_requested, stale.c.queue_id.is_not(None))
        .values(state=DONE, worker_id=null(), alive_at=null(), slot=null())
        .returning(ex.c.id, ex.c.attempt, ex.c.workflow)
        .cte("parked")
    )
    removed = union_all(
        select(dropped.c.id, dropped.c.attempt, dropped.c.workflow),
        select(parked.c.id, parked.c.attempt, parked.c.workflow),
    ).subquery("removed")
    cancelled = (
        update(jobs)
        .where(jobs.c.id == removed.c.id)
        # The lost attempt counts, as it does for a lost job that runs again.
        .values(status=CANCELLED, finished_at=func.now(), attempts=removed.c.attempt)
        # Someone waiting for the job's result (queue.result) is told, as by a completion.
        .returning(
            jobs.c.id,
            notify_waiters(tables),
        )
        .cte("cancelled")
    )
    # "cancelled" is not read; PostgreSQL runs data-modifying CTEs regardless, and the
    # false branch keeps SQLAlchemy from dropping the unreferenced CTE.
    # A cancelled workflow node comes back as a row of its own (no task): its dependents
    # are released in this transaction (sqla_queue.worker.decider.nodes).
    return union_all(
        select(
            requeued.c.id,
            requeued.c.task,
            requeued.c.attempt,
            requeued.c.reclaims,
            false().label("ended_node"),
        ),
        select(cancelled.c.id, null(), null(), null(), true())
        .select_from(cancelled.join(removed, removed.c.id == cancelled.c.id))
        .where(removed.c.workflow),
    )
