"""Keys (``queue_id``): promoting a key's next waiting job, and the sweeps that back it up.

A job enqueued behind an earlier job of its key is written ``waiting``, outside the claim's
indexes (see :func:`~sqla_queue.statements.enqueue.enqueue_statement`). It becomes
``pending`` when its key's turn comes:

* at once, in the worker transaction that finishes or requeues the key's running job: the
  completion marks a finished keyed execution ``done``, :func:`clear_done_statement`
  deletes it unless an enqueue in flight holds it, and :func:`promote_statement` makes the
  key's next job pending;
* for the rare job whose predecessor was finished while its enqueue was in flight, once
  that enqueue has committed: the worker retries :func:`clear_done_statement` for the keys
  it left parked, and promotes them when their ``done`` rows are gone;
* as a backstop, by every worker's periodic sweep: :func:`cleanup_statement` deletes any
  ``done`` executions left (their worker stopped before clearing them) and returns their
  keys for the next promotion, and :func:`orphan_sweep_statement` visits a bounded slice of
  the waiting keys, resuming where the previous sweep stopped, and promotes any key with
  nothing queued or running ahead (left, for example, by a version-2 worker during a
  rolling upgrade).

Promoting a waiting job is always safe: the claim still checks that a pending job is the
head of its key. Only a job left waiting with nothing ahead of it would be a problem, and
these three paths rule that out.

A key's order is the order its jobs entered it: ``(execute_at, id)`` as each was enqueued
(or requeued). A job that has started keeps the head until it finishes: a retry, a
reschedule, a hand-back at shutdown or a reclaim moves its due time, not its place.
:func:`started_elsewhere` finds such a job (running, or pending with the lease its claim
set), and the claim, the enqueue and every promotion here defer to it.
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import (
    CTE,
    Integer,
    Select,
    Text,
    any_,
    bindparam,
    delete,
    exists,
    func,
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.dml import ReturningDelete, ReturningUpdate

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import DONE, ONE, PENDING, RUNNING, WAITING

__all__ = [
    "CleanupParams",
    "KeysParams",
    "SweepParams",
    "cleanup_statement",
    "clear_done_statement",
    "orphan_sweep_statement",
    "promote_statement",
    "started_elsewhere",
    "waiting_before",
]


class KeysParams(TypedDict):
    """Parameters of :func:`clear_done_statement` and :func:`promote_statement`."""

    #: The ``queue_id`` values owed a promotion.
    keys: list[str]


class CleanupParams(TypedDict):
    """Parameters of :func:`cleanup_statement`."""

    #: Most parked executions deleted by one sweep (rendered into the text).
    limit: int


class SweepParams(TypedDict):
    """Parameters of :func:`orphan_sweep_statement`."""

    #: Resume after this key (``""``: from the start).
    after: str
    #: Most waiting keys visited by one sweep (rendered into the text).
    limit: int


def started_elsewhere(tables: QueueTables, queue_id: Any, other_than: Any = None) -> Any:
    """Whether a job of ``queue_id`` has started and not finished (``other_than`` aside).

    A job that has started keeps its key's head until it finishes: a retry, a reschedule,
    a hand-back at shutdown or a reclaim puts it back to pending at a later due time, but
    not behind the jobs that came after it. Such an execution is running, or pending
    with ``lease_seconds`` set (every claim sets it; an enqueue or a requeue writes
    NULL). One walk of ``queue_active_ix`` over the key's pending and running rows: a
    key has one of those, or a few (jobs enqueued each due before every earlier one, or
    enqueues that raced), never its waiting backlog.
    """
    s = tables.executions.alias("started")
    conditions = [
        s.c.queue_id == queue_id,
        or_(s.c.state == PENDING, s.c.state == RUNNING),
        s.c.lease_seconds.is_not(None),
    ]
    if other_than is not None:
        conditions.append(s.c.id != other_than)
    # A scalar probe, not EXISTS: the planner may run an EXISTS as one hash of every
    # started row of the table, built by a scan of it. Ordered as queue_active_ix is, so
    # that an index walk can stop at the first match. Outside the worker's planner guard
    # (the enqueue) the planner may prefer a bitmap scan of queue_active_ix for the key
    # instead: it reads the key's pending and running rows, as the walk does when none
    # has started, and never its waiting backlog.
    first = (
        select(s.c.id)
        .where(*conditions)
        .order_by(s.c.execute_at, s.c.id)
        .limit(ONE)
        .correlate_except(s)
        .scalar_subquery()
    )
    return first.is_not(None)


def waiting_before(tables: QueueTables, row: Any) -> Any:
    """Whether a waiting job of ``row``'s key comes before it in ``(execute_at, id)`` order.

    One probe of ``waiting_ix``. A job left waiting ahead of a pending one (its key's head
    finished while an enqueue held it, or was moved later by a replace) must be promoted
    and run first.
    """
    w = tables.executions.alias("w_before")
    return exists().where(
        w.c.queue_id == row.c.queue_id,
        w.c.state == WAITING,
        tuple_(w.c.execute_at, w.c.id) < tuple_(row.c.execute_at, row.c.id),
    )


def _first_waiting(tables: QueueTables, keys: Any) -> Any:
    """Per key of ``keys``: its first waiting execution, if its turn has come.

    Its turn has come when no job of its key has started and not finished (a retried,
    rescheduled, handed-back or reclaimed head keeps its place, whatever its new due
    time: see :func:`started_elsewhere`), no pending execution of the key comes before
    it in ``(execute_at, id)`` order, and no finished execution of the key is parked as
    ``done``: an enqueue that held that one may be about to commit a job that comes
    first, and the sweep that deletes the parked row promotes the key once that job is
    visible. One probe each of ``waiting_ix``, ``queue_active_ix`` and ``done_ix`` per
    key, and a walk of the key's few pending and running rows.

    Nothing is locked here, and nothing is skipped: the promotion must be the first waiting
    job, never the one after it because another transaction holds the first.
    """
    ex = tables.executions
    w = ex.alias("w")
    first = (
        select(w.c.id, w.c.execute_at, w.c.queue_id)
        .where(w.c.queue_id == keys.c.queue_id, w.c.state == WAITING)
        .order_by(w.c.execute_at, w.c.id)
        .limit(ONE)
        .correlate_except(w)
        .lateral("first_waiting")
    )
    a = ex.alias("a")
    active_ahead = exists().where(
        a.c.queue_id == first.c.queue_id,
        or_(a.c.state == PENDING, a.c.state == RUNNING),
        tuple_(a.c.execute_at, a.c.id) < tuple_(first.c.execute_at, first.c.id),
    )
    d = ex.alias("d")
    parked = exists().where(d.c.queue_id == first.c.queue_id, d.c.state == DONE)
    return (
        select(first.c.id)
        .select_from(keys.join(first, true()))
        .where(~active_ahead, ~started_elsewhere(tables, first.c.queue_id), ~parked)
    )


def _promote(tables: QueueTables, chosen: Any) -> ReturningUpdate[tuple[int]]:
    # A job another transaction promoted meanwhile fails the state test when this update
    # gets its row, and is left alone.
    ex = tables.executions
    return (
        update(ex)
        .where(ex.c.id.in_(chosen), ex.c.state == WAITING)
        .values(state=PENDING)
        .returning(ex.c.id)
    )


def promote_statement(tables: QueueTables) -> ReturningUpdate[tuple[int]]:
    """Make the next job of each key in ``keys`` (text[]) pending, where its turn has come.

    Runs in the worker transaction that finished or requeued a job of those keys, as a
    statement of its own after the completion, so that it sees every waiting job that an
    enqueue committed while the completion waited. Returns the ids promoted.
    """
    keys = (
        func.unnest(bindparam("keys", type_=ARRAY(Text)))
        .table_valued("queue_id")
        .render_derived(name="keys")
    )
    return _promote(tables, _first_waiting(tables, keys))


def cleanup_statement(tables: QueueTables) -> ReturningDelete[tuple[str]]:
    """Delete up to ``limit`` executions parked as ``done``; return their keys.

    Those no enqueue holds any more are deleted (SKIP LOCKED: one still held is left for the
    next sweep, never waited for). The caller promotes the returned keys in a later
    statement, which sees the waiting jobs those enqueues committed.
    """
    ex = tables.executions
    d = ex.alias("d")
    parked = (
        select(d.c.id)
        .where(d.c.state == DONE)
        .limit(bindparam("limit", type_=Integer, literal_execute=True))
        .with_for_update(of=d, skip_locked=True)
    )
    return delete(ex).where(ex.c.id.in_(parked)).returning(ex.c.queue_id)


def clear_done_statement(tables: QueueTables) -> Select[tuple[str]]:
    """Delete the ``done`` executions of ``keys`` (text[]) that nobody holds; name the rest.

    Runs in the worker transaction right after the completion that marked them, as a
    statement of its own. That transaction holds their row locks itself, so the only lock
    that can stand in the way is an enqueue's KEY SHARE: the row is the predecessor of a job
    that is not committed yet. Such a row is skipped, never waited for, and its key is
    returned: it stays parked until the worker tries again after that enqueue committed.
    One probe of ``done_ix`` per key.
    """
    ex = tables.executions
    keys = bindparam("keys", type_=ARRAY(Text))
    d = ex.alias("d")
    free = (
        select(d.c.id)
        .where(d.c.queue_id == any_(keys), d.c.state == DONE)
        .with_for_update(of=d, skip_locked=True)
    )
    gone = delete(ex).where(ex.c.id.in_(free)).returning(ex.c.id).cte("gone")
    # The statement's snapshot still shows the rows just deleted: leave them out.
    left = ex.alias("left_")
    return (
        select(left.c.queue_id)
        .where(
            left.c.queue_id == any_(keys),
            left.c.state == DONE,
            left.c.id.not_in(select(gone.c.id)),
        )
        .distinct()
    )


def _waiting_keys(tables: QueueTables) -> CTE:
    """The distinct keys with waiting jobs after ``after`` (text), in key order.

    A loose index scan of ``waiting_ix``: one probe per key, never a row per waiting job.
    """
    ex = tables.executions

    def next_key(after: Any) -> Any:
        x = ex.alias("x")
        return (
            select(x.c.queue_id)
            .where(x.c.state == WAITING, x.c.queue_id > after)
            .order_by(x.c.queue_id)
            .limit(ONE)
            .scalar_subquery()
        )

    start = select(next_key(bindparam("after", type_=Text)).label("queue_id"))
    keys = start.cte("waiting_keys", recursive=True)
    previous = keys.alias("k")
    return keys.union_all(
        select(next_key(previous.c.queue_id)).where(previous.c.queue_id.is_not(None))
    )


def orphan_sweep_statement(tables: QueueTables) -> Select[tuple[Any, Any]]:
    """Visit up to ``limit`` waiting keys after ``after``; promote those with nothing ahead.

    Returns one row: ``last_key``, where the next sweep resumes (NULL once the last key was
    visited: start again from ``''``), and ``promoted``, how many jobs were promoted.
    The cost is bounded by ``limit`` keys, whatever their backlogs.
    """
    keys = _waiting_keys(tables)
    visited = (
        select(keys.c.queue_id)
        .where(keys.c.queue_id.is_not(None))
        .limit(bindparam("limit", type_=Integer, literal_execute=True))
        .cte("visited")
    )
    promoted = _promote(tables, _first_waiting(tables, visited)).cte("promoted")
    return select(
        select(func.max(visited.c.queue_id)).scalar_subquery().label("last_key"),
        select(func.count()).select_from(promoted).scalar_subquery().label("promoted"),
    )
