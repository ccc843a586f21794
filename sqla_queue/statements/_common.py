"""Pieces shared by the statement builders."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Interval, Text, literal_column
from sqlalchemy.sql.elements import ColumnElement

from sqla_queue.models.tables import ExecutionState, JobStatus

__all__ = ["FAILED", "PENDING", "QUEUED", "RUNNING", "SUCCEEDED", "seconds", "state_literal"]


def state_literal(value: str) -> ColumnElement[str]:
    """A state constant rendered into the SQL text, not bound.

    The partial indexes are declared ``WHERE state = 'pending'``; the planner can only use
    them when the query's predicate is the same literal. A bound parameter would do for a
    custom plan but not for the generic plan of a prepared statement.
    """
    return literal_column(f"'{value}'", Text)


PENDING = state_literal(ExecutionState.PENDING)
RUNNING = state_literal(ExecutionState.RUNNING)
QUEUED = state_literal(JobStatus.QUEUED)
SUCCEEDED = state_literal(JobStatus.SUCCEEDED)
FAILED = state_literal(JobStatus.FAILED)


_ONE_SECOND = literal_column("interval '1 second'", Interval)


def seconds(amount: ColumnElement[Any]) -> ColumnElement[Any]:
    """An interval of ``amount`` seconds, computed by the database."""
    return amount * _ONE_SECOND
