"""Heartbeat and reclaim: how a worker proves it is alive, and how others notice it is not."""

from __future__ import annotations

import uuid
from typing import Any, TypedDict

from sqlalchemy import (
    BigInteger,
    Integer,
    Uuid,
    all_,
    bindparam,
    func,
    null,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import ReturningUpdate

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import PENDING, RUNNING, seconds, still_running

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


def heartbeat_statement(tables: QueueTables) -> ReturningUpdate[int]:
    """Refresh ``alive_at`` of the executions this worker is actually running.

    Parameters: ``worker``, ``ids`` (bigint[]) and ``attempts`` (int[]), pairwise. The
    (id, attempt) fence means a heartbeat never revives an execution that was reclaimed and
    claimed again. Returns the ids that are still held; the rest were lost.
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
        .returning(ex.c.id)
    )


def reclaim_statement(tables: QueueTables) -> ReturningUpdate[*tuple[Any, ...]]:
    """Return running executions whose heartbeat is older than their lease to pending.

    Parameter: ``held`` (bigint[]), the executions the calling worker runs right now: it
    never reclaims those, even if its own heartbeat is late. Its other rows are fair game:
    a claim whose reply was lost to a dropped connection leaves rows nobody runs. The
    attempt stays as it is: the next claim counts a new one. ``reclaims`` counts how often
    the job was lost.

    The walk is ``running_ix``: running rows only, as many as the workers' concurrency,
    never the backlog. Rows are locked with SKIP LOCKED, so no reclaimer ever waits, and
    no lock order is needed: none of them can deadlock. The lock is NO KEY UPDATE, which an
    enqueue holding a running row as its key's predecessor (KEY SHARE) does not block.
    """
    ex = tables.executions
    stale_cte = (
        select(ex.c.id)
        .where(
            ex.c.state == RUNNING,
            ex.c.alive_at < func.now() - seconds(ex.c.lease_seconds),
            ex.c.id != all_(bindparam("held", type_=ARRAY(BigInteger))),
        )
        .with_for_update(skip_locked=True, key_share=True)
        .cte("stale")
    )
    return (
        update(ex)
        .where(ex.c.id == stale_cte.c.id)
        .values(state=PENDING, worker_id=null(), alive_at=null(), reclaims=ex.c.reclaims + 1)
        .returning(ex.c.id, ex.c.task, ex.c.attempt, ex.c.reclaims)
    )
