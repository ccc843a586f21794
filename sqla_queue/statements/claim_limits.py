"""What a claim adds under limits: capacity seats for a concurrency limit, and the rate
window of a rate-limited task.

Both are pieces of :func:`~sqla_queue.statements.claim.claim_statement`: its ``limited``
shape takes :func:`limited_picks`, its ``rated`` shape :func:`rate_gate` and
:func:`rate_bookkeeping`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    Integer,
    Interval,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    false,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import JSONB

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import RUNNING, seconds
from sqla_queue.statements.claim_walks import batch_size, claim_order, due_slice, seated_walk

__all__ = ["RATE_START_RETENTION", "limited_picks", "rate_bookkeeping", "rate_gate"]


#: How long a recorded start outlives its rate window: operators can still see, for a
#: minute, what the limit let through.
RATE_START_RETENTION = literal_column("interval '60 seconds'", Interval)


def rate_gate(tables: QueueTables) -> CTE:
    """The rate window of ``rate_task``, read once: ``(at, rate_max, rate_seconds,
    allowance, free_at)``, always one row.

    ``at`` is the database clock read after the control row's lock was granted (the lock
    statement ran first), so the ``at`` of successive claims of the task increase in lock
    order. ``allowance`` is the starts left in the window ``(at - rate_seconds, at]``:
    ``rate_max`` less the starts recorded in it. Every start this claim makes is recorded
    at ``at``, so any window of ``rate_seconds`` ending at a recorded start holds at most
    ``rate_max`` of them: the limit is exact across workers. ``free_at`` is when the oldest
    start in the window leaves it. A task without a stored rate gets the whole batch.
    """
    c = tables.controls
    s = tables.rate_starts
    rate_task = bindparam("rate_task", type_=Text)
    now = select(func.clock_timestamp().label("at")).subquery("clock")
    control = select(c.c.rate_max, c.c.rate_seconds).where(c.c.task == rate_task).subquery("ctl")
    window_start = now.c.at - seconds(control.c.rate_seconds)
    in_window = (s.c.task == rate_task, s.c.started_at > window_start)
    # Index range scans of rate_starts' primary key, bounded by the limit itself.
    started = select(func.count()).where(*in_window).scalar_subquery()
    oldest = select(func.min(s.c.started_at)).where(*in_window).scalar_subquery()
    allowance = case(
        (control.c.rate_max.is_(None), batch_size()),
        else_=func.greatest(control.c.rate_max - started, 0),
    )
    free_at = func.coalesce(oldest, now.c.at) + seconds(control.c.rate_seconds)
    return (
        select(
            now.c.at,
            control.c.rate_max,
            control.c.rate_seconds,
            allowance.label("allowance"),
            free_at.label("free_at"),
        )
        .select_from(now.outerjoin(control, true()))
        .cte("gate")
        .prefix_with("MATERIALIZED")
    )


def rate_bookkeeping(tables: QueueTables, gate: CTE, claimed: CTE) -> tuple[CTE, CTE]:
    """Record this claim's starts at the gate's ``at``, and drop the task's starts that no
    window needs any more (older than the window and a minute's retention)."""
    s = tables.rate_starts
    recorded = (
        insert(s)
        .from_select(
            ["task", "started_at", "job_id"],
            select(claimed.c.task, gate.c.at, claimed.c.id)
            .select_from(claimed.join(gate, true()))
            .where(gate.c.rate_max.is_not(None)),
        )
        .cte("recorded")
    )
    horizon = select(
        gate.c.at - seconds(func.coalesce(gate.c.rate_seconds, 0)) - RATE_START_RETENTION
    ).scalar_subquery()
    pruned = (
        delete(s)
        .where(s.c.task == bindparam("rate_task", type_=Text), s.c.started_at < horizon)
        .cte("pruned")
    )
    return recorded, pruned


def limited_picks(
    tables: QueueTables, tasks: Any, levels: CTE, cap: Any
) -> tuple[CTE, ColumnElement[Any]]:
    """The picks of a claim that respects concurrency limits, and each pick's slot.

    * ``room``: per limited task of the worker, its limit (the stored one, else the one
      declared in code), the running executions without a slot (claimed before version 2,
      or before the task had a limit: the count gate) and the seats held at or above the
      limit (left by a limit lowered while they ran). Read from this statement's snapshot,
      so it can be stale by an in-flight claim: that is what the slot index is for.
    * ``seats``: per limited task, up to ``batch`` free seats, numbered ``k`` = 1, 2, ...
      Seats ``legacy .. limit-1`` are walked from a random offset, one probe of the slot
      index each, and the walk stops once enough are free: it tries at most ``held +
      batch`` numbers and never generates a limit-sized series, so a claim costs the same
      at limit 10 and at limit 5000, and no claim counts the seats held. Seats held above
      the limit use up free seats first (``k`` starts after them), so a lowered limit
      waits until the running count is under it. Two claims racing for a roomy limit
      start at different offsets and rarely pick the same seat; the loser of a collision
      gets an empty batch.
    * ``picked``: per (task, priority) slice, the first due heads without a seat: up to a
      batch for an unlimited task, up to its free seats for a limited one, numbered ``k``
      within their task in claim order and capped by the free seats before the batch
      LIMIT, so a full task never fills the batch with rows it may not run and starve the
      rest. Beside them, the executions that already hold a slot (a reclaimed job keeps
      its seat), never gated. The best ``batch`` of both.
    * ``assigned``: the k-th fresh pick of a limited task takes its k-th free seat.
    """
    ex = tables.executions
    limits = tables.limits
    batch = batch_size()
    declared = cast(bindparam("limit_map", type_=Text), JSONB)

    t = func.unnest(tasks).table_valued("task").render_derived(name="t")
    stored = select(limits.c.concurrency_limit).where(limits.c.task == t.c.task).scalar_subquery()
    declared_limit = cast(func.jsonb_extract_path_text(declared, t.c.task), Integer)
    base = select(t.c.task, func.coalesce(stored, declared_limit).label("lim")).subquery("base")
    r = ex.alias("r")
    legacy = (
        select(func.count())
        .where(r.c.task == base.c.task, r.c.state == RUNNING, r.c.slot.is_(None))
        .scalar_subquery()
    )
    o = ex.alias("o")
    over = (
        select(func.count()).where(o.c.task == base.c.task, o.c.slot >= base.c.lim)
    ).scalar_subquery()
    # Materialized: each count runs once, however often the columns are used below.
    room = (
        select(base.c.task, base.c.lim, legacy.label("legacy"), over.label("over"))
        .where(base.c.lim.is_not(None))
        .cte("room")
        .prefix_with("MATERIALIZED")
    )
    seats = _free_seats(tables, room, batch)
    free = (
        select(func.count())
        .where(seats.c.task == room.c.task)
        .correlate_except(seats)
        .scalar_subquery()
    )
    fresh = due_slice(tables, levels, case((room.c.task.is_(None), batch), else_=free), "fresh")
    k = func.row_number().over(partition_by=fresh.c.task, order_by=claim_order(fresh))
    numbered = (
        select(fresh, k.label("k"), room.c.task.is_not(None).label("gated"), free.label("free"))
        .select_from(levels.outerjoin(room, room.c.task == levels.c.task).join(fresh, true()))
        .subquery("numbered")
    )
    v, seated = seated_walk(tables, tasks, batch)
    both = union_all(
        select(
            numbered.c.id,
            numbered.c.task,
            numbered.c.priority,
            numbered.c.execute_at,
            numbered.c.slot,
            numbered.c.k,
            numbered.c.gated,
        ).where(or_(~numbered.c.gated, numbered.c.k <= numbered.c.free)),
        select(seated, null().label("k"), false().label("gated")).select_from(
            v.join(seated, true())
        ),
    ).subquery("both_")
    picked = (
        select(both.c.id, both.c.task, both.c.slot, both.c.k, both.c.gated)
        .order_by(*claim_order(both))
        .limit(cap)
        .cte("picked")
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
        .where(or_(slot.is_not(None), ~picked.c.gated))
        .cte("assigned")
    )
    return assigned, assigned.c.slot


def _free_seats(tables: QueueTables, room: CTE, batch: Any) -> CTE:
    """Per limited task in ``room``: ``(task, seat, k)``, its first free seats numbered from 1.

    The seat numbers come from ``generate_series`` in a select list, which PostgreSQL
    produces one at a time (in FROM it would build the whole series first), so the LIMIT
    stops the walk, and with it the probes, as soon as enough free seats are found.
    """
    ex = tables.executions
    usable = func.greatest(room.c.lim - room.c.legacy, 1)
    offset = bindparam("seat_offset", type_=Integer)
    walk = (
        select(
            (
                room.c.legacy
                + (func.generate_series(0, room.c.lim - room.c.legacy - 1) + offset) % usable
            ).label("seat")
        )
        .correlate_except()
        .lateral("walk")
    )
    x = ex.alias("x")
    # A seat is free when no execution holds it: a scalar probe of the slot index. As NOT
    # EXISTS, the planner would turn it into an anti join hashing every held seat.
    holder = (
        select(x.c.id)
        .where(x.c.task == room.c.task, x.c.slot == walk.c.seat)
        .limit(1)
        .correlate_except(x)
        .scalar_subquery()
    )
    # Seats held above the limit are counted off the first free ones found.
    found = (
        select(walk.c.seat, (func.row_number().over() - room.c.over).label("k"))
        .where(holder.is_(None))
        .limit(batch + room.c.over)
        .correlate_except(x)
        .lateral("found")
    )
    return (
        select(room.c.task, found.c.seat, found.c.k)
        .select_from(room.join(found, true()))
        .where(found.c.k >= 1)
        .cte("seats")
        .prefix_with("MATERIALIZED")
    )
