"""Enqueue: one statement that writes the job and its execution (and wakes workers).

Both builders read their rows from one JSON parameter through ``jsonb_to_recordset``, so a
single job and a batch of ten thousand compile to the same cached statement, and a batch
costs one round trip.
"""

from __future__ import annotations

from sqlalchemy import (
    DateTime,
    Double,
    Integer,
    Select,
    Text,
    bindparam,
    cast,
    column,
    func,
    insert,
    literal,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import PENDING, seconds

__all__ = ["ENQUEUE_ROW_FIELDS", "enqueue_statement"]

#: Keys of each JSON object in the ``rows`` parameter.
ENQUEUE_ROW_FIELDS = (
    "task",
    "payload",
    "priority",
    "queue_id",
    "max_attempts",
    "run_at",
    "delay",
    "seq",
)


def enqueue_statement(tables: QueueTables, *, notify: bool) -> Select[int]:
    """Build the enqueue statement.

    Parameter ``rows``: JSON text, a list of objects with :data:`ENQUEUE_ROW_FIELDS`.
    ``run_at`` (an ISO timestamp) wins over ``delay`` (seconds on the database clock);
    ``seq`` numbers the rows so ids follow the caller's order.
    Returns the new job ids in the order of ``rows``.

    With ``notify``, the statement also calls ``pg_notify`` once. PostgreSQL folds identical
    notifications of one transaction into one, so a transaction that enqueues many times
    still wakes the workers once, at commit, and a rolled-back one never does.
    """
    jobs = tables.jobs
    ex = tables.executions
    source = (
        func.jsonb_to_recordset(cast(bindparam("rows", type_=Text), JSONB))
        .table_valued(
            column("task", Text),
            column("payload", JSONB),
            column("priority", Integer),
            column("queue_id", Text),
            column("max_attempts", Integer),
            column("run_at", DateTime(timezone=True)),
            column("delay", Double),
            column("seq", Integer),
        )
        .render_derived(name="r", with_types=True)
    )
    execute_at = func.coalesce(
        source.c.run_at,
        func.now() + seconds(func.coalesce(source.c.delay, 0.0)),
    )
    # ORDER BY seq makes the identity values follow the caller's order, which is the
    # FIFO tie-break of a queue_id.
    new_jobs = (
        insert(jobs)
        .from_select(
            ["task", "payload", "priority", "queue_id", "max_attempts", "scheduled_at"],
            select(
                source.c.task,
                source.c.payload,
                source.c.priority,
                source.c.queue_id,
                source.c.max_attempts,
                execute_at,
            ).order_by(source.c.seq),
        )
        .returning(jobs.c.id, jobs.c.task, jobs.c.priority, jobs.c.queue_id, jobs.c.scheduled_at)
        .cte("new_jobs")
    )
    new_executions = (
        insert(ex)
        .from_select(
            ["id", "task", "priority", "queue_id", "state", "execute_at"],
            select(
                new_jobs.c.id,
                new_jobs.c.task,
                new_jobs.c.priority,
                new_jobs.c.queue_id,
                PENDING,
                new_jobs.c.scheduled_at,
            ),
        )
        .returning(ex.c.id)
        .cte("new_executions")
    )
    ids = select(new_executions.c.id.label("id")).order_by(new_executions.c.id)
    if not notify:
        return ids
    wake = select(
        func.pg_notify(literal(tables.notify_channel, Text), literal("", Text)).label("n")
    ).cte("wake")
    # Cross-joining the one-row "wake" keeps pg_notify in the statement; it fires only
    # when at least one job was written (an empty batch notifies nobody).
    return (
        select(new_executions.c.id.label("id"))
        .select_from(new_executions.join(wake, true()))
        .order_by(new_executions.c.id)
    )
