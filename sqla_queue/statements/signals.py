"""Waking suspended durable jobs: signals, conditions on the app's rows, and due times.

A suspended execution is ``pending`` again once what it waits for has come; each wake
calls ``pg_notify`` on the queue's wake-up channel, as an enqueue does, so an idle worker
claims it at once.

A signal is sent in two statements, in the sender's transaction:
:func:`lock_for_signal_statement` takes the job's signal lock (a transaction-level advisory
lock, shared, see :func:`signal_lock_key`), then :func:`signal_statement` stores the signal
and wakes the job if it waits for it. The sender locks no row of the queue that a worker
needs: its transaction may stay open as long as the application likes, and the job's
heartbeat, completion and cancel never wait for it.

A job that begins to wait tries the same lock, exclusively and without waiting, before it
reads the signals (see :mod:`sqla_queue.statements.durable`). When it gets the lock, no
sender is between its two statements: one that committed is seen by the read, and one that
comes later waits for the wait's short transaction and then finds the job suspended. When
it does not, a sender is in flight, and the job suspends with a recheck a moment later
instead of waiting for the sender's commit.
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    literal_column,
    null,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import ONE, PENDING, SUSPENDED

__all__ = [
    "SignalParams",
    "WakeDueParams",
    "WakeWaitingParams",
    "condition_wake_statement",
    "lock_for_signal_statement",
    "signal_lock_key",
    "signal_payload_statement",
    "signal_statement",
    "wake_due_statement",
    "wake_waiting_statement",
]


class SignalParams(TypedDict):
    """A signal: its job, its name, its payload (JSON text), and the ``wait`` value of a
    job that waits for it."""

    job: int
    signal: str
    payload: str
    waits_for: str


class WakeDueParams(TypedDict):
    """The wake sweep: at most ``limit`` executions per statement."""

    limit: int


class WakeWaitingParams(TypedDict):
    """The ``wait`` values whose suspended executions wake."""

    waits: list[str]


def _notify(tables: QueueTables) -> Any:
    return func.pg_notify(literal(tables.notify_channel, Text), literal("", Text))


def signal_lock_key(tables: QueueTables, job: ColumnElement[Any]) -> ColumnElement[Any]:
    """The 64-bit key of job ``job``'s signal lock, in the queue of ``tables``.

    The name holds the queue's effective schema and prefix, and the job's id. A collision
    with another name is harmless: a wait that finds the lock taken only rechecks sooner.
    """
    queue = f"sqla_queue signal {tables.effective_schema or ''}.{tables.prefix} "
    name = literal(queue, Text) + cast(job, Text)
    return func.hashtextextended(name, literal_column("0", BigInteger))


def lock_for_signal_statement(tables: QueueTables) -> Select[Any]:
    """Take job ``job``'s signal lock, shared, until the sender's transaction ends.

    Many senders share it; only a job beginning to wait tries it exclusively, and never
    waits for it. It waits at most for such a wait's own short transaction. Returns one
    row.
    """
    key = signal_lock_key(tables, bindparam("job", type_=BigInteger))
    return select(func.pg_advisory_xact_lock_shared(key).label("locked"))


def signal_statement(tables: QueueTables) -> Select[Any]:
    """Store signal ``signal`` for job ``job`` and wake the job if it waits for it.

    Parameters: :class:`SignalParams`. Returns one row ``(status, stored, woken)``: the
    job's status (``None``: no such job, and nothing is stored), whether the signal was
    stored (``False``: one of that name was sent before, and the first one stands) and
    whether a suspended job was woken (with a NOTIFY to the workers).
    """
    jobs = tables.jobs
    ex = tables.executions
    signals = tables.job_signals
    job = bindparam("job", type_=BigInteger)
    sent = (
        insert(signals)
        .from_select(
            ["job_id", "name", "payload"],
            select(
                jobs.c.id,
                bindparam("signal", type_=Text),
                cast(bindparam("payload", type_=Text), JSONB),
            ).where(jobs.c.id == job),
        )
        .on_conflict_do_nothing(index_elements=[signals.c.job_id, signals.c.name])
        .returning(signals.c.job_id)
        .cte("sent")
    )
    woken = (
        update(ex)
        .where(
            ex.c.id == select(sent.c.job_id).scalar_subquery(),
            # By primary key: written so that no partial index over suspended rows
            # matches (under statistics taken before any job waited, the planner walked
            # wait_ix over every waiter of the signal's name, filtering on the id).
            func.coalesce(ex.c.state, "") == SUSPENDED,
            func.coalesce(ex.c.wait, "") == bindparam("waits_for", type_=Text),
        )
        .values(state=PENDING, execute_at=func.now(), wait=null())
        .returning(ex.c.id)
        .cte("woken")
    )
    was_woken = exists(select(woken.c.id))
    return select(
        select(jobs.c.status).where(jobs.c.id == job).scalar_subquery().label("status"),
        exists(select(sent.c.job_id)).label("stored"),
        was_woken.label("woken"),
        case((was_woken, _notify(tables)), else_=null()).label("notified"),
    )


def wake_due_statement(tables: QueueTables) -> Select[Any]:
    """Wake the suspended executions whose due time has come (a sleep's end, a wait's
    deadline), at most ``limit`` of them, skipping those a sender holds.

    Parameters: :class:`WakeDueParams`. Returns one row ``(woken, next_in)``: how many
    woke (the workers were notified if any did), and the seconds until the next due time
    of a suspended execution, if any.
    """
    ex = tables.executions
    due = (
        select(ex.c.id)
        .where(ex.c.state == SUSPENDED, ex.c.execute_at <= func.now())
        .order_by(ex.c.execute_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(of=ex, skip_locked=True)
        .cte("due")
    )
    woken = (
        update(ex)
        # Probes of the primary key: a join let the planner hash every suspended row
        # (suspended_ix) to find the few that are due.
        .where(
            ex.c.id == any_(func.array(select(due.c.id).scalar_subquery())),
            func.coalesce(ex.c.state, "") == SUSPENDED,
        )
        .values(state=PENDING, execute_at=func.now(), wait=null())
        .returning(ex.c.id)
        .cte("woken")
    )
    count = select(func.count()).select_from(woken).scalar_subquery()
    # The first entry of suspended_ix past now: an ordered walk that stops at one row (a
    # min() let the planner read every suspended row through wait_ix).
    later = (
        select(func.extract("epoch", ex.c.execute_at - func.now()))
        .where(ex.c.state == SUSPENDED, ex.c.execute_at > func.now())
        .order_by(ex.c.execute_at)
        .limit(ONE)
        .scalar_subquery()
    )
    return select(
        count.label("woken"),
        later.label("next_in"),
        case((count > 0, _notify(tables)), else_=null()).label("notified"),
    )


def wake_waiting_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Wake the suspended executions that wait for any of ``waits`` (a condition's rows,
    a migrated step's version). Returns their ids; the workers are notified if any woke.
    """
    ex = tables.executions
    return (
        update(ex)
        .where(
            ex.c.state == SUSPENDED,
            ex.c.wait == func.any(bindparam("waits", type_=ARRAY(Text))),
        )
        .values(state=PENDING, execute_at=func.now(), wait=null())
        .returning(ex.c.id, _notify(tables).label("notified"))
    )


