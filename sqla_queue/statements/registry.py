"""The workers table: each live worker's row, refreshed by its beats (schema version 5).

A worker's registry service (:class:`sqla_queue.worker.registry.WorkerRegistry`) writes
its own row with :func:`beat_worker_statement`, deletes the rows of workers that stopped
beating with :func:`expire_workers_statement`, and deletes its own row on a graceful stop
with :func:`unregister_worker_statement`. ``sqla-queue status`` and the dashboards read
the rows (:mod:`sqla_queue.statements.status`). The table holds one row per live worker,
so none of these statements needs an index beyond the primary key. Each builder has a
``TypedDict`` next to it naming its parameters.
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from sqlalchemy import BigInteger, Delete, Double, Integer, Text, Uuid, bindparam, delete, func
from sqlalchemy.dialects.postgresql import ARRAY, Insert, insert

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import seconds

__all__ = [
    "BeatWorkerParams",
    "ExpireWorkersParams",
    "UnregisterWorkerParams",
    "beat_worker_statement",
    "expire_workers_statement",
    "unregister_worker_statement",
]


class BeatWorkerParams(TypedDict):
    """Parameters of :func:`beat_worker_statement`."""

    worker_id: uuid.UUID
    hostname: str
    pid: int
    #: The tasks the worker claims (``text[]``).
    tasks: list[str]
    #: Its handler seats.
    concurrency: int
    #: Handlers running now.
    running: int
    #: Jobs it finished since it started.
    finished: int


class ExpireWorkersParams(TypedDict):
    """Parameters of :func:`expire_workers_statement`."""

    #: The worker that sweeps: its own row is never expired by itself.
    worker_id: uuid.UUID
    #: Seconds without a beat after which a row is deleted.
    expire_after: float


class UnregisterWorkerParams(TypedDict):
    """Parameters of :func:`unregister_worker_statement`."""

    worker_id: uuid.UUID


def beat_worker_statement(tables: QueueTables) -> Insert:
    """Insert the worker's row, or refresh it: ``seen_at = now()`` and its counts.

    The first beat registers the worker (``started_at`` is that beat's ``now()``); a
    later one finds the row and updates it. An upsert rather than an update, so a worker
    whose row was expired while it could not reach the database (another worker swept it)
    comes back with its next beat. Parameters: :class:`BeatWorkerParams`.
    """
    w = tables.workers
    stmt = insert(w).values(
        worker_id=bindparam("worker_id", type_=Uuid),
        hostname=bindparam("hostname", type_=Text),
        pid=bindparam("pid", type_=Integer),
        tasks=bindparam("tasks", type_=ARRAY(Text)),
        concurrency=bindparam("concurrency", type_=Integer),
        running=bindparam("running", type_=Integer),
        finished=bindparam("finished", type_=BigInteger),
        started_at=func.now(),
        seen_at=func.now(),
    )
    return stmt.on_conflict_do_update(
        index_elements=[w.c.worker_id],
        set_={
            "running": stmt.excluded.running,
            "finished": stmt.excluded.finished,
            "tasks": stmt.excluded.tasks,
            "concurrency": stmt.excluded.concurrency,
            "seen_at": func.now(),
        },
    )


def expire_workers_statement(tables: QueueTables) -> Delete:
    """Delete the rows of other workers not seen for ``expire_after`` seconds.

    A worker killed with SIGKILL never deletes its own row; the beats of the live ones
    do. Parameters: :class:`ExpireWorkersParams`.
    """
    w = tables.workers
    return delete(w).where(
        w.c.seen_at < func.now() - seconds(bindparam("expire_after", type_=Double)),
        w.c.worker_id != bindparam("worker_id", type_=Uuid),
    )


def unregister_worker_statement(tables: QueueTables) -> Delete:
    """Delete the worker's own row (a graceful stop). Parameters:
    :class:`UnregisterWorkerParams`."""
    w = tables.workers
    return delete(w).where(w.c.worker_id == bindparam("worker_id", type_=Uuid))
