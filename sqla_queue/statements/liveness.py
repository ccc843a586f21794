"""Heartbeat and reclaim: how a worker proves it is alive, and how others notice it is not.

A worker is alive while its own row in the workers table is fresh: the heartbeat stamps
``seen_at`` there with the time of the write (``clock_timestamp()``, not the start of a
transaction that may have waited). No statement the library runs in a caller's transaction
ever locks that row, so no application transaction can hold a live worker's beat back.

The heartbeat also stamps ``alive_at`` on the executions it can lock at once (``SKIP
LOCKED``: a row a caller holds is skipped, never waited for) and reads, without a lock, which
of its executions are still its own and which were asked to cancel. A reclaim takes an
execution only when both clocks are stale: its own ``alive_at`` and its worker's row (or the
row is gone). A worker whose rows a caller locks for minutes therefore keeps its jobs.
"""

from __future__ import annotations

import uuid
from typing import Any, TypedDict

from sqlalchemy import (
    BigInteger,
    CompoundSelect,
    Integer,
    Select,
    Text,
    Uuid,
    all_,
    bindparam,
    delete,
    exists,
    false,
    func,
    null,
    or_,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, insert

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
    """Parameters of the heartbeat: the worker (what its row holds, for the first beat,
    which inserts it) and the (id, attempt) pairs held, as two arrays."""

    worker: uuid.UUID
    hostname: str
    pid: int
    #: The tasks the worker claims (``text[]``).
    tasks: list[str]
    #: Its handler seats.
    concurrency: int
    ids: list[int]
    attempts: list[int]


class _ReclaimHeld(TypedDict):
    #: Executions the sweeping worker runs itself: never reclaimed by it.
    held: list[int]


class ReclaimParams(_ReclaimHeld, total=False):
    """Parameters of the reclaim sweep (``worker`` may be left out)."""

    #: The sweeping worker: its own running rows that it does not hold (a claim whose
    #: reply was lost) are judged by their ``alive_at`` alone, since its own row is fresh.
    worker: uuid.UUID | None


def heartbeat_statement(tables: QueueTables) -> Select[Any]:
    """Prove the worker alive, and learn which of its executions are still its own.

    Parameters: :class:`HeartbeatParams`. One statement, which never waits for a lock:

    * the worker's row gets ``seen_at = clock_timestamp()`` (inserted by the first beat,
      with ``hostname``, ``pid``, ``tasks`` and ``concurrency``): this is what keeps every
      execution of the worker from being reclaimed, whatever else holds them;
    * each held execution that no one else has locked gets ``alive_at`` stamped the same
      way (``SKIP LOCKED``: one a caller's transaction holds is left as it is);
    * it returns ``(id, cancel_requested)`` of the held executions still running under
      this worker and attempt, read without a lock. The (worker, id, attempt) fence means a
      beat never revives an execution that was reclaimed and claimed again; the ids it
      does not return were lost. The flag is how a cancel reaches the worker.
    """
    ex = tables.executions
    w = tables.workers
    worker = bindparam("worker", type_=Uuid)
    held = select(
        func.unnest(bindparam("ids", type_=ARRAY(BigInteger))),
        func.unnest(bindparam("attempts", type_=ARRAY(Integer))),
    )
    fence = (
        ex.c.worker_id == worker,
        still_running(ex.c.state),
        tuple_(ex.c.id, ex.c.attempt).in_(held),
    )
    row = insert(w).values(
        worker_id=worker,
        hostname=bindparam("hostname", type_=Text),
        pid=bindparam("pid", type_=Integer),
        tasks=bindparam("tasks", type_=ARRAY(Text)),
        concurrency=bindparam("concurrency", type_=Integer),
        started_at=func.now(),
        seen_at=func.clock_timestamp(),
    )
    beat = (
        row.on_conflict_do_update(
            index_elements=[w.c.worker_id], set_={"seen_at": func.clock_timestamp()}
        )
        .returning(w.c.worker_id)
        .cte("beat")
    )
    # NO KEY UPDATE, as the stamp's UPDATE takes; SKIP LOCKED: a locked row waits for
    # nobody's commit, the worker's row above keeps it from being reclaimed.
    free = (
        select(ex.c.id).where(*fence).with_for_update(of=ex, key_share=True, skip_locked=True)
    ).cte("free")
    stamped = (
        update(ex)
        .where(ex.c.id == free.c.id)
        .values(alive_at=func.clock_timestamp())
        .returning(ex.c.id)
        .cte("stamped")
    )
    # PostgreSQL runs every data-modifying CTE whether or not it is read; add_cte keeps
    # SQLAlchemy from dropping the two that nothing selects from.
    return select(ex.c.id, ex.c.cancel_requested).where(*fence).add_cte(beat, stamped)


def reclaim_statement(tables: QueueTables) -> CompoundSelect[Any]:
    """Return running executions whose heartbeat is older than their lease to pending.

    Parameters: :class:`ReclaimParams`. ``held`` (bigint[]) are the executions the calling
    worker runs right now: it never reclaims those, even if its own heartbeat is late. Its
    other rows (``worker``) are fair game once their ``alive_at`` is stale, its own fresh
    row notwithstanding: a claim whose reply was lost to a dropped connection leaves rows
    nobody runs, and no beat stamps them. The
    attempt stays as it is: the next claim counts a new one. ``reclaims`` counts how often
    the job was lost. A lost execution whose job was asked to cancel is not run again: its
    job becomes ``cancelled`` (a keyed one is parked ``done`` for the key's promotion).
    Returns ``(id, task, attempt, reclaims, ended_node)`` of the executions put back to
    pending (``ended_node`` false), and ``(id, NULL, NULL, NULL, true)`` for each workflow
    node it cancelled, whose dependents the caller advances before it commits.

    An execution is stale only when both of its clocks are: its own ``alive_at`` (which a
    beat skips while a caller locks the row) and its worker's ``seen_at`` in the workers
    table (which no caller's transaction can hold back), or the worker has no row (it was
    expired, or it never beat). Each is compared with the execution's lease.

    The walk is ``running_ix``: running rows only, as many as the workers' concurrency,
    never the backlog. Rows are locked with SKIP LOCKED, so no reclaimer ever waits, and
    no lock order is needed: none of them can deadlock. The lock is NO KEY UPDATE, which an
    enqueue holding a running row as its key's predecessor (KEY SHARE) does not block.
    """
    ex = tables.executions
    jobs = tables.jobs
    w = tables.workers
    lease_start = func.now() - seconds(ex.c.lease_seconds)
    worker_alive = exists().where(w.c.worker_id == ex.c.worker_id, w.c.seen_at >= lease_start)
    # The sweeper's own rows that it does not hold: nobody runs them, whatever its row says.
    own_orphan = ex.c.worker_id == bindparam("worker", None, type_=Uuid)
    stale = (
        select(ex.c.id, ex.c.cancel_requested, ex.c.queue_id)
        .where(
            ex.c.state == RUNNING,
            ex.c.alive_at < lease_start,
            or_(~worker_alive, own_orphan),
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
