"""The claim: one statement that picks, locks, marks and returns a batch of executions.

Parameters of both shapes: ``tasks`` (text[] of the worker's task names), ``batch`` (int,
rendered into the SQL text when the statement runs; see :func:`_batch_size`),
``worker`` (uuid), ``lease`` (default lost interval, seconds) and ``lease_map`` (jsonb text
mapping a task name to its own lost interval; ``'{}'`` when none differs). The limited shape
adds ``limit_map`` (jsonb text: the concurrency limits declared in code, by task name) and
``seat_offset`` (a random non-negative int, new for each claim).

Every read of the pending set is an index walk whose length is bounded by the batch,
whatever the backlog looks like (see :func:`claim_statement`). The worker runs the claim
after :func:`~sqla_queue.statements.planner.planner_guard`, which takes away the plans that
only look cheaper under stale statistics.
"""

from __future__ import annotations

import uuid
from typing import Any, TypedDict

from sqlalchemy import (
    CTE,
    ColumnElement,
    Double,
    Integer,
    Interval,
    Select,
    Text,
    Uuid,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    false,
    func,
    insert,
    literal_column,
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
from sqla_queue.statements._common import ONE, PENDING, QUEUED, RUNNING, seconds
from sqla_queue.statements.keys import started_elsewhere, waiting_before

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


#: How long a recorded start outlives its rate window: operators can still see, for a
#: minute, what the limit let through.
RATE_START_RETENTION = literal_column("interval '60 seconds'", Interval)


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


def _is_head(tables: QueueTables, row: Any) -> ColumnElement[bool]:
    """``row`` is its key's head: the next job of its ``queue_id`` to run, and nothing of
    the key runs.

    No execution of the key runs (one probe of ``queue_running_uq``), whatever its place
    in the order: a job enqueued with a due time before the running one's would otherwise
    count as the head, and its claim would collide with the running one in that unique
    index, failing every claim of the batch until it finished. Then either ``row`` has
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


def _levels(tables: QueueTables, tasks: Any) -> CTE:
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


def _ready(tables: QueueTables, level: Any, limit: Any, name: str) -> Any:
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
            _is_head(tables, e),
        )
        .order_by(e.c.execute_at, e.c.id)
        .limit(limit)
        # NO KEY UPDATE: an enqueue holding this row as its key's predecessor (KEY SHARE)
        # does not stand in the way of claiming it.
        .with_for_update(of=e, skip_locked=True, key_share=True)
        .correlate_except(e)
        .lateral(name)
    )


def _seated(tables: QueueTables, tasks: Any, batch: Any) -> Any:
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
            _is_head(tables, g),
        )
        .order_by(g.c.priority.desc(), g.c.execute_at, g.c.id)
        .limit(batch)
        .with_for_update(of=g, skip_locked=True, key_share=True)
        .lateral("seated")
    )
    return v, seated


def _claim_order(row: Any) -> tuple[Any, ...]:
    return (row.c.priority.desc(), row.c.execute_at, row.c.id)


def _next_due(tables: QueueTables, levels: CTE) -> CTE:
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
    or stored in the limits table) take a capacity slot; see :func:`_limited_picks`.

    With ``rated``, the claim is of one rate-limited task (``tasks`` names it alone, and
    ``rate_task`` too), run after :func:`~sqla_queue.statements.controls.rate_lock_statement`
    in the same transaction; see :func:`_rate_gate`. It takes at most the starts the
    task's window has left, records each start, and returns ``rate_allowance`` and
    ``rate_free_at`` (when the window next lets a start through) beside ``next_due``.
    """
    ex = tables.executions
    jobs = tables.jobs
    tasks = bindparam("tasks", type_=ARRAY(Text))
    levels = _levels(tables, tasks)
    gate = _rate_gate(tables) if rated else None
    cap = _batch_size()
    if gate is not None:
        cap = func.least(cap, select(gate.c.allowance).scalar_subquery())
    if limited:
        picks, slot = _limited_picks(tables, tasks, levels, cap)
        extra = {"slot": slot}
    else:
        picks = _plain_picks(tables, tasks, levels, cap)
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
        .returning(ex.c.id, ex.c.attempt, ex.c.reclaims, ex.c.queue_id, ex.c.task, ex.c.execute_at)
        .cte("claimed")
    )
    next_due = _next_due(tables, levels)
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
    ]
    # Outer: an execution whose job row was deleted by hand comes back with a NULL
    # payload, and the worker fails it, instead of holding it unseen until reclaimed.
    # The job of a claimed execution is queued: naming the status lets a partitioned jobs
    # table (sqla_queue.history) be planned on its live partition alone.
    job_row = and_(jobs.c.id == claimed.c.id, jobs.c.status == QUEUED)
    source = next_due.outerjoin(claimed.outerjoin(jobs, job_row), true())
    if gate is None:
        return select(*columns).select_from(source)
    recorded, pruned = _rate_bookkeeping(tables, gate, claimed)
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


def _rate_gate(tables: QueueTables) -> CTE:
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
        (control.c.rate_max.is_(None), _batch_size()),
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


def _rate_bookkeeping(tables: QueueTables, gate: CTE, claimed: CTE) -> tuple[CTE, CTE]:
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


def _plain_picks(tables: QueueTables, tasks: Any, levels: CTE, cap: Any) -> CTE:
    """The picks of a claim without concurrency limits: the best ``cap`` (the batch, or
    less under a rate limit) of every slice's first ``batch``."""
    batch = _batch_size()
    fresh = _ready(tables, levels, batch, "fresh")
    v, seated = _seated(tables, tasks, batch)
    both = union_all(
        select(fresh).select_from(levels.join(fresh, true())),
        select(seated).select_from(v.join(seated, true())),
    ).subquery("both_")
    return select(both.c.id).order_by(*_claim_order(both)).limit(cap).cte("candidates")


def _limited_picks(
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
    free = (
        select(func.count())
        .where(seats.c.task == room.c.task)
        .correlate_except(seats)
        .scalar_subquery()
    )
    fresh = _ready(tables, levels, case((room.c.task.is_(None), batch), else_=free), "fresh")
    k = func.row_number().over(partition_by=fresh.c.task, order_by=_claim_order(fresh))
    numbered = (
        select(fresh, k.label("k"), room.c.task.is_not(None).label("gated"), free.label("free"))
        .select_from(levels.outerjoin(room, room.c.task == levels.c.task).join(fresh, true()))
        .subquery("numbered")
    )
    v, seated = _seated(tables, tasks, batch)
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
        .order_by(*_claim_order(both))
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
