"""The index walks a claim is made of: priority levels, due heads, seated reclaims.

Every walk is bounded by the batch, whatever the backlog looks like: the claim
(:func:`~sqla_queue.statements.claim.claim_statement`) puts them together, with the
seats and rate window of :mod:`sqla_queue.statements.claim_limits` when it needs them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    Integer,
    and_,
    bindparam,
    case,
    exists,
    func,
    literal_column,
    or_,
    select,
    tuple_,
)

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import ONE, PENDING, RUNNING
from sqla_queue.statements.keys import started_elsewhere, waiting_before

__all__ = [
    "batch_size",
    "claim_order",
    "due_slice",
    "is_head",
    "next_due_time",
    "priority_levels",
    "seated_walk",
]


def batch_size() -> Any:
    """The ``batch`` parameter: the most executions one claim takes.

    It is rendered into the SQL text at execution time rather than bound. The worker's
    connection runs the claim as a prepared statement with a generic plan (no planning
    per claim), and a generic plan cannot see a bound LIMIT: the planner then assumes a
    tenth of the table comes back and joins the claimed rows to ``jobs`` by a hash over
    the whole table. With the number in the text, each batch size gets its own prepared
    statement whose plan knows how few rows it returns.
    """
    return bindparam("batch", type_=Integer, literal_execute=True)


def is_head(tables: QueueTables, row: Any) -> ColumnElement[bool]:
    """``row`` is its key's head: the next job of its ``queue_id`` to run, and nothing of
    the key runs.

    No execution of the key runs (one probe of ``queue_running_uq``), whatever its place
    in the order: a job enqueued with a due time before the running one's would otherwise
    count as the head, and its claim would collide with the running one in that unique
    index, failing every claim of the batch until it finished. The "started" walk below
    sees such a running row too, except one written by a release before every claim set
    ``lease_seconds`` (NULL there), which a rolling upgrade can leave running: that one
    only this probe sees (tests/integration/test_fences.py). Then either ``row`` has
    started before (it was retried, rescheduled, handed back or reclaimed: it keeps its
    place whatever its new due time), or it comes first: no other job of the key has
    started and not finished (a walk of the key's few pending rows in
    ``queue_active_ix``, see :func:`~sqla_queue.statements.keys.started_elsewhere`), no
    pending one comes before it (one probe of ``queue_active_ix``) and no waiting one
    (one probe of ``waiting_ix``: a job left waiting ahead while its promotion is owed
    goes first). None of them walks a key's waiting backlog.
    """
    r = tables.executions.alias("r_key")
    p = tables.executions.alias("p")
    comes_first = and_(
        ~exists().where(
            p.c.queue_id == row.c.queue_id,
            or_(p.c.state == PENDING, p.c.state == RUNNING),
            tuple_(p.c.execute_at, p.c.id) < tuple_(row.c.execute_at, row.c.id),
        ),
        ~waiting_before(tables, row),
        ~started_elsewhere(tables, row.c.queue_id, other_than=row.c.id),
    )
    return or_(
        row.c.queue_id.is_(None),
        and_(
            ~exists().where(r.c.queue_id == row.c.queue_id, r.c.state == RUNNING),
            or_(row.c.lease_seconds.is_not(None), comes_first),
        ),
    )


def priority_levels(tables: QueueTables, tasks: Any) -> CTE:
    """Per task of the worker, each priority that its fresh pending executions use.

    A recursive walk down ``task_claim_ix``: the highest priority of the task, then the
    highest below it, and so on, one index probe per step, never a row per execution. The
    claim then walks each (task, priority) slice in ``execute_at`` order with the due time
    as an index bound, so rows scheduled for later are never passed over, and the cost of a
    claim grows with the number of priorities in use, not with the backlog.
    """
    ex = tables.executions
    t = func.unnest(tasks).table_valued("task").render_derived(name="t")

    def highest(task: Any, below: Any = None) -> Any:
        e = ex.alias("lv")
        conditions = [e.c.task == task, e.c.state == PENDING, e.c.slot.is_(None)]
        if below is not None:
            conditions.append(e.c.priority < below)
        return (
            select(e.c.priority)
            .where(*conditions)
            .order_by(e.c.priority.desc())
            .limit(ONE)
            .scalar_subquery()
        )

    levels = select(t.c.task, highest(t.c.task).label("priority")).cte("levels", recursive=True)
    previous = levels.alias("l")
    return levels.union_all(
        select(previous.c.task, highest(previous.c.task, previous.c.priority)).where(
            previous.c.priority.is_not(None)
        )
    )


def due_slice(tables: QueueTables, level: Any, limit: Any, name: str) -> Any:
    """The first due, claimable executions of one (task, priority) slice, locked.

    Task and priority are matched by equality, so ``task_claim_ix`` is walked from the
    slice's first row in ``(execute_at, id)`` order and the walk ends at the first row not
    yet due: it reads at most ``limit`` rows plus those it skips (locked by another claim,
    or a key's second row queued before the key's head was claimed).
    """
    e = tables.executions.alias("e")
    return (
        select(e.c.id, e.c.task, e.c.priority, e.c.execute_at, e.c.slot)
        .where(
            e.c.task == level.c.task,
            e.c.priority == level.c.priority,
            e.c.state == PENDING,
            e.c.slot.is_(None),
            e.c.execute_at <= func.now(),
            is_head(tables, e),
        )
        .order_by(e.c.execute_at, e.c.id)
        .limit(limit)
        # NO KEY UPDATE: an enqueue holding this row as its key's predecessor (KEY SHARE)
        # does not stand in the way of claiming it.
        .with_for_update(of=e, skip_locked=True, key_share=True)
        .correlate_except(e)
        .lateral(name)
    )


def seated_walk(tables: QueueTables, tasks: Any, batch: Any) -> Any:
    """Per task, due executions that kept a capacity seat through a reclaim, locked.

    They are few (at most the task's limit) and claimed whatever the room: recovery is
    never gated by a limit. Walked in ``seated_ix``.
    """
    v = func.unnest(tasks).table_valued("task").render_derived(name="v")
    g = tables.executions.alias("g")
    seated = (
        select(g.c.id, g.c.task, g.c.priority, g.c.execute_at, g.c.slot)
        .where(
            g.c.task == v.c.task,
            g.c.state == PENDING,
            g.c.slot.is_not(None),
            g.c.execute_at <= func.now(),
            is_head(tables, g),
        )
        .order_by(g.c.priority.desc(), g.c.execute_at, g.c.id)
        .limit(batch)
        .with_for_update(of=g, skip_locked=True, key_share=True)
        .lateral("seated")
    )
    return v, seated


def claim_order(row: Any) -> tuple[Any, ...]:
    """The order claims take executions in: highest priority, then earliest due, then id."""
    return (row.c.priority.desc(), row.c.execute_at, row.c.id)


def next_due_time(tables: QueueTables, levels: CTE) -> CTE:
    """When the worker's next pending execution falls due: one index probe per slice."""
    e = tables.executions.alias("n")
    first_later = (
        select(e.c.execute_at)
        .where(
            e.c.task == levels.c.task,
            e.c.priority == levels.c.priority,
            e.c.state == PENDING,
            e.c.slot.is_(None),
            e.c.execute_at > func.now(),
        )
        .order_by(e.c.execute_at)
        .limit(ONE)
        .scalar_subquery()
    )
    # Capped at a day: a job due in the year 10,000 or later (a huge delay or retry) is a
    # valid timestamptz that no Python datetime can hold, and reading it back would fail
    # every claim of every worker. A day is far beyond any poll interval, so the sleep it
    # decides is the same. No job due later still reads as NULL.
    at = func.min(first_later)
    horizon = func.now() + literal_column("interval '1 day'")
    return (
        select(case((at > horizon, horizon), else_=at).label("at"))
        .where(levels.c.priority.is_not(None))
        .cte("next_due")
    )
