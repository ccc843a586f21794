"""The claim: one statement that picks, locks, marks and returns a batch of executions.

Parameters of both shapes: ``tasks`` (text[] of the worker's task names), ``batch`` (int,
rendered into the SQL text when the statement runs; see :func:`_batch_size`),
``worker`` (uuid), ``lease`` (default lost interval, seconds) and ``lease_map`` (jsonb text
mapping a task name to its own lost interval; ``'{}'`` when none differs). The limited shape
adds ``limit_map`` (jsonb text: the concurrency limits declared in code, by task name) and
``seat_offset`` (a random non-negative int, new for each claim).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    Double,
    Integer,
    Select,
    Text,
    Uuid,
    and_,
    any_,
    bindparam,
    case,
    cast,
    exists,
    func,
    null,
    or_,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import PENDING, RUNNING

__all__ = ["claim_statement"]


def _batch_size() -> Any:
    """The ``batch`` parameter: the most executions one claim takes.

    It is rendered into the SQL text at execution time rather than bound. The worker's
    connection runs the claim as a prepared statement with a generic plan (no planning
    per claim), and a generic plan cannot see a bound LIMIT: the planner then assumes a
    tenth of the table comes back and joins the claimed rows to ``jobs`` by a hash over
    the whole table. With the number in the text, each batch size gets its own prepared
    statement whose plan knows how few rows it returns.
    """
    return bindparam("batch", type_=Integer, literal_execute=True)


def _claimable(tables: QueueTables, row: Any, tasks: ColumnElement[Any]) -> list[Any]:
    """Due, pending, one of ``tasks``, and the head of its queue_id if it has one.

    A row with a ``queue_id`` is a candidate only when no active row of the same queue_id
    comes before it in ``(execute_at, id)``. Running rows count as predecessors, so the next
    job of a key waits for the running one to finish.
    """
    p = tables.executions.alias("p")
    is_head = ~exists().where(
        p.c.queue_id == row.c.queue_id,
        tuple_(p.c.execute_at, p.c.id) < tuple_(row.c.execute_at, row.c.id),
    )
    return [
        row.c.state == PENDING,
        row.c.execute_at <= func.now(),
        row.c.task == tasks,
        or_(row.c.queue_id.is_(None), is_head),
    ]


def _one_task_claimable(tables: QueueTables, row: Any, task: ColumnElement[Any]) -> list[Any]:
    """:func:`_claimable` for the rows of one task, walked in that task's own index slice.

    The task is matched as a range of one value, ``task >= t AND task <= t``, which the
    per-task index serves exactly like equality. With plain equality the planner treats
    the task as a constant, drops it from the required order, and in a generic plan (which
    cannot tell how common the task is) may prefer walking ``claim_ix``, every task in
    claim order, filtering as it goes: that passes over all other tasks' backlog whenever
    this task has few ready rows. The range keeps the task in the order, which only the
    per-task index delivers without a sort.
    """
    state, due, _, head = _claimable(tables, row, task)
    return [state, due, row.c.task >= task, row.c.task <= task, head]


def _claim_order(row: Any) -> tuple[Any, ...]:
    return (row.c.priority.desc(), row.c.execute_at, row.c.id)


def claim_statement(tables: QueueTables, *, limited: bool = False) -> Select[*tuple[Any, ...]]:
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

    With ``limited``, fresh claims of tasks that have a concurrency limit (declared in code
    or stored in the limits table) take a capacity slot; see :func:`_limited_picks`. A
    worker none of whose tasks is limited uses the plain shape, which is the version-1
    statement unchanged.
    """
    ex = tables.executions
    jobs = tables.jobs
    tasks = bindparam("tasks", type_=ARRAY(Text))
    if limited:
        picks, slot = _limited_picks(tables, tasks)
        extra = {"slot": slot}
    else:
        e = ex.alias("e")
        picks = (
            select(e.c.id)
            .where(*_claimable(tables, e, any_(tasks)))
            .order_by(*_claim_order(e))
            .limit(_batch_size())
            .with_for_update(of=e, skip_locked=True)
            .cte("candidates")
        )
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


