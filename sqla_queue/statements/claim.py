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
    * ``picked``: per task of the worker, the first rows without a seat, walked in that
      task's slice of ``task_claim_ix``: up to a batch for an unlimited task, up to its
      free seats for a limited one. The cap comes before the LIMIT, so a full task never
      fills the batch with rows it may not run and starve the rest. Beside them, the
      executions that already hold a slot (a reclaimed job keeps its seat), from the small
      ``seated_ix``, never gated. The best ``batch`` of both, fresh ones numbered ``k``
      within their task.
    * ``assigned``: the k-th fresh pick of a limited task takes its k-th free seat.

    Few CTEs, on purpose: every node is set up again at each claim, and this statement
    runs once per batch.
    """
    ex = tables.executions
    limits = tables.limits
    batch = _batch_size()
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

    # Every pick walks one task's own slice of an index (task first), so neither a large
    # backlog of a limited task nor another task's backlog is scanned and filtered.
    u = func.unnest(tasks).table_valued("task").render_derived(name="u")
    e = ex.alias("e")
    free = (
        select(func.count())
        .where(seats.c.task == room.c.task)
        .correlate_except(seats)
        .scalar_subquery()
    )
    # The task leads the ORDER BY: see _one_task_claimable.
    locked = (
        select(e.c.id, e.c.priority, e.c.execute_at, e.c.task, e.c.slot)
        .where(*_one_task_claimable(tables, e, u.c.task), e.c.slot.is_(None))
        .order_by(e.c.task, *_claim_order(e))
        .limit(case((room.c.task.is_(None), batch), else_=free))
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
        select(fresh, room.c.task.is_not(None).label("gated")).select_from(
            u.outerjoin(room, room.c.task == u.c.task).join(fresh, true())
        ),
        select(seated, null().label("k"), false().label("gated")).select_from(
            v.join(seated, true())
        ),
    ).subquery("both_")
    picked = (
        select(both.c.id, both.c.task, both.c.slot, both.c.k, both.c.gated)
        .order_by(*_claim_order(both))
        .limit(batch)
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