def _as_key_text(value: ColumnElement[Any], key: ColumnElement[Any]) -> ColumnElement[str]:
    return cast(cast(value, key.type), Text)


def condition_wake_statement(
    tables: QueueTables, key: ColumnElement[Any], clause: ColumnElement[bool]
) -> ReturningUpdate[Any]:
    """Wake the jobs that wait for a condition on any of the rows ``keys``, where it holds.

    ``key`` is the primary-key column of the condition's table, ``clause`` the condition
    on that table's columns. It runs in the writer's transaction, after its flush, so it
    sees the writer's changes: one statement for every row a flush changed. Parameters:
    ``prefix`` (the ``wait`` value without the key: ``row:<condition>:``) and ``keys``.
    Returns the woken ids.
    """
    ex = tables.executions
    keys = select(func.unnest(bindparam("keys", type_=ARRAY(key.type))).label("k")).subquery("keys")
    holds: Select[Any] = (
        select(literal_column("1")).select_from(key.table).where(key == keys.c.k, clause)
    )
    return (
        update(ex)
        .where(
            and_(
                ex.c.state == SUSPENDED,
                # Through the key column's whole type (numeric(10,2) writes 5 as 5.00),
                # as a waiter writes the key it waits on.
                ex.c.wait == bindparam("prefix", type_=Text) + _as_key_text(keys.c.k, key),
                exists(holds),
            )
        )
        .values(state=PENDING, execute_at=func.now(), wait=null())
        .returning(ex.c.id, _notify(tables).label("notified"))
    )


def signal_payload_statement(tables: QueueTables) -> Select[Any]:
    """The payload of signal ``signal`` sent to job ``job``: one row ``(payload)`` if it
    was sent, none otherwise."""
    signals = tables.job_signals
    return select(signals.c.payload).where(
        signals.c.job_id == bindparam("job", type_=BigInteger),
        signals.c.name == bindparam("signal", type_=Text),
    )
