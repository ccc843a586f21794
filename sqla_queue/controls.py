"""Pause and rate limits: stored per task, read by every worker at its maintenance.

:class:`~sqla_queue.Queue` (``pause``, ``resume``, ``set_rate_limit``, ``controls``) and
the ``sqla-queue pause|resume|rate-limit`` commands call these functions. Each joins the
caller's transaction (nothing here commits) and checks its values before anything is
executed. A role without the privilege to write the controls table (the deployment
guide's application role) gets :class:`~sqla_queue.InsufficientPrivilegeError` naming the
``GRANT`` that fixes it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from sqla_queue._sqlstate import INSUFFICIENT_PRIVILEGE, sqlstate_of
from sqla_queue.admin import operator_write_refused
from sqla_queue.checks import INT4_MAX, check_in_range, check_seconds
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.controls import (
    SetPausedParams,
    SetRateParams,
    set_paused_statement,
    set_rate_statement,
    stored_controls_statement,
)

__all__ = [
    "CONTROL_PRIVILEGES",
    "MAX_RATE_PERIOD",
    "RateLimit",
    "TaskControl",
    "check_rate_limit",
    "set_paused",
    "set_rate_limit",
    "stored_controls",
]

SyncBind = Session | Connection

#: What pausing, resuming and changing rate limits need on the controls table, beyond the
#: application role's ``SELECT`` and ``UPDATE``.
CONTROL_PRIVILEGES = ("INSERT", "UPDATE", "DELETE")
#: The longest rate window, in seconds (a week): recorded starts outlive their window.
MAX_RATE_PERIOD = 7 * 86_400.0


@dataclass(frozen=True)
class RateLimit:
    """At most ``max_starts`` starts of a task in any window of ``per_seconds`` seconds,
    counted across every worker by the database clock."""

    max_starts: int
    per_seconds: float

    def __post_init__(self) -> None:
        check_rate_limit(self.max_starts, self.per_seconds)

    def __str__(self) -> str:
        return f"{self.max_starts}/{self.per_seconds:g}s"


@dataclass(frozen=True)
class TaskControl:
    """What an operator stored for one task: paused or not, and its rate limit."""

    task: str
    paused: bool
    rate_limit: RateLimit | None
    updated_at: dt.datetime


def check_rate_limit(max_starts: object, per_seconds: object) -> tuple[int, float]:
    """``(max_starts, per_seconds)`` checked: a whole number from 1 to 2,147,483,647 starts
    per a positive number of seconds (or a ``timedelta``) up to a week; else
    :class:`TypeError` or :class:`ValueError` naming the argument and the rule."""
    starts = check_in_range("a rate limit's max_starts", max_starts, 1, INT4_MAX)
    seconds = check_seconds(
        "a rate limit's period (per)",
        per_seconds,
        maximum=MAX_RATE_PERIOD,
        positive=True,
        timedelta=True,
    )
    return starts, seconds


def set_paused(bind: SyncBind, tables: QueueTables, task: str, paused: bool) -> None:
    """Store whether ``task`` is paused. Workers stop (or start again) claiming it within
    their maintenance interval; running jobs finish; enqueues go on."""
    params: SetPausedParams = {"task": task, "paused": bool(paused)}
    _write(bind, tables, set_paused_statement(tables), params, "pause or resume a task")


def set_rate_limit(bind: SyncBind, tables: QueueTables, task: str, rate: RateLimit | None) -> None:
    """Store the rate limit of ``task``; ``None`` removes it (the task runs unthrottled)."""
    params: SetRateParams = {
        "task": task,
        "rate_max": None if rate is None else rate.max_starts,
        "rate_seconds": None if rate is None else rate.per_seconds,
    }
    _write(bind, tables, set_rate_statement(tables), params, "change a rate limit")


def stored_controls(bind: SyncBind, tables: QueueTables) -> list[TaskControl]:
    """Every task that is paused or has a rate limit, by name."""
    connection = bind.connection() if isinstance(bind, Session) else bind
    rows = connection.execute(stored_controls_statement(tables)).all()
    return [
        TaskControl(
            task=row.task,
            paused=row.paused,
            rate_limit=None
            if row.rate_max is None
            else RateLimit(row.rate_max, float(row.rate_seconds)),
            updated_at=row.updated_at,
        )
        for row in rows
    ]


def _write(
    bind: SyncBind, tables: QueueTables, statement: object, params: object, doing: str
) -> None:
    connection = bind.connection() if isinstance(bind, Session) else bind
    try:
        connection.execute(statement, params)  # type: ignore[call-overload]
    except DBAPIError as exc:
        if sqlstate_of(exc) != INSUFFICIENT_PRIVILEGE:
            raise
        raise operator_write_refused(
            connection,
            tables,
            exc,
            table=tables.controls.name,
            privileges=CONTROL_PRIVILEGES,
            doing=doing,
            needs="Pauses and rate limits are stored in the controls table, which needs "
            f"{', '.join(CONTROL_PRIVILEGES)} beyond the application role's SELECT and UPDATE.",
        ) from exc
