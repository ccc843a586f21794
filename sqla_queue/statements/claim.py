"""The claim: one statement that picks, locks, marks and returns a batch of executions.

Parameters of both shapes: ``tasks`` (text[] of the worker's task names), ``batch`` (int,
rendered into the SQL text when the statement runs; see
:func:`~sqla_queue.statements.claim_walks.batch_size`),
``worker`` (uuid), ``lease`` (default lost interval, seconds) and ``lease_map`` (jsonb text
mapping a task name to its own lost interval; ``'{}'`` when none differs). The limited shape
adds ``limit_map`` (jsonb text: the concurrency limits declared in code, by task name) and
``seat_offset`` (a random non-negative int, new for each claim).

Every read of the pending set is an index walk whose length is bounded by the batch,
whatever the backlog looks like (see :func:`claim_statement`). The worker runs the claim
after :func:`~sqla_queue.statements.planner.planner_guard`, which takes away the plans that
only look cheaper under stale statistics.

The walks it is made of are in :mod:`sqla_queue.statements.claim_walks`; what the limited
and rated shapes add, in :mod:`sqla_queue.statements.claim_limits`.
"""

from __future__ import annotations

import uuid
from typing import Any, TypedDict

from sqlalchemy import (
    CTE,
    Double,
    Select,
    Text,
    Uuid,
    and_,
    bindparam,
    case,
    cast,
    func,
    null,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import QUEUED, RUNNING
from sqla_queue.statements.claim_limits import limited_picks, rate_bookkeeping, rate_gate
from sqla_queue.statements.claim_walks import (
    batch_size,
    claim_order,
    due_slice,
    next_due_time,
    priority_levels,
    seated_walk,
)

__all__ = [
    "ClaimParams",
    "LimitedClaimParams",
    "LimitedRatedClaimParams",
    "RatedClaimParams",
    "claim_statement",
]


class ClaimParams(TypedDict):
    """Parameters of the plain claim (``claim_statement(tables)``)."""

    #: The worker's task names.
    tasks: list[str]
    #: Most executions to take; rendered into the text (one prepared statement per size).
    batch: int
    worker: uuid.UUID
    #: The queue's lost interval in seconds, for tasks without their own.
    lease: float
    #: JSON object: task name -> its own lost interval, for tasks whose lease differs.
    lease_map: str


class LimitedClaimParams(ClaimParams):
    """Parameters of the slot-aware claim (``claim_statement(tables, limited=True)``)."""

    #: JSON object: task name -> concurrency limit declared in code.
    limit_map: str
    #: A random non-negative int, new for each claim: where the free-seat search starts.
    seat_offset: int


class RatedClaimParams(ClaimParams):
    """Parameters of the claim of one rate-limited task (``claim_statement(tables,
    rated=True)``); ``tasks`` names that task alone."""

    #: The rate-limited task, whose control row the transaction has locked.
    rate_task: str


class LimitedRatedClaimParams(LimitedClaimParams):
    """Parameters of the claim of one task that has both a rate limit and a concurrency
    limit (``claim_statement(tables, limited=True, rated=True)``)."""

    rate_task: str


def claim_statement(
    tables: QueueTables, *, limited: bool = False, rated: bool = False
) -> Select[*tuple[Any, ...]]:
    """Build the claim statement for ``tables``.

    Shape, in one round trip:

    ```sql
    WITH RECURSIVE levels AS (per task: each priority in use, one index probe each),
         candidates AS (per (task, priority): the first due heads in (execute_at, id)
                        order, LIMIT :batch, FOR NO KEY UPDATE SKIP LOCKED; plus the
                        executions that kept a seat; the best :batch of all),
         claimed    AS (UPDATE executions SET state='running', ... RETURNING ...),
         next_due   AS (per (task, priority): the first row not yet due)
    SELECT next_due.at, claimed.*, jobs.payload ...
    FROM next_due LEFT JOIN (claimed JOIN jobs) ON true
    ```

    Each slice is walked with its due time as an index bound, so the claim reads a batch
    of rows per slice whatever the backlog: rows scheduled for later, other tasks'
    backlogs and a hot key's waiting jobs are never passed over. The outer join always
    yields one row, so an empty claim still reports when the next job falls due and an
    idle poller can sleep exactly until then.

    With ``limited``, fresh claims of tasks that have a concurrency limit (declared in code
    or stored in the limits table) take a capacity slot; see
    :func:`~sqla_queue.statements.claim_limits.limited_picks`.

    With ``rated``, the claim is of one rate-limited task (``tasks`` names it alone, and
    ``rate_task`` too), run after :func:`~sqla_queue.statements.controls.rate_lock_statement`
    in the same transaction; see
    :func:`~sqla_queue.statements.claim_limits.rate_gate`. It takes at most the starts the
    task's window has left, records each start, and returns ``rate_allowance`` and
    ``rate_free_at`` (when the window next lets a start through) beside ``next_due``.
    """
    ex = tables.executions
    jobs = tables.jobs
    tasks = bindparam("tasks", type_=ARRAY(Text))
    levels = priority_levels(tables, tasks)
    gate = rate_gate(tables) if rated else None
    cap = batch_size()
    if gate is not None:
        cap = func.least(cap, select(gate.c.allowance).scalar_subquery())
    if limited:
        picks, slot = limited_picks(tables, tasks, levels, cap)
        extra = {"slot": slot}
    else:
        picks = plain_picks(tables, tasks, levels, cap)
        extra = {}
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
        .where(ex.c.id == picks.c.id)
        .values(
            state=RUNNING,
            worker_id=bindparam("worker", type_=Uuid),
            alive_at=func.now(),
            attempt=ex.c.attempt + 1,
            lease_seconds=lease,
            **extra,
        )
        .returning(
            ex.c.id,
            ex.c.attempt,
            ex.c.reclaims,
            ex.c.queue_id,
            ex.c.task,
            ex.c.execute_at,
            ex.c.priority,
            ex.c.workflow,
        )
        .cte("claimed")
    )
    next_due = next_due_time(tables, levels)
    columns = [
        next_due.c.at.label("next_due"),
        claimed.c.id,
        claimed.c.attempt,
        claimed.c.reclaims,
        claimed.c.queue_id,
        claimed.c.task,
        jobs.c.payload,
        jobs.c.max_attempts,
        claimed.c.execute_at,
        claimed.c.priority,
        claimed.c.workflow,
    ]
    # Outer: an execution whose job row was deleted by hand comes back with a NULL
    # payload, and the worker fails it, instead of holding it unseen until reclaimed.
    # The job of a claimed execution is queued: naming the status lets a partitioned jobs
    # table (sqla_queue.history) be planned on its live partition alone.
    job_row = and_(jobs.c.id == claimed.c.id, jobs.c.status == QUEUED)
    source = next_due.outerjoin(claimed.outerjoin(jobs, job_row), true())
    if gate is None:
        return select(*columns).select_from(source)
    recorded, pruned = rate_bookkeeping(tables, gate, claimed)
    free_at = case((gate.c.rate_max.is_(None), null()), else_=gate.c.free_at)
    return (
        select(
            *columns,
            gate.c.allowance.label("rate_allowance"),
            free_at.label("rate_free_at"),
        )
        .select_from(source.join(gate, true()))
        .add_cte(recorded, pruned)
    )


def plain_picks(tables: QueueTables, tasks: Any, levels: CTE, cap: Any) -> CTE:
    """The picks of a claim without concurrency limits: the best ``cap`` (the batch, or
    less under a rate limit) of every slice's first ``batch``."""
    batch = batch_size()
    fresh = due_slice(tables, levels, batch, "fresh")
    v, seated = seated_walk(tables, tasks, batch)
    both = union_all(
        select(fresh).select_from(levels.join(fresh, true())),
        select(seated).select_from(v.join(seated, true())),
    ).subquery("both_")
    return select(both.c.id).order_by(*claim_order(both)).limit(cap).cte("candidates")
