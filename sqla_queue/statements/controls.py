"""Pause and rate limits, stored per task in ``task_controls`` and shared by every worker.

A paused task is left out of the worker's claim (its ``tasks`` parameter); a rate-limited
one is claimed by a claim of its own, under its control row's lock (see
:func:`rate_lock_statement` and ``claim_statement(tables, rated=True)``). Neither touches
the claim of the other tasks. Each builder has a ``TypedDict`` next to it naming its
parameters (a unit test checks them against the compiled statement's bound names).
"""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import (
    Boolean,
    Double,
    Integer,
    Select,
    Text,
    any_,
    bindparam,
    exists,
    func,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, Insert, insert

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import PENDING

__all__ = [
    "ControlledTasksParams",
    "RateBacklogParams",
    "RateLockParams",
    "SetPausedParams",
    "SetRateParams",
    "controlled_tasks_statement",
    "rate_backlog_statement",
    "rate_lock_statement",
    "set_paused_statement",
    "set_rate_statement",
    "stored_controls_statement",
]


class ControlledTasksParams(TypedDict):
    """Parameters of :func:`controlled_tasks_statement`."""

    #: The worker's task names (``text[]``).
    tasks: list[str]


class RateLockParams(TypedDict):
    """Parameters of :func:`rate_lock_statement`."""

    #: The rate-limited task about to be claimed.
    rate_task: str


class RateBacklogParams(TypedDict):
    """Parameters of :func:`rate_backlog_statement`."""

    #: The rate-limited task whose window a claim found full.
    rate_task: str


class SetPausedParams(TypedDict):
    """Parameters of :func:`set_paused_statement`."""

    task: str
    paused: bool


class SetRateParams(TypedDict):
    """Parameters of :func:`set_rate_statement` (both ``None`` to remove the limit)."""

    task: str
    #: Most starts in any window of ``rate_seconds``.
    rate_max: int | None
    rate_seconds: float | None


def controlled_tasks_statement(tables: QueueTables) -> Select[Any]:
    """Which of ``tasks`` are paused or rate-limited: ``(task, paused, rated, rate_max,
    rate_seconds)`` rows.

    Read by every worker's maintenance. Tasks without a control row, or whose row holds
    neither, come back as nothing: they are claimed as before. The limit itself comes
    along so that a worker waiting on a full window notices an operator's change.
    Parameters: :class:`ControlledTasksParams`.
    """
    c = tables.controls
    return select(
        c.c.task,
        c.c.paused,
        c.c.rate_max.is_not(None).label("rated"),
        c.c.rate_max,
        c.c.rate_seconds,
    ).where(
        c.c.task == any_(bindparam("tasks", type_=ARRAY(Text))),
        or_(c.c.paused, c.c.rate_max.is_not(None)),
    )


def rate_backlog_statement(tables: QueueTables) -> Select[Any]:
    """Whether ``rate_task`` has a pending execution that is due now: one row, ``(due,)``.

    A burst run asks it, after its claim and in the same transaction (so the rows that
    claim took no longer count), when the claim found the task's window full: a window
    that holds back due jobs is waited for, one that holds back nothing is not. One
    probe of each partial index the claim walks (fresh rows, rows that kept a seat).
    A keyed job behind its key's running head counts too: it is due, only later in line.
    Parameters: :class:`RateBacklogParams`.
    """
    ex = tables.executions
    task = bindparam("rate_task", type_=Text)

    def due(slot: Any) -> Any:
        return exists().where(
            ex.c.task == task, ex.c.state == PENDING, slot, ex.c.execute_at <= func.now()
        )

    return select(or_(due(ex.c.slot.is_(None)), due(ex.c.slot.is_not(None))).label("due"))


def rate_lock_statement(tables: QueueTables) -> Select[Any]:
    """Lock the control row of ``rate_task`` until the transaction ends, if no one else
    holds it; returns ``(task)``, or no row when another transaction holds it.

    It runs as a statement of its own before the rated claim: under READ COMMITTED the
    claim then takes its snapshot after the lock was granted, so it sees every start that
    the previous holder recorded and committed. In one statement, the snapshot would be
    older than the lock. The claim runs only when the row came back. ``SKIP LOCKED``: the
    holder may be another worker's claim, or an application's transaction that changes
    the task's controls (``queue.pause``, ``set_rate_limit``) and stays open as long as it
    likes; the worker claims the task at its next poll instead of waiting for it.
    Parameters: :class:`RateLockParams`.
    """
    c = tables.controls
    return (
        select(c.c.task)
        .where(c.c.task == bindparam("rate_task", type_=Text))
        .with_for_update(of=c, skip_locked=True)
    )


def set_paused_statement(tables: QueueTables) -> Insert:
    """Pause or resume ``task``. Parameters: :class:`SetPausedParams`."""
    c = tables.controls
    stmt = insert(c).values(
        task=bindparam("task", type_=Text), paused=bindparam("paused", type_=Boolean)
    )
    return stmt.on_conflict_do_update(
        index_elements=[c.c.task], set_={"paused": stmt.excluded.paused, "updated_at": func.now()}
    )


def set_rate_statement(tables: QueueTables) -> Insert:
    """Store or remove the rate limit of ``task``. Parameters: :class:`SetRateParams`."""
    c = tables.controls
    stmt = insert(c).values(
        task=bindparam("task", type_=Text),
        rate_max=bindparam("rate_max", type_=Integer),
        rate_seconds=bindparam("rate_seconds", type_=Double),
    )
    return stmt.on_conflict_do_update(
        index_elements=[c.c.task],
        set_={
            "rate_max": stmt.excluded.rate_max,
            "rate_seconds": stmt.excluded.rate_seconds,
            "updated_at": func.now(),
        },
    )


def stored_controls_statement(tables: QueueTables) -> Select[Any]:
    """Every control row that pauses or limits a task: ``(task, paused, rate_max,
    rate_seconds, updated_at)``, by task. No parameters."""
    c = tables.controls
    return (
        select(c.c.task, c.c.paused, c.c.rate_max, c.c.rate_seconds, c.c.updated_at)
        .where(or_(c.c.paused, c.c.rate_max.is_not(None)))
        .order_by(c.c.task)
    )
