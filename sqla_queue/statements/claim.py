"""The claim: one statement that picks, locks, marks and returns a batch of executions.

Parameters: ``tasks`` (text[] of the worker's task names), ``batch`` (int), ``worker``
(uuid), ``lease`` (default lost interval, seconds) and ``lease_map`` (jsonb text mapping a
task name to its own lost interval; ``'{}'`` when none differs).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Double,
    Integer,
    Select,
    Text,
    Uuid,
    any_,
    bindparam,
    cast,
    exists,
    func,
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import PENDING, RUNNING

__all__ = ["claim_statement"]


def claim_statement(tables: QueueTables) -> Select[*tuple[Any, ...]]:
    """Build the claim statement for ``tables``.

    Shape, in one round trip:

    ```sql
        WITH candidates AS (SELECT id ... ORDER BY priority DESC, execute_at, id
                            LIMIT :batch FOR UPDATE OF e SKIP LOCKED),
             claimed    AS (UPDATE executions SET state='running', ... RETURNING ...),
             next_due   AS (SELECT min(execute_at) ... WHERE execute_at > now())
        SELECT next_due.at, claimed.*, jobs.payload ...
        FROM next_due LEFT JOIN (claimed JOIN jobs) ON true
    ```

    The outer join always yields one row, so an empty claim still reports when the next
    job falls due and an idle poller can sleep exactly until then.

    A row with a ``queue_id`` is a candidate only when no active row of the same queue_id
    comes before it in ``(execute_at, id)``: the head of its queue. Running rows count as
    predecessors, so the next job of a key waits for the running one to finish.
    """
    ex = tables.executions
    jobs = tables.jobs
    e = ex.alias("e")
    p = ex.alias("p")
    tasks = bindparam("tasks", type_=ARRAY(Text))

    is_head = ~exists().where(
        p.c.queue_id == e.c.queue_id,
        tuple_(p.c.execute_at, p.c.id) < tuple_(e.c.execute_at, e.c.id),
    )
    candidates = (
        select(e.c.id)
        .where(
            e.c.state == PENDING,
            e.c.execute_at <= func.now(),
            e.c.task == any_(tasks),
            or_(e.c.queue_id.is_(None), is_head),
        )
        .order_by(e.c.priority.desc(), e.c.execute_at, e.c.id)
        .limit(bindparam("batch", type_=Integer))
        .with_for_update(of=e, skip_locked=True)
        .cte("candidates")
    )
    lease = func.coalesce(
        cast(
            func.jsonb_extract_path_text(
                cast(bindparam("lease_map", type_=Text), JSONB), ex.c.task
            ),
            Double,
        ),
        bindparam("lease", type_=Double),
    )
    claimed = (
        update(ex)
        .where(ex.c.id == candidates.c.id)
        .values(
            state=RUNNING,
            worker_id=bindparam("worker", type_=Uuid),
            alive_at=func.now(),
            attempt=ex.c.attempt + 1,
            lease_seconds=lease,
        )
        .returning(ex.c.id, ex.c.attempt, ex.c.reclaims, ex.c.queue_id)
        .cte("claimed")
    )
    next_due = (
        select(func.min(ex.c.execute_at).label("at"))
        .where(ex.c.state == PENDING, ex.c.task == any_(tasks), ex.c.execute_at > func.now())
        .cte("next_due")
    )
    return select(
        next_due.c.at.label("next_due"),
        claimed.c.id,
        claimed.c.attempt,
        claimed.c.reclaims,
        claimed.c.queue_id,
        jobs.c.task,
        jobs.c.payload,
        jobs.c.max_attempts,
    ).select_from(next_due.outerjoin(claimed.join(jobs, jobs.c.id == claimed.c.id), true()))