def _limited_picks(tables: QueueTables, tasks: Any) -> tuple[CTE, ColumnElement[Any]]:
    """The picks of a claim that respects concurrency limits, and each pick's slot.

    * ``room``: per limited task of the worker, its limit (the stored one, else the one
      declared in code), the running executions without a slot (claimed before version 2:
      the count gate) and the slots held. Read from this statement's snapshot, so it can
      be stale by an in-flight claim: that is what the slot index is for.
    * ``picked``: per task of the worker, the first rows without a seat, walked in that
      task's slice of ``task_claim_ix``: up to a batch for an unlimited task, up to its free
      capacity for a limited one. The capacity check comes before the LIMIT, so a full task
      never fills the batch with rows it may not run and starve the rest. Beside them, the
      executions that already hold a slot (a reclaimed job keeps its seat), from the small
      ``seated_ix``, never gated. The best ``batch`` of both, each numbered within its task.
    * ``seats``: the k-th free slot for the k-th fresh pick of a task. The search covers
      only ``held + batch`` numbers, never a limit-sized series, so a claim costs the same
      at limit 10 and at limit 5000. It starts at a random offset: claims racing for a
      roomy limit then rarely pick the same seat (the loser of a collision gets an empty
      batch). Slots lie in ``legacy .. limit-1``: with running rows that hold no slot,
      fewer seats exist, and the unique index still sees every seat that is taken.

    Few CTEs, on purpose: every one is a node the executor sets up at each claim, and this
    statement runs once per batch.
    """
    ex = tables.executions
    limits = tables.limits
    batch = _batch_size()
    declared = cast(bindparam("limit_map", type_=Text), JSONB)

    t = func.unnest(tasks).table_valued("task").render_derived(name="t")
    limit = func.coalesce(
        limits.c.concurrency_limit,
        cast(func.jsonb_extract_path_text(declared, t.c.task), Integer),
    )
    r = ex.alias("r")
    legacy = (
        select(func.count())
        .where(r.c.task == t.c.task, r.c.state == RUNNING, r.c.slot.is_(None))
        .scalar_subquery()
    )
    h = ex.alias("h")
    held = select(func.count()).where(h.c.task == t.c.task, h.c.slot.is_not(None)).scalar_subquery()
    # Materialized: each count runs once, however often the columns are used below.
    room = (
        select(t.c.task, limit.label("lim"), legacy.label("legacy"), held.label("held"))
        .select_from(t.outerjoin(limits, limits.c.task == t.c.task))
        .where(limit.is_not(None))
        .cte("room")
        .prefix_with("MATERIALIZED")
    )
    free = func.greatest(room.c.lim - room.c.legacy - room.c.held, 0)

    # Every pick walks one task's own slice of an index (task first), so neither a large
    # backlog of a limited task nor another task's backlog is scanned and filtered.
    u = func.unnest(tasks).table_valued("task").render_derived(name="u")
    e = ex.alias("e")
    # The task leads the ORDER BY: see _one_task_claimable.
    locked = (
        select(e.c.id, e.c.priority, e.c.execute_at, e.c.task, e.c.slot)
        .where(*_one_task_claimable(tables, e, u.c.task), e.c.slot.is_(None))
        .order_by(e.c.task, *_claim_order(e))
        .limit(case((room.c.task.is_(None), batch), else_=func.least(free, batch)))
        .with_for_update(of=e, skip_locked=True)
        # Two levels below ``u``: correlate explicitly, or ``u`` would be joined anew.
        .correlate_except(e)
        .lateral("locked")
    )
    # k numbers a task's fresh picks 1, 2, ... in the order they come; the top ``batch``
    # of all tasks keeps a prefix of each task's picks, so the k-th kept pick meets the
    # k-th free seat. Any pairing of distinct picks with distinct free seats is correct;
    # numbering in arrival order spares the sorts a window over the claim order costs.
    fresh = select(locked, func.row_number().over().label("k")).lateral("fresh")
    # A reclaimed execution keeps its seat: it is claimed again whatever the room, so
    # recovery is never gated by the limit.
    v = func.unnest(tasks).table_valued("task").render_derived(name="v")
    g = ex.alias("g")
    seated = (
        select(g.c.id, g.c.priority, g.c.execute_at, g.c.task, g.c.slot)
        .where(*_one_task_claimable(tables, g, v.c.task), g.c.slot.is_not(None))
        .order_by(g.c.task, *_claim_order(g))
        .limit(batch)
        .with_for_update(of=g, skip_locked=True)
        .lateral("seated")
    )
    both = union_all(
        select(fresh).select_from(u.outerjoin(room, room.c.task == u.c.task).join(fresh, true())),
        select(seated, null().label("k")).select_from(v.join(seated, true())),
    ).subquery("both_")
    picked = (
        select(both.c.id, both.c.task, both.c.slot, both.c.k)
        .order_by(*_claim_order(both))
        .limit(batch)
        .cte("picked")
    )
    # Seats usable now: legacy .. lim-1. The window is walked from a random offset, so two
    # claims racing for a roomy limit rarely compute the same seats and collide.
    usable = func.greatest(room.c.lim - room.c.legacy, 1)
    s = (
        func.generate_series(0, func.least(room.c.lim - room.c.legacy, room.c.held + batch) - 1)
        .table_valued("i")
        .render_derived(name="s")
    )
    offset = bindparam("seat_offset", type_=Integer)
    seat = room.c.legacy + (s.c.i + offset) % usable
    x = ex.alias("x")
    # A seat is free when no execution holds it: one probe of the slot index per seat
    # tried, stopping once enough are found (the series comes in order; no sort). A scalar
    # probe rather than NOT EXISTS: the planner would turn NOT EXISTS into an anti join
    # hashing every held seat of the task.
    holder = (
        select(x.c.id)
        .where(x.c.task == room.c.task, x.c.slot == seat)
        .limit(1)
        .correlate_except(x)
        .scalar_subquery()
    )
    free_seats = (
        select(seat.label("seat"), func.row_number().over().label("k"))
        .where(holder.is_(None))
        .limit(func.least(free, batch))
        .lateral("free_seats")
    )
    seats = (
        select(room.c.task, free_seats.c.seat, free_seats.c.k)
        .select_from(room.join(free_seats, true()))
        .where(free > 0)
        .cte("seats")
    )
    slot = func.coalesce(picked.c.slot, seats.c.seat)
    assigned = (
        select(picked.c.id, slot.label("slot"))
        .select_from(
            picked.outerjoin(
                seats,
                and_(
                    seats.c.task == picked.c.task,
                    seats.c.k == picked.c.k,
                    picked.c.slot.is_(None),
                ),
            )
        )
        # Belt and braces: a limited task's row without a seat is never claimed.
        .where(or_(slot.is_not(None), ~exists().where(room.c.task == picked.c.task)))
        .cte("assigned")
    )
    return assigned, assigned.c.slot
