"""Pieces shared by the statement builders."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Integer,
    Interval,
    Text,
    and_,
    case,
    cast,
    func,
    literal,
    literal_column,
    null,
)
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.models.tables import ExecutionState, JobStatus

__all__ = [
    "CANCELLED",
    "DONE",
    "FAILED",
    "ONE",
    "PENDING",
    "QUEUED",
    "RUNNING",
    "SUCCEEDED",
    "SUSPENDED",
    "WAITING",
    "due_at",
    "has_key",
    "notify_waiters",
    "seconds",
    "state_literal",
    "still_running",
]


def state_literal(value: str) -> ColumnElement[str]:
    """A state constant rendered into the SQL text, not bound.

    The partial indexes are declared ``WHERE state = 'pending'``; the planner can only use
    them when the query's predicate is the same literal. A bound parameter would do for a
    custom plan but not for the generic plan of a prepared statement.
    """
    return literal_column(f"'{value}'", Text)


PENDING = state_literal(ExecutionState.PENDING)
RUNNING = state_literal(ExecutionState.RUNNING)
WAITING = state_literal(ExecutionState.WAITING)
DONE = state_literal(ExecutionState.DONE)
SUSPENDED = state_literal(ExecutionState.SUSPENDED)
QUEUED = state_literal(JobStatus.QUEUED)
SUCCEEDED = state_literal(JobStatus.SUCCEEDED)
FAILED = state_literal(JobStatus.FAILED)
CANCELLED = state_literal(JobStatus.CANCELLED)


_ONE_SECOND = literal_column("interval '1 second'", Interval)

#: ``LIMIT 1`` written into the text: a bound limit leaves a generic plan guessing its size.
ONE = literal_column("1", Integer)


def seconds(amount: ColumnElement[Any]) -> ColumnElement[Any]:
    """An interval of ``amount`` seconds, computed by the database."""
    return amount * _ONE_SECOND


def due_at(run_at: ColumnElement[Any], delay: ColumnElement[Any]) -> ColumnElement[Any]:
    """When a job asked to run: at ``run_at``, else ``delay`` seconds (none: at once) after
    the statement's clock (``now()``)."""
    return func.coalesce(run_at, func.now() + seconds(func.coalesce(delay, 0.0)))


def still_running(state: ColumnElement[str]) -> ColumnElement[bool]:
    """``state = 'running'`` for a fence on rows the caller names by primary key.

    Written so the planner cannot match it to ``running_ix`` (``WHERE state =
    'running'``): ANALYZE rarely sees a running row, so that index looks empty, and a
    statement joining its outcomes to it then scans every running row once per outcome
    (4.7 ms for a completion of 100, against 1.5 ms through the primary key). The
    coalesce changes nothing else: ``state`` is never NULL.
    """
    return func.coalesce(state, state_literal("")) == RUNNING


def has_key(queue_id: ColumnElement[Any]) -> ColumnElement[bool]:
    """``queue_id IS NOT NULL`` for rows the caller names by primary key.

    Written so the planner cannot prove a keyed index's predicate from it (``queue_ix``,
    ``queue_active_ix``: ``WHERE queue_id IS NOT NULL``). Seen under statistics taken
    before any keyed job existed: the completion walked ``queue_ix`` once per outcome,
    filtering on the id, instead of probing the primary key.
    """
    return func.num_nonnulls(queue_id) == 1


def notify_waiters(tables: Any, finished: ColumnElement[bool] | None = None) -> ColumnElement[Any]:
    """A ``RETURNING`` column of an update of ``jobs`` that tells ``queue.result`` callers.

    It calls ``pg_notify`` on the queue's finished channel, with the job's id, for a job
    that someone awaits (and, when given, that ``finished`` says has just ended); every
    other row pays a ``CASE`` and nothing else.
    """
    jobs = tables.jobs
    awaited = jobs.c.awaited if finished is None else and_(jobs.c.awaited, finished)
    return case(
        (
            awaited,
            func.pg_notify(literal(tables.finished_channel, Text), cast(jobs.c.id, Text)),
        ),
        else_=null(),
    ).label("notified")
