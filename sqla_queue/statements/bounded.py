"""Bounded tasks (``max_pending``): the enqueue lock of a task, and its capped pending count.

An enqueue of a bounded task takes the task's lock (:func:`bound_lock_statement`), then
counts in a statement of its own (:func:`pending_count_statement`). Under READ COMMITTED
each statement takes a fresh snapshot, and the count's is taken after the lock was
granted, so it sees every row of each earlier holder of the lock, which held it until its
transaction ended. The lock is a transaction-level advisory lock: it is released at
commit or rollback, and nothing else in the library takes it, so unbounded tasks, claims
and completions never wait for it.

The count walks only the partial indexes whose first column is the task (``task_claim_ix``
and ``seated_ix`` for pending rows, ``task_waiting_ix`` for waiting ones), each stopped at
``cap`` entries: its cost is bounded by the bound, never by the backlog.

Each builder has a ``TypedDict`` next to it naming its parameters.
"""

from __future__ import annotations

from typing import TypedDict

from sqlalchemy import BigInteger, Integer, Select, Text, bindparam, func, literal_column, select
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import PENDING, WAITING

__all__ = [
    "BoundLockParams",
    "PendingCountParams",
    "bound_lock_key",
    "bound_lock_statement",
    "pending_count_statement",
]


class BoundLockParams(TypedDict):
    """Parameters of :func:`bound_lock_statement`."""

    #: The lock's name, from :func:`bound_lock_key`.
    key: str


class PendingCountParams(TypedDict):
    """Parameters of :func:`pending_count_statement`."""

    task: str
    #: Where each of the three index walks stops: the task's ``max_pending``.
    cap: int


def bound_lock_key(tables: QueueTables, task: str) -> str:
    """The name of ``task``'s enqueue lock in the queue of ``tables``.

    Two queues (another schema or prefix) never share a task's lock, nor do two tenants of
    one queue: the name holds the schema a ``schema_translate_map`` moved the tables to
    (:meth:`~sqla_queue.models.tables.QueueTables.translated`). A name is hashed to the
    64-bit key of a PostgreSQL advisory lock; a collision with another name only makes
    two enqueuers wait for each other, it never lets one skip the lock.
    """
    return f"sqla_queue max_pending {tables.effective_schema or ''}.{tables.prefix} {task}"


def bound_lock_statement(tables: QueueTables) -> Select[tuple[object]]:
    """Wait for and take the enqueue lock named ``key``, until the transaction ends.

    Parameters: :class:`BoundLockParams`. ``tables`` is unused: the statement is the same
    for every queue (the key names the queue), and the signature matches the others'.
    """
    del tables
    key = func.hashtextextended(bindparam("key", type_=Text), literal_column("0", BigInteger))
    return select(func.pg_advisory_xact_lock(key).label("locked"))


def pending_count_statement(tables: QueueTables) -> Select[tuple[int, str]]:
    """``(pending, isolation)``: the task's pending and waiting executions, each kind
    counted up to ``cap``, and the transaction's isolation level.

    Parameters: :class:`PendingCountParams`. ``pending`` is exact up to ``cap``; a value of
    ``cap`` or more means "full". The predicates are the literal ones of the partial
    indexes, so that every plan, generic ones included, can walk them.
    """
    ex = tables.executions
    task = bindparam("task", type_=Text)
    cap = bindparam("cap", type_=Integer)

    def capped(where: ColumnElement[bool]) -> ColumnElement[int]:
        walk = select(literal_column("1")).where(ex.c.task == task, where).limit(cap).subquery()
        return select(func.count()).select_from(walk).scalar_subquery()

    pending = ex.c.state == PENDING
    total = (
        capped(pending & ex.c.slot.is_(None))
        + capped(pending & ex.c.slot.is_not(None))
        + capped(ex.c.state == WAITING)
    )
    isolation = func.current_setting(literal_column("'transaction_isolation'", Text))
    return select(total.label("pending"), isolation.label("isolation"))
